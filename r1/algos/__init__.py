"""RL algorithms as pure tensor functions: advantages (advantages.py) and losses (losses.py).

Nothing here holds state or reads config; the trainer maps `algo.*` keys to
these calls (docs/algorithms.md has the formulas and the recipe table). The
names are re-exported so `from r1.algos import grpo, ppo_policy_loss` works.
"""

from r1.algos.advantages import (
    broadcast_to_steps,
    clip_advantages,
    discounted_returns,
    flatten_steps,
    grpo,
    reinforce_pp,
    rloo,
    step_gae,
    token_gae,
    unflatten_steps,
    whiten,
)
from r1.algos.losses import (
    aggregate,
    entropy_bonus,
    explained_variance,
    kl_penalty,
    kl_reward_penalty,
    ppo_policy_loss,
    segment_sum,
    value_loss,
)

__all__ = [
    "aggregate",
    "broadcast_to_steps",
    "clip_advantages",
    "discounted_returns",
    "entropy_bonus",
    "explained_variance",
    "flatten_steps",
    "grpo",
    "kl_penalty",
    "kl_reward_penalty",
    "ppo_policy_loss",
    "reinforce_pp",
    "rloo",
    "segment_sum",
    "step_gae",
    "token_gae",
    "unflatten_steps",
    "value_loss",
    "whiten",
]
