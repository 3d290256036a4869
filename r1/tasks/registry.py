"""The task registry: looking a task up by name or `package.module:attr`, its tools, its env factory.

A `Task` (r1/tasks/task.py, re-exported here with `TASKS` and `register_task`)
holds everything `train.py` (RL and SFT) and `eval.py` need: its rows, its
env, its default tools, an optional SFT expert, levels, difficulty, task-only
reward terms and stop strings. `data.task` names a registered task or
`package.module:attr` (attr a Task); the module is imported when the config is
validated, so the tasks and tools it registers on import count. The built-in
tasks register themselves in `r1/tasks/builtin.py`, the same way a user's
module would. This file imports nothing heavy: config validation uses it
before torch. docs/tasks.md walks through writing a task.
"""
import difflib

from r1.plugins import import_attr  # noqa: F401  (re-exported: it lived here)
from r1.tasks.task import TASKS, Task, register_task  # noqa: F401  (re-exported: a user's task imports them here)


def get_task(name: str) -> Task:
    """A registered task by name, or `package.module:attr`; ValueError naming the closest names."""
    _builtins()
    if ":" in name:
        task = import_attr(name, "data.task")
        if not isinstance(task, Task):
            raise ValueError(f"data.task {name!r} is a {type(task).__name__}, not an r1.tasks.registry.Task")
        return register_task(task, replace=True) if TASKS.get(task.name) is not task else task
    if name not in TASKS:
        close = difflib.get_close_matches(name, TASKS, n=3, cutoff=0.5)
        hint = f"did you mean {', '.join(close)}? " if close else ""
        raise ValueError(f"unknown task {name!r}; {hint}known: {', '.join(sorted(TASKS))} "
                         f"(or package.module:attr for your own)")
    return TASKS[name]


def task_tools(cfg, task: Task) -> tuple:
    """The run's tool names: env.tools if set, else the task's own; a mismatch is a ValueError."""
    from r1.envs.tools import resolve_tool  # stdlib only

    try:  # a task's own tools may name a plug-in (`mypkg.tools:UNITS`) just as env.tools may
        own = tuple(resolve_tool(t) for t in task.tools)
    except ValueError as e:
        raise ValueError(f"data.task={task.name}: its Task(tools=...) entry: {e}") from None
    tools = own if cfg.env.tools is None else tuple(resolve_tool(t) for t in cfg.env.tools)
    if task.tools and not tools:
        raise ValueError(f"data.task={task.name} needs tools (it offers {', '.join(task.tools)}), "
                         f"but env.tools is empty; leave env.tools unset for the task's own")
    if tools and not task.tools:
        raise ValueError(f"data.task={task.name} takes no tools, but env.tools={list(tools)}; remove env.tools, "
                         f"or declare the task's tools in its Task(tools=(...)) (docs/tasks.md, A tool)")
    return tools


def make_env(cfg, tokenizer):
    """The env factory of the config's task: a function returning a fresh env (the rollout loop's input)."""
    task = get_task(cfg.data.task)
    tools = task_tools(cfg, task)
    factory = lambda: task.env(cfg, tokenizer, tools)  # noqa: E731
    factory.task = task.name  # for the one-line error of an env that raises (TaskError)
    return factory


class TaskError(ValueError):
    """A task's own code raised (its env's reset, say): one line naming the task, the row and the user's
    file:line, not a traceback through r1/. A ValueError, so at set-up it is a user error (exit 2)."""


def task_error(task: str, what: str, row, e: BaseException) -> TaskError:
    """TaskError for exception `e` raised by `what` (e.g. "reset()") of task `task` on `row`."""
    rid = row.get("id", "?") if isinstance(row, dict) else "?"
    text = (str(e).splitlines() or [""])[0][:200]
    at = user_frame(e)
    return TaskError(f"task {task}: {what} of row {rid!r} raised {type(e).__name__}"
                     f"{': ' + text if text else ''}{f' ({at})' if at else ''}")


def user_frame(e: BaseException) -> str:
    """'file:line' of the last traceback frame outside r1/ and the installed libraries (the user's code),
    relative to the working folder when it is below it; '' when there is none."""
    import os
    import sysconfig
    import traceback

    own = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # r1/
    libs = {os.path.abspath(sysconfig.get_paths()[k]) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    found = ""
    for fr in traceback.extract_tb(e.__traceback__):
        f = os.path.abspath(fr.filename)
        if f.startswith(own + os.sep) or any(f.startswith(lib + os.sep) for lib in libs) or fr.filename.startswith("<"):
            continue
        rel = os.path.relpath(f)
        found = f"{f if rel.startswith('..') else rel}:{fr.lineno}"
    return found


def check_reset(cfg, tokenizer, rows: list):
    """Reset the task's env on its first row once, at set-up (before run.dir is created), so an env whose
    reset() raises is one line and leaves nothing behind. The RNG states are put back: the run samples
    exactly what it would have without this check."""
    import random

    import torch

    if not rows:
        return
    factory = make_env(cfg, tokenizer)
    py, cpu = random.getstate(), torch.get_rng_state()
    try:
        env = factory()
        try:
            env.first_prompt(env.reset(rows[0]))
        finally:
            env.close()
    except Exception as e:  # noqa: BLE001 - the task's own code: any exception is its error
        raise task_error(factory.task, "its env's reset()", rows[0], e) from None
    finally:
        random.setstate(py)
        torch.set_rng_state(cpu)


def load_rows(cfg, split: str) -> list:
    """The config's task's rows of one split."""
    task = get_task(cfg.data.task)
    rows = task.rows(cfg, split)
    if not isinstance(rows, list):
        raise ValueError(f"task {task.name}: rows(cfg, {split!r}) returned {type(rows).__name__}, expected a list")
    return rows


def _builtins():
    import r1.tasks.builtin  # noqa: F401  (registers synthetic, gsm8k, gsm8k_tool)
