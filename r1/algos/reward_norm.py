"""Reward normalisation with running moments (algo.normalize_reward): a stability aid for rewards of
arbitrary scale (a 0-100 score, a reward model's logits).

The running statistics are plain float64 sums (count, sum, sum of squares)
of every step reward seen on all ranks, this iteration's included, so the
result does not depend on how ranks split the batch, and a checkpoint keeps
the state exactly (three numbers; not an exponential average).

    mean = S1 / W,  var = (S2 - W mean^2) / (W - 1)   (0 if W <= 1)
    MODES: off, std: r / sqrt(var), mean_std: (r - mean) / sqrt(var)   (no scaling while var <= eps)

`std` keeps every reward's sign and zero (multi-step episodes whose
intermediate steps earn 0); `mean_std` shifts every step.
"""
import math

import torch

from r1.registry import Registry


def reward_moments(rewards) -> torch.Tensor:
    """[K] rewards -> [3] float64 (count, sum, sum of squares)."""
    r = rewards.to(torch.float64)
    return torch.stack([torch.tensor(float(r.numel()), dtype=torch.float64), r.sum(), (r * r).sum()])


def off(r, mean: float, scale: float):
    """The rewards as they are."""
    return r


def std(r, mean: float, scale: float):
    """Divide by the running std: keeps every reward's sign and every zero."""
    return r * scale


def mean_std(r, mean: float, scale: float):
    """Subtract the running mean, then divide by the running std."""
    return (r - mean) * scale


MODES = Registry("reward normalisation", {"off": off, "std": std, "mean_std": mean_std})


def normalize_rewards(rewards, running, mode: str, eps: float = 1e-8):
    """rewards [K]; running [3] moments that already include these rewards -> normalised [K] float64:
    MODES[mode](r, mean, scale), scale = 1 / running std (1 while var <= eps)."""
    if mode not in MODES:
        raise ValueError(f"normalize_rewards: mode={mode!r} not in {tuple(MODES)}")
    r = rewards.to(torch.float64)
    if mode == "off":
        return r
    count, s1, s2 = (float(v) for v in running)
    mean = s1 / count if count > 0 else 0.0
    var = max(s2 - count * mean * mean, 0.0) / (count - 1) if count > 1 else 0.0
    scale = 1.0 / math.sqrt(var) if var > eps else 1.0
    return MODES[mode](r, mean, scale)
