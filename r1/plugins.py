"""`package.module:attr` lookup, the one way a config names code outside r1/.

`data.task`, `env.tools` entries and any other key that takes a user's object
go through `import_attr`, so every such key fails the same way: one line
naming the key and what could not be imported. It lives apart from the task
and tool registries so that both can use it without importing each other
(envs/ never imports tasks/). Stdlib only: config validation runs it before
torch is imported.

The current directory is appended to sys.path, never put first: a module
beside the command (`countdown.py`) still imports, but a file there named
like an installed package (`json.py`, `torch.py`, `yaml.py`) cannot shadow
it, for this import or any later one in the process.
"""
import importlib
import os
import re
import sys

_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")


def import_attr(spec: str, what: str):
    """`package.module:attr` -> the attribute; one-line errors (ValueError) naming the spec.

    The current directory is appended to sys.path (installed packages and the
    standard library come first), so a module beside the command imports."""
    if not isinstance(spec, str):
        raise ValueError(f"{what} {spec!r}: expected a string package.module:attr")
    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise ValueError(f"{what} {spec!r}: expected a registered name or package.module:attr")
    if module.startswith("."):
        raise ValueError(f"{what} {spec!r}: a relative module name ({module!r}) has no package to be relative "
                         "to; write the full package.module:attr")
    if not _MODULE.fullmatch(module):
        raise ValueError(f"{what} {spec!r}: {module!r} is not a module name (dotted Python identifiers, "
                         "not a file path)")
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.append(cwd)
        importlib.invalidate_caches()
    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        raise ValueError(f"{what} {spec!r}: cannot import module {module!r} ({e})") from None
    if not hasattr(mod, attr):
        raise ValueError(f"{what} {spec!r}: module {module!r} has no attribute {attr!r}")
    return getattr(mod, attr)
