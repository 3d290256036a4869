"""Rows for a config's task and split (through the task registry), and the one seeded shuffle.

The synthetic task's held-out split is generated from a different seed
stream than its training split, so no test problem is a training problem.
`epoch_order` is the one seeded shuffle that RL and SFT draw rows from.
"""
import functools
import random

from r1.tasks.registry import load_rows  # noqa: F401  (re-exported: the trainer, SFT and eval.py read rows here)


@functools.lru_cache(maxsize=4)
def epoch_order(n: int, key: str) -> list:
    """A permutation of range(n), a pure function of `key` (e.g. seed and epoch): resumes replay it."""
    perm = list(range(n))
    random.Random(key).shuffle(perm)
    return perm
