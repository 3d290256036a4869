"""The table of policy losses: a name -> a surrogate on one micro-batch's tokens.

`algo.policy_loss` is a key of `POLICY_LOSSES`. An entry is a function
`fn(batch: PolicyInputs, algo, norm) -> (loss, metrics)` and the `algo.*` keys
it reads; the config refuses a key of another loss that was set away from
its default (e.g. `dual_clip` with CISPO). Adding a loss is a function and a
table line (docs/algorithms.md, "Add your own estimator or loss").

The trainer adds the entropy bonus and the KL loss term itself, with the same
aggregation; a loss only returns its surrogate.
"""
from dataclasses import dataclass
from typing import Callable

import torch

from r1.algos.cispo import cispo_policy_loss
from r1.algos.decoupled_ppo import decoupled_ppo_loss
from r1.algos.losses import ppo_policy_loss
from r1.registry import Registry


@dataclass
class PolicyInputs:
    """One micro-batch's scored tokens [N] for a policy loss."""
    logp: torch.Tensor  # [N] current policy (differentiated)
    old_logp: torch.Tensor  # [N] the policy the advantages belong to
    advantages: torch.Tensor  # [N]
    mask: torch.Tensor  # [N] 1 = trained on
    sampler_logp: torch.Tensor  # [N] the generator's logprobs
    ratio_seg: torch.Tensor  # [N] long: the step of each token (the GSPO ratio's segment)
    agg_seg: torch.Tensor  # [N] long: the aggregation's segment (trajectory for seq_*, step for step_mean)
    seg_sizes: torch.Tensor  # [S] tokens of each aggregation segment over the whole mini-batch


@dataclass(frozen=True)
class PolicyLoss:
    fn: Callable  # fn(batch: PolicyInputs, algo, norm) -> (loss scalar, metrics dict of 0-d tensors)
    keys: tuple = ()  # the algo.* keys it reads


def ppo(batch: PolicyInputs, algo, norm):
    """Clipped PPO (clip-higher, dual clip, truncated IS); ratio_level=step is the GSPO step ratio."""
    return ppo_policy_loss(
        batch.logp, batch.old_logp, batch.advantages, batch.mask, clip_low=algo.clip_low,
        clip_high=algo.clip_high, dual_clip=algo.dual_clip or None, log_ratio_clamp=algo.log_ratio_clamp,
        sampler_logp=batch.sampler_logp, tis_cap=algo.tis_cap or None, ratio_level=algo.ratio_level,
        seg_ids=batch.agg_seg, ratio_seg_ids=batch.ratio_seg, agg=algo.loss_agg, norm=norm,
        seg_sizes=batch.seg_sizes)


def cispo(batch: PolicyInputs, algo, norm):
    """CISPO: clipped importance weights, every token keeps its gradient (r1/algos/cispo.py)."""
    return cispo_policy_loss(
        batch.logp, batch.old_logp, batch.advantages, batch.mask, clip_low=algo.clip_low,
        clip_high=algo.clip_high, log_ratio_clamp=algo.log_ratio_clamp, sampler_logp=batch.sampler_logp,
        tis_cap=algo.tis_cap or None, seg_ids=batch.agg_seg, agg=algo.loss_agg, norm=norm,
        seg_sizes=batch.seg_sizes)


def decoupled_ppo(batch: PolicyInputs, algo, norm):
    """Decoupled PPO: clip against the proximal (old) policy, weight prox/behaviour from the sampler's
    logprobs, capped at tis_cap (0 = uncapped); the loss for train.overlap: 1 (r1/algos/decoupled_ppo.py)."""
    return decoupled_ppo_loss(
        batch.logp, batch.old_logp, batch.advantages, batch.mask, batch.sampler_logp, clip_low=algo.clip_low,
        clip_high=algo.clip_high, dual_clip=algo.dual_clip or None, log_ratio_clamp=algo.log_ratio_clamp,
        tis_cap=algo.tis_cap or None, seg_ids=batch.agg_seg, agg=algo.loss_agg, norm=norm,
        seg_sizes=batch.seg_sizes)


POLICY_LOSSES = Registry("policy loss", {
    "ppo": PolicyLoss(ppo, keys=("clip_low", "clip_high", "dual_clip", "ratio_level", "log_ratio_clamp", "tis_cap")),
    "cispo": PolicyLoss(cispo, keys=("clip_low", "clip_high", "log_ratio_clamp", "tis_cap")),
    "decoupled_ppo": PolicyLoss(decoupled_ppo, keys=("clip_low", "clip_high", "dual_clip", "log_ratio_clamp",
                                                     "tis_cap")),
}, kind=PolicyLoss)
