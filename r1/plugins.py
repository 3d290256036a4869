"""`package.module:attr` lookup, the one way a config names code outside r1/.

`data.task`, `env.tools` entries and any other key that takes a user's object
go through `import_attr`, so every such key fails the same way: one line
naming the key and what could not be imported. It lives apart from the task
and tool registries so that both can use it without importing each other
(envs/ never imports tasks/). Stdlib only: config validation runs it before
torch is imported.
"""
import importlib
import os
import sys


def import_attr(spec: str, what: str):
    """`package.module:attr` -> the attribute; one-line errors naming the spec.

    The current directory is put on sys.path (as `python -m` would), so a module
    beside the command (`countdown.py`, `examples/countdown.py`) imports."""
    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise ValueError(f"{what} {spec!r}: expected a registered name or package.module:attr")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        raise ValueError(f"{what} {spec!r}: cannot import module {module!r} ({e})") from None
    if not hasattr(mod, attr):
        raise ValueError(f"{what} {spec!r}: module {module!r} has no attribute {attr!r}")
    return getattr(mod, attr)
