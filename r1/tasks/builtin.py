"""The built-in tasks, registered exactly as a user's task would be.

- synthetic: generated arithmetic word problems (no download), solved with
  the calculator over several steps; the embedded default.
- gsm8k: GSM8K, one step, the answer after `####`.
- gsm8k_tool: GSM8K with the calculator, several steps.
- cli: the command-line assistant, generated folder trees and the sandboxed shell (r1/tasks/cli.py).

GSM8K ships with the project in `data/gsm8k/` (openai/grade-school-math,
MIT, compressed jsonl); `data.path` points elsewhere for another copy (a
folder with train/test jsonl, jsonl.gz or the HF parquet layout).
"""
from pathlib import Path

from r1.tasks import cli, gsm8k, synthetic
from r1.tasks.task import Task, register_task

GSM8K_DIR = Path(__file__).resolve().parents[2] / "data" / "gsm8k"


def gsm8k_rows(cfg, split: str) -> list:
    rows = gsm8k.load_split(cfg.data.path or GSM8K_DIR, split)
    if split == "train" and cfg.data.train_size:
        rows = rows[: cfg.data.train_size]
    if not rows:
        raise ValueError(f"GSM8K split {split!r} in {cfg.data.path or GSM8K_DIR} has no rows")
    return rows


def synthetic_rows(cfg, split: str) -> list:
    d = cfg.data
    if split == "train":
        return synthetic.make_dataset(d.train_size, cfg.run.seed, d.level)
    return synthetic.make_dataset(d.test_size, cfg.run.seed + 1_000_003, d.level)


def has_answer(text: str) -> bool:
    """The GSM8K answer format: a readable number after the last ####."""
    return gsm8k.extract_answer(text) is not None


def calculator_env(cfg, tok, tools):
    from r1.envs.tool_env import tool_env

    return tool_env(cfg, tok, tools, gsm8k.make_prompt, gsm8k.score, answer_format=has_answer)


def expert(row, tools):
    return gsm8k.expert_messages(row, tools=bool(tools))


def calculations(row) -> int:
    """A GSM8K problem's difficulty: the calculations (`<<48/2=24>>`) its reference solution marks."""
    return len(gsm8k.calculator_calls(row["solution"]))


register_task(Task("synthetic", synthetic_rows, calculator_env, tools=("calculator",), expert=expert,
                   max_level=synthetic.MAX_LEVEL, doc="generated arithmetic word problems with the calculator (no download)"))
register_task(Task("gsm8k", gsm8k_rows, calculator_env, tools=(), expert=expert, difficulty=calculations,
                   doc="GSM8K, single step, answer after ####"))
register_task(Task("gsm8k_tool", gsm8k_rows, calculator_env, tools=("calculator",), expert=expert,
                   difficulty=calculations, doc="GSM8K with the calculator, several steps"))
register_task(Task("cli", cli.rows, cli.cli_env, tools=("shell",), expert=cli.expert, max_level=cli.MAX_LEVEL,
                   rewards=("command",),
                   doc="command-line assistant: answer questions about a generated folder with a sandboxed shell"))
