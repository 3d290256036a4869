"""Rows for a config's task and split: the synthetic generator or GSM8K files.

The synthetic task's held-out split is generated from a different seed
stream than its training split, so no test problem is a training problem.
`epoch_order` is the one seeded shuffle that RL and SFT draw rows from.
"""
import functools
import random

from r1.tasks import gsm8k, synthetic


@functools.lru_cache(maxsize=4)
def epoch_order(n: int, key: str) -> list:
    """A permutation of range(n), a pure function of `key` (e.g. seed and epoch): resumes replay it."""
    perm = list(range(n))
    random.Random(key).shuffle(perm)
    return perm


def load_rows(cfg, split: str) -> list:
    d = cfg.data
    if d.task == "synthetic":
        if split == "train":
            return synthetic.make_dataset(d.train_size, cfg.run.seed, d.level)
        return synthetic.make_dataset(d.test_size, cfg.run.seed + 1_000_003, d.level)
    if not d.path:
        raise SystemExit(f"error: data.task={d.task} needs data.path (a GSM8K folder with {split}.jsonl)")
    rows = gsm8k.load_split(d.path, split)
    if split == "train" and d.train_size:
        rows = rows[: d.train_size]
    return rows
