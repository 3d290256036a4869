"""Evaluation on a task split: greedy accuracy, pass@k, turns, tool use, malformed calls.

The same AgentEnvLoop and generator as training, greedy (temperature 0)
for accuracy and, with eval.n > 1, n samples at eval.temperature for
pass@k (unbiased estimator of Chen et al. 2021). Used by eval.py and by
the trainer every `eval.every` iterations. The summary rule lives in r1/rollout_stats.py,
which the trainer imports too (this module never imports the trainer).
"""
import json
import math
import os

from r1.generate import Sampling
from r1.rollout_stats import summarize, traj_stats
from r1.trajectory import save as save_trajs


def pass_at_k(n: int, c: int, k: int) -> float:
    if n - c < k:
        return 1.0
    return 1.0 - math.prod((n - c - i) / (n - i) for i in range(k))


def evaluate(trainer, rows, cfg, out_dir=None) -> dict:
    """Run greedy (and pass@k sampling) on rows with the trainer's generator and loop."""
    from r1 import distributed

    d = trainer.d
    e = cfg.eval
    rows = rows[: e.limit] if e.limit else rows
    mine = rows[d.rank::d.world]
    trainer.sync_rollout_weights()
    trainer.rollout_model.eval()
    trainer.gen.set_sampling(Sampling(temperature=0.0, seed=cfg.run.seed))
    groups = range(d.rank, len(rows), d.world)  # global row indices: results independent of the rank split
    greedy = trainer.loop.run(mine, 1, uid_prefix="eval-", groups=groups)
    stats = [s for part in distributed.gather_objects([traj_stats(t) for t in greedy], d) for s in part]
    res = summarize(stats)
    if e.n > 1:
        trainer.gen.set_sampling(Sampling(temperature=e.temperature, seed=cfg.run.seed + 1))
        sampled = trainer.loop.run(mine, e.n, uid_prefix="evalk-", groups=groups)
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
            save_trajs(all_greedy, os.path.join(out_dir, "eval_trajectories.jsonl.gz"), tokenizer=trainer.tok)
            with open(os.path.join(out_dir, "eval.json"), "w") as f:
                json.dump(res, f, indent=1)
    return res
