"""Per-episode statistics and the batch summary that training metrics and evaluation both report.

It sits below r1/trainer.py and r1/evaluate.py so that neither imports the
other for it: the trainer logs `summarize` of its rollouts, eval.py of its
greedy runs, with the same rule for "correct".
"""
import math


def traj_stats(t) -> dict:
    """One trajectory -> the numbers `summarize` averages."""
    correct = any(s.info.get("correct", s.info.get("final") and s.reward > 0) for s in t.steps)
    return {"reward": t.total_reward, "correct": float(correct),
            "turns": len(t.steps), "tool_calls": t.num_tool_calls, "errors": t.num_errors,
            "malformed_steps": sum(1 for s in t.steps if s.info.get("errors")),
            "response_len": sum(len(s.response_ids) for s in t.steps), "termination": t.termination}


def summarize(stats: list) -> dict:
    """Per-trajectory stats (see traj_stats) -> batch metrics."""
    n = len(stats)
    if n == 0:
        return {"n": 0}
    mean = lambda k: sum(s[k] for s in stats) / n  # noqa: E731
    mu, std = mean_std([float(s["reward"]) for s in stats])
    turns = sum(s["turns"] for s in stats)
    out = {"n": n, "reward_mean": mu, "reward_std": std,
           "accuracy": mean("correct"), "mean_turns": mean("turns"), "mean_tool_calls": mean("tool_calls"),
           "malformed_rate": sum(s["malformed_steps"] for s in stats) / max(turns, 1),
           "mean_response_len": mean("response_len"),
           # the longest episode's response tokens: a rollout runs its episodes side by side, so the batch lasts
           # about as many decode steps as its longest episode has tokens (the rollout's tail)
           "max_response_len": max(s["response_len"] for s in stats)}
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
