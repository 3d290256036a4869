"""The `Task` record and the table of tasks, with nothing else in the file.

Kept apart from `registry.py` (which looks tasks up and imports the built-in
ones on first use) so that the built-in tasks can register themselves
without an import cycle: builtin.py imports this file, registry.py imports
both. Stdlib only.
"""
from dataclasses import dataclass
from typing import Callable

from r1.registry import Registry


@dataclass(frozen=True)
class Task:
    name: str
    rows: Callable  # (cfg, split: str) -> list[dict]
    env: Callable  # (cfg, tokenizer, tools: tuple[str, ...]) -> Env
    tools: tuple = ()  # default tools; () = the task takes no tools
    expert: Callable | None = None  # (row, tools: list[dict] | None) -> chat messages, for SFT
    needs_path: bool = False  # data.path must name the task's data
    max_level: int | None = None  # data.level must be in [1, max_level]; None: the task has no levels
    doc: str = ""
    rewards: tuple = ()  # task-only reward terms of r1.envs.rewards.REWARDS its env pays (cli: "command")
    difficulty: Callable | None = None  # (row) -> int, for data.rl_max_difficulty; None: the task has no measure
    stop_strings: tuple = ()  # text that ends a response (kept in it), besides the tokenizer's stop ids


TASKS = Registry("task", kind=Task)


def register_task(task: Task, replace: bool = False) -> Task:
    """TASKS.register under task.name; registering a taken name again is an error unless replace=True."""
    if not isinstance(task, Task):
        raise TypeError(f"register_task expects an r1.tasks.registry.Task, got {type(task).__name__}")
    return TASKS.register(task.name, task, replace)
