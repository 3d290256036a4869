"""Credit assignment glue: from scored steps to per-token advantages and critic targets.

The math lives in r1/algos (pure functions); the estimator is looked up in
`r1.algos.estimators.ESTIMATORS` by `algo.advantage`. What is done here, once
for every estimator:

1. the KL penalty in the reward (`kl_in_reward`): per token for estimators
   whose rewards live on tokens, else summed into each step's reward;
2. the estimator (skipped on a rank with no steps, which still joins 3);
3. whitening over the GLOBAL batch (`algo.whiten`, or an estimator that
   whitens, REINFORCE++): the moments (count, sum, sum of squares) are
   all-reduced, so the result does not depend on how trajectories are dealt
   to ranks; every rank calls it the same number of times;
4. `adv_clip`.

Inputs are one `CreditInputs` (this rank's trajectories, flat; see
r1/algos/estimators.py). Episodes end in a terminal state (answered,
max_steps) or are cut by the context budget; neither forms a next state the
critic could value, so both bootstrap with 0 (`last_values` is never passed):
a cut episode is treated as terminal.
"""
import dataclasses
from dataclasses import dataclass

import torch

from r1.algos.advantages import clip_advantages, whiten
from r1.algos.estimators import ESTIMATORS, CreditInputs
from r1.algos.losses import kl_penalty

__all__ = ["Credit", "CreditInputs", "compute", "informative_groups"]


@dataclass
class Credit:
    advantages: torch.Tensor  # [M] float32, 0 off the mask
    value_target: torch.Tensor | None  # [K] (value_level "step") or [M] ("token") float32; None without a critic
    value_level: str | None  # "step" | "token" | None
    kl: torch.Tensor | None  # [M] float64 per-token KL to the reference on the mask, None without one


def informative_groups(groups: list, totals: list) -> list:
    """Per trajectory: True unless every trajectory of its group got the same total reward.

    With a group baseline on trajectory rewards alone (GRPO, RLOO; no batch
    whitening, no KL in the reward: config.validate enforces it), such a
    group's advantages are all exactly zero and the other groups' do not
    depend on it: it adds tokens to the loss's denominator and nothing to its
    policy gradient.
    """
    seen = {}
    for g, r in zip(groups, totals):
        seen.setdefault(g, set()).add(float(r))
    return [len(seen[g]) > 1 for g in groups]


def compute(batch: CreditInputs, algo) -> Credit:
    estimator = ESTIMATORS[algo.advantage]
    step_reward = batch.step_reward.double().clone()
    tok_reward = None
    kl = None
    if batch.ref_logp is not None:
        kl = kl_penalty(batch.old_logp.double(), batch.ref_logp.double(), algo.kl_estimator) * batch.mask
    if kl is not None and algo.kl_in_reward and algo.kl_coef > 0:
        if estimator.token_rewards:
            tok_reward = -algo.kl_coef * kl
        else:
            step_reward -= algo.kl_coef * torch.zeros_like(step_reward).index_add_(0, batch.tok_step, kl)
    batch = dataclasses.replace(batch, step_reward=step_reward, tok_reward=tok_reward)
    if batch.num_steps:
        advantages, value_target = estimator.fn(batch, algo)
        advantages = advantages.double()
    else:  # nothing to estimate on this rank; it still joins the whitening below
        advantages = torch.zeros(0, dtype=torch.float64)
        value_target = torch.zeros(0) if estimator.target else None
    if estimator.whitens or algo.whiten:
        advantages = whiten(advantages, batch.mask, all_sum=batch.all_sum)
    if algo.adv_clip:
        advantages = clip_advantages(advantages, algo.adv_clip)
    return Credit((advantages * batch.mask).float(), value_target, estimator.target, kl)
