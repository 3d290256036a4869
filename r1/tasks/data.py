"""Rows for a config's task and split (through the task registry), the validation split, and the one seeded shuffle.

`data.val_size` carves a validation split out of any task's train rows, so
settings are chosen on problems that were never trained on and the test
split is read once per final recipe. The carve is a fixed permutation (not
keyed by run.seed): every run and every seed holds out the same rows, and
two recipes tuned on `val` were tuned on the same problems.

The synthetic task's held-out split is generated from a different seed
stream than its training split, so no test problem is a training problem.
`epoch_order` is the one seeded shuffle that RL and SFT draw rows from.
"""
import functools
import random

from r1.tasks import registry

VAL_KEY = "r1-validation-split"  # the carve's shuffle key: fixed, so every run holds out the same rows


def load_rows(cfg, split: str) -> list:
    """The config's task's rows of one split; `train` and `val` split the task's train rows by data.val_size."""
    n = cfg.data.val_size
    if split not in ("train", "val") or (split == "train" and not n):
        return registry.load_rows(cfg, split)
    if not n:
        raise ValueError("eval.split=val needs a validation split: set data.val_size (e.g. 500)")
    rows = registry.load_rows(cfg, "train")
    if n >= len(rows):
        raise ValueError(f"data.val_size={n} leaves no training rows: the task's train split has {len(rows)}")
    held = set(epoch_order(len(rows), VAL_KEY)[:n])
    return [r for i, r in enumerate(rows) if (i in held) == (split == "val")]


def rl_rows(cfg, rows: list) -> list:
    """The training rows RL draws its prompts from: all of them, or with data.rl_max_difficulty those the task
    measures (Task.difficulty) at most that hard, in their order. SFT reads the whole train split."""
    cap = cfg.data.rl_max_difficulty
    if not cap:
        return rows
    measure = registry.get_task(cfg.data.task).difficulty
    kept = [r for r in rows if measure(r) <= cap]
    if not kept:
        raise ValueError(f"data.rl_max_difficulty={cap} leaves none of the {len(rows)} training rows of "
                         f"data.task={cfg.data.task}: raise it, or 0 for every row")
    return kept


@functools.lru_cache(maxsize=4)
def epoch_order(n: int, key: str) -> list:
    """A permutation of range(n), a pure function of `key` (e.g. seed and epoch): resumes replay it."""
    perm = list(range(n))
    random.Random(key).shuffle(perm)
    return perm
