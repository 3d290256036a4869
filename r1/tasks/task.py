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
    """A task, as `register_task` takes it:

    - `rows(cfg, split)`: the task's rows (dicts with at least "id" and what its
      env reads; "answer" is handed to the reward);
    - `env(cfg, tokenizer, tools)`: one new environment (an `r1.envs.base.Env`),
      called once per episode slot; `tools` is the resolved `env.tools`;
    - `tools`: the tools its env offers when `env.tools` is left unset; a task
      with no tools is refused if the config gives it some, and a task with
      tools is refused if the config takes them all away (a silent run without
      the calculator trained nothing, once);
    - `expert(row, tools)`: optional, an expert chat (messages) for the SFT
      warm-up; `tools` is the list of tool schemas, or None;
    - `needs_path`: whether `data.path` must be set (a task whose data is
      generated or shipped leaves it False);
    - `max_level`: the largest `data.level` it knows (None: no levels);
    - `difficulty(row)`: optional, an integer a row's difficulty (GSM8K: the
      calculations its reference solution marks), which `data.rl_max_difficulty`
      reads to leave the hardest rows out of RL's prompts;
    - `rewards`: the task-only reward terms its env pays (r1/envs/rewards.py;
      the cli task's `command`); config validation reads it, so a term set for
      a task that would ignore it is an error, without config.py importing the
      task.
    - `stop_strings`: text that ends a response (kept in it) besides the
      tokenizer's stop ids; the generator (r1/actor.py) stops on it.
    """

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
