"""Evaluation on a task split: greedy accuracy, pass@k, turns, tool use, malformed calls.

The same AgentEnvLoop and generator as training, greedy (temperature 0)
for accuracy and, with eval.n > 1, n samples at eval.temperature for
pass@k (unbiased estimator of Chen et al. 2021). Used by eval.py and by
the trainer every `eval.every` iterations.
"""
import json
import math
import os

from r1.generate import Sampling
from r1.trajectory import save as save_trajs


def summarize(stats: list) -> dict:
    """Per-trajectory stats (see trainer._traj_stats) -> batch metrics."""
    n = len(stats)
    if n == 0:
        return {"n": 0}
    mean = lambda k: sum(s[k] for s in stats) / n  # noqa: E731
    mu, std = mean_std([float(s["reward"]) for s in stats])
    turns = sum(s["turns"] for s in stats)
    out = {"n": n, "reward_mean": mu, "reward_std": std,
           "accuracy": mean("correct"), "mean_turns": mean("turns"), "mean_tool_calls": mean("tool_calls"),
           "malformed_rate": sum(s["malformed_steps"] for s in stats) / max(turns, 1),
           "mean_response_len": mean("response_len")}
    for reason in sorted({s["termination"] for s in stats}):
        out[f"term_{reason}"] = sum(s["termination"] == reason for s in stats) / n
    return out


def mean_std(xs: list) -> tuple:
    """Mean and population std that never overflow or raise for finite inputs, however large (a reward of
    1e200 squared is not representable): the mean sums x/n, the std is scaled by the largest deviation."""
    n = len(xs)
    mu = math.fsum(x / n for x in xs)
    dev = [x - mu for x in xs]
    scale = max((abs(d) for d in dev), default=0.0)
    if scale == 0 or not math.isfinite(scale):
        return mu, (0.0 if scale == 0 else scale)
    return mu, scale * math.sqrt(math.fsum((d / scale) ** 2 for d in dev) / n)


def pass_at_k(n: int, c: int, k: int) -> float:
    if n - c < k:
        return 1.0
    return 1.0 - math.prod((n - c - i) / (n - i) for i in range(k))


def evaluate(trainer, rows, cfg, out_dir=None) -> dict:
    """Run greedy (and pass@k sampling) on rows with the trainer's generator and loop."""
    from r1 import distributed
    from r1.trainer import _traj_stats

    d = trainer.d
    e = cfg.eval
    rows = rows[: e.limit] if e.limit else rows
    mine = rows[d.rank::d.world]
    trainer.sync_rollout_weights()
    trainer.rollout_model.eval()
    trainer.gen.set_sampling(Sampling(temperature=0.0, seed=cfg.run.seed))
    groups = range(d.rank, len(rows), d.world)  # global row indices: results independent of the rank split
    greedy = trainer.loop.run(mine, 1, uid_prefix="eval-", groups=groups)
    stats = [s for part in distributed.gather_objects([_traj_stats(t) for t in greedy], d) for s in part]
    res = summarize(stats)
    if e.n > 1:
        trainer.gen.set_sampling(Sampling(temperature=e.temperature, seed=cfg.run.seed + 1))
        sampled = trainer.loop.run(mine, e.n, uid_prefix="evalk-", groups=groups)
        correct = {}
        for t in sampled:
            correct[t.group] = correct.get(t.group, 0) + _traj_stats(t)["correct"]
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
