"""Paired comparison of two evaluations of the same test problems (McNemar).

    python -m r1.compare runs/eval-sft runs/eval-rl     # a summary line, then the same as JSON

Accuracy differences of a few points on GSM8K's 1,319 problems are within
noise unless paired: both models answered the same problems, so what counts
is how many problems B solved that A missed (gained) against the reverse
(lost). McNemar's test on those two counts, normal approximation with no
continuity correction, two-sided p; beside it `p_exact`, the exact test
(two-sided binomial with p = 1/2 on the discordant pairs), which is the one
to read when gained + lost is small (10 / 0: p = 0.0016, p_exact = 0.0020). Reads the greedy trajectories eval.py
writes (`eval_trajectories.jsonl.gz` in an eval.out folder, or the file
itself) and scores each with the trainer's own rule (r1/rollout_stats.py `traj_stats`), so
"correct" means exactly what the accuracy in eval.json means.
"""
import argparse
import json
import math

from r1.rollout_stats import traj_stats
from r1.trajectory import load_eval


def correct_by_problem(path: str) -> dict:
    """sample_id -> 1.0 / 0.0 for a folder written by eval.py (or its trajectory file)."""
    out = {}
    trajs = load_eval(path)
    if not trajs:
        raise ValueError(f"{path} holds no trajectories")
    for t in trajs:
        if t.sample_id in out:
            raise ValueError(f"{path}: problem {t.sample_id!r} appears twice; expected one greedy trajectory each")
        out[t.sample_id] = traj_stats(t)["correct"]
    return out


def exact_p(gained: int, lost: int) -> float:
    """Two-sided exact McNemar p: twice the binomial(gained + lost, 1/2) tail at min(gained, lost), at most 1;
    integer arithmetic, one rounding."""
    n = gained + lost
    tail = sum(math.comb(n, i) for i in range(min(gained, lost) + 1))
    return min(1.0, 2 * tail / 2 ** n) if n else 1.0


def mcnemar(a: dict, b: dict) -> dict:
    """Paired counts and test over the problems both evaluations share (an error if they share none)."""
    common = sorted(set(a) & set(b))
    if not common:
        raise ValueError("the two evaluations share no problem ids")
    gained = sum(1 for k in common if b[k] and not a[k])
    lost = sum(1 for k in common if a[k] and not b[k])
    n = len(common)
    z = (gained - lost) / math.sqrt(gained + lost) if gained + lost else 0.0
    return {"n": n, "only_in_a": len(set(a) - set(b)), "only_in_b": len(set(b) - set(a)),
            "acc_a": sum(a[k] for k in common) / n, "acc_b": sum(b[k] for k in common) / n,
            "delta_points": 100 * (gained - lost) / n, "gained": gained, "lost": lost,
            "z": z, "p": math.erfc(abs(z) / math.sqrt(2)), "p_exact": exact_p(gained, lost)}


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m r1.compare", description=__doc__.splitlines()[0])
    p.add_argument("a", help="baseline eval folder (eval.out) or eval_trajectories.jsonl.gz")
    p.add_argument("b", help="the model compared with it")
    a = p.parse_args(argv)
    evals = []
    for path in (a.a, a.b):
        try:
            evals.append(correct_by_problem(path))
        except (OSError, ValueError) as e:  # a wrong path, a damaged file: one line that names it
            raise SystemExit(f"error: {e}" if path in str(e) else f"error: {path}: {e}") from None
    try:
        r = mcnemar(*evals)
    except ValueError as e:  # evals of different problems
        raise SystemExit(f"error: {e}") from None
    unpaired = (f" (both have these; left out: {r['only_in_a']} only in {a.a}, {r['only_in_b']} only in {a.b})"
                if r["only_in_a"] or r["only_in_b"] else "")
    print(f"{r['n']} problems{unpaired}: {100 * r['acc_a']:.2f}% -> {100 * r['acc_b']:.2f}% "
          f"({r['delta_points']:+.2f} points), gained {r['gained']}, lost {r['lost']}, McNemar z = {r['z']:.2f}, "
          f"p = {r['p']:.3g} (exact {r['p_exact']:.3g})")
    print(json.dumps(r))
    return r


if __name__ == "__main__":
    from r1.exits import run_main

    run_main(main)
