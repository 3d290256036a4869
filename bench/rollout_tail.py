"""The rollout's tail: how full a batch of episodes keeps the generator, read from episodes already played.

Why: a rollout plays its episodes side by side, so it lasts about as many decode steps as its longest episode
has response tokens, and at 135M a decode step with few rows live costs nearly as much as one with many
(issue 31: with the rollout beside the update, an iteration is no shorter than the rollout). This script reads
episode files (a run's trajectories/iter_*.jsonl.gz, or eval.py's eval_trajectories.jsonl.gz) and prints the
distribution of an episode's response tokens (summed over its turns) and, for batches of --batch episodes
(each file of exactly that many as it was played, else random draws from all of them), the fill: mean /
longest, and where the p90 and p95 episodes end as a fraction of the longest. It times nothing and picks
nothing: a description of episodes.

    python bench/rollout_tail.py FILE_OR_DIR [...] [--batch 512] [--draws 3] [--seed 0] [--carry N]

--carry N reads the same episodes under rollout.carry_tokens=N (r1/rollout.py): an episode pauses at the first
step boundary where it has sampled N tokens in the rollout, and goes on in the next one, so it is played in
stretches. Added: the share of episodes that would pause, the longest stretch of all, and per batch the longest
stretch of its episodes against its longest episode: about how many decode steps a rollout would last with the
key against without (arithmetic on recorded episodes, not a run; their lengths were those of a policy playing
without it).

A folder is a run folder (its trajectories/) or an eval.out folder. Prints one JSON object.
"""
import argparse
import glob
import json
import os
import random
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from r1.exits import USER_ERRORS, run_main  # noqa: E402
from r1.trajectory import EVAL_FILE, load  # noqa: E402


def files_of(target: str) -> list:
    """Episode files named by a path: the file itself, a run folder's trajectories/, or an eval.out folder."""
    if not os.path.isdir(target):
        if not os.path.exists(target):
            raise FileNotFoundError(f"no episode file or folder {target}")
        return [target]
    found = sorted(glob.glob(os.path.join(target, "trajectories", "iter_*.jsonl.gz")))
    if not found and os.path.exists(os.path.join(target, EVAL_FILE)):
        found = [os.path.join(target, EVAL_FILE)]
    if not found:
        raise FileNotFoundError(f"{target}: no trajectories/iter_*.jsonl.gz and no {EVAL_FILE} in it")
    return found


def quantile(xs: list, q: float) -> int:
    """The q-quantile of sorted xs, nearest rank below (no interpolation: a length is a count)."""
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def fill(batch: list) -> dict:
    """One batch of episode lengths: its mean over its longest (the share of decode steps x slots that carry
    a live episode, if every episode starts at once), and its p90 / p95 over its longest."""
    s = sorted(batch)
    longest = max(s[-1], 1)
    return {"n": len(s), "mean": statistics.mean(s), "longest": s[-1], "fill": statistics.mean(s) / longest,
            "p90_of_longest": quantile(s, 0.9) / longest, "p95_of_longest": quantile(s, 0.95) / longest}


def stretches(turns: list, carry: int) -> list:
    """An episode's response tokens per rollout under rollout.carry_tokens=carry: it pauses after the first turn
    at which the rollout's count reaches `carry` (0: one stretch, the whole episode)."""
    out, n = [], 0
    for k, t in enumerate(turns):
        n += t
        if carry and n >= carry and k + 1 < len(turns):
            out.append(n)
            n = 0
    return out + [n]


def tail(per_file: list, batch: int, draws: int, seed: int, carry: int = 0) -> dict:
    """per_file: each file's episodes, each a list of its turns' response tokens. Batches: each file of exactly
    `batch` episodes as it was played (a training iteration's), else `draws` random draws of `batch` from all of
    them (an evaluation's). carry > 0: the episodes in stretches as well (module docstring)."""
    episodes = [turns for eps in per_file for turns in eps]
    everything = sorted(sum(turns) for turns in episodes)
    if not everything:
        raise ValueError("no episodes in the files given")
    out = {"episodes": len(everything), "mean": statistics.mean(everything),
           **{f"p{int(q * 100)}": quantile(everything, q) for q in (0.5, 0.9, 0.95, 0.99)}, "max": everything[-1]}
    played = [eps for eps in per_file if len(eps) == batch]
    if played:
        out["batches_are"] = "files"
    else:
        rng = random.Random(seed)
        played = [rng.sample(episodes, min(batch, len(episodes))) for _ in range(draws)]
        out["batches_are"] = "random draws"
    out["batches"] = [fill([sum(turns) for turns in eps]) for eps in played]
    if carry:
        parts = {id(turns): stretches(turns, carry) for turns in episodes}  # a batch holds these same lists
        out["carry"] = {"tokens": carry, "paused_frac": sum(len(p) > 1 for p in parts.values()) / len(parts),
                        "longest_stretch": max(max(p) for p in parts.values())}
        for b, eps in zip(out["batches"], played):
            b["longest_stretch"] = max(max(parts[id(turns)]) for turns in eps)
            b["stretch_of_longest"] = b["longest_stretch"] / max(b["longest"], 1)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("paths", nargs="+", help="episode files, run folders or eval.out folders")
    p.add_argument("--batch", type=int, default=512, help="episodes a rollout plays side by side (default 512)")
    p.add_argument("--draws", type=int, default=3, help="random batches when no file holds a whole batch")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--carry", type=int, default=0, help="rollout.carry_tokens to read the episodes under (0: off)")
    a = p.parse_args(argv)
    if a.batch < 1 or a.draws < 1:
        p.error("--batch and --draws must be at least 1")
    if a.carry < 0:
        p.error("--carry must be 0 (off) or more")
    try:
        per_file = [[[len(s.response_ids) for s in t.steps] for t in load(f)]
                    for target in a.paths for f in files_of(target)]
        print(json.dumps(tail(per_file, a.batch, a.draws, a.seed, a.carry)))
    except USER_ERRORS as e:  # a missing or unreadable file: one line naming it, exit 2
        raise SystemExit(f"error: {e}") from None


if __name__ == "__main__":
    run_main(lambda: main())
