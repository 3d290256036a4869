"""Evaluation on a task split: greedy accuracy, pass@k, turns, tool use, malformed calls.

It owns the evaluation protocol: greedy episodes (temperature 0) for
accuracy and, with eval.n > 1, n samples at eval.temperature for pass@k
(the unbiased estimator of Chen et al. 2021), summarised with the rule the
training metrics use (r1/rollout_stats.py). It plays through an actor
(r1/actor.py), the same generator and agent loop as training, and needs
nothing else: eval.py hands it a standalone actor, train.py the trainer's
(as the `evaluate` function it passes to Trainer.fit), so neither this
module nor the trainer imports the other.
"""
import json
import math
import os

from r1 import distributed
from r1.generate import Sampling
from r1.rollout_stats import summarize, traj_stats
from r1.trajectory import EVAL_FILE, save as save_trajs


def pass_at_k(n: int, c: int, k: int) -> float:
    if n - c < k:
        return 1.0
    return 1.0 - math.prod((n - c - i) / (n - i) for i in range(k))


def evaluate(actor, rows, cfg, out_dir=None) -> dict:
    """Greedy (and pass@k sampling) episodes on rows with the actor's weights as they are (the caller
    refreshes them); with out_dir, rank 0 writes the greedy trajectories and eval.json there."""
    d = actor.d
    e = cfg.eval
    rows = rows[: e.limit] if e.limit else rows
    mine = rows[d.rank::d.world]
    groups = range(d.rank, len(rows), d.world)  # global row indices: results independent of the rank split
    greedy = actor.play(mine, 1, Sampling(temperature=0.0, seed=cfg.run.seed), uid_prefix="eval-", groups=groups)
    stats = [s for part in distributed.gather_objects([traj_stats(t) for t in greedy], d) for s in part]
    res = summarize(stats)
    if e.n > 1:
        sampling = Sampling(temperature=e.temperature, seed=cfg.run.seed + 1)
        sampled = actor.play(mine, e.n, sampling, uid_prefix="evalk-", groups=groups)
        correct = {}
        for t in sampled:
            correct[t.group] = correct.get(t.group, 0) + traj_stats(t)["correct"]
        per = [c for part in distributed.gather_objects(list(correct.values()), d) for c in part]
        for k in sorted({1, e.n} | ({5} if e.n >= 5 else set())):
            res[f"pass@{k}"] = sum(pass_at_k(e.n, int(c), k) for c in per) / max(len(per), 1)
    if out_dir:
        all_greedy = [t for part in distributed.gather_objects(greedy, d) for t in part]
        if d.main:
            os.makedirs(out_dir, exist_ok=True)
            save_trajs(all_greedy, os.path.join(out_dir, EVAL_FILE), tokenizer=actor.tok)
            with open(os.path.join(out_dir, "eval.json"), "w") as f:
                json.dump(res, f, indent=1)
    return res
