"""RL algorithms as pure tensor functions: advantages (advantages.py), losses (losses.py, cispo.py),
reward normalisation (reward_norm.py), and the two tables that name them for the config.

The math holds no state and reads no config. `estimators.ESTIMATORS` and
`policy_losses.POLICY_LOSSES` map `algo.advantage` / `algo.policy_loss` to a
function plus the flags the trainer reads (docs/algorithms.md has the
formulas, the recipe table and how to add an entry). The math names are
re-exported so `from r1.algos import grpo, ppo_policy_loss` works.
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
    subtract_group_mean,
    token_gae,
    unflatten_steps,
    whiten,
    whiten_moments,
)
from r1.algos.cispo import cispo_policy_loss
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
    "cispo_policy_loss",
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
    "subtract_group_mean",
    "token_gae",
    "unflatten_steps",
    "value_loss",
    "whiten",
    "whiten_moments",
]
