"""Credit assignment, step 3 of an iteration: from scored steps to per-token advantages and critic targets.

It owns the glue between the learner's scores and the pure math of
r1/algos: the flat inputs (`credit_inputs`: this rank's steps and scored
tokens on the CPU, the running reward normalisation, the sampler's logprobs
in token order), `compute` (KL in the reward, the estimator of
`r1.algos.estimators.ESTIMATORS` by `algo.advantage`, global whitening,
clipping) and the logprob-gap and KL metrics. Batch statistics are reduced
over every rank, so results do not depend on how trajectories are dealt to
ranks.
"""
import dataclasses
from dataclasses import dataclass
from itertools import chain

import numpy as np
import torch

from r1 import distributed
from r1.algos.advantages import clip_advantages, whiten
from r1.algos.estimators import ESTIMATORS, CreditInputs
from r1.algos.losses import kl_penalty
from r1.algos.reward_norm import normalize_rewards, reward_moments
from r1.packing import Plan

__all__ = ["Credit", "CreditInputs", "compute", "credit_inputs", "informative_groups", "normalized_rewards",
           "sampler_logprobs", "score_metrics", "step_rewards"]


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
    """Advantages and critic targets of this rank's batch, done the same way for every estimator:

    1. the KL penalty in the reward (`kl_in_reward`): per token for estimators
       whose rewards live on tokens, else summed into each step's reward;
    2. the estimator (skipped on a rank with no steps, which still joins 3);
    3. whitening over the GLOBAL batch (`algo.whiten`, or an estimator that
       whitens, REINFORCE++): the moments (count, sum, sum of squares) are
       all-reduced, so the result does not depend on how trajectories are dealt
       to ranks; every rank calls it the same number of times;
    4. `adv_clip`.

    Episodes end in a terminal state (answered, max_steps) or are cut by the
    context budget; neither forms a next state the critic could value, so both
    bootstrap with 0 (`last_values` is never passed): a cut episode is treated
    as terminal.
    """
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


# ------------------------------------------------------------------ inputs: from scored micro-batches


def step_rewards(trajs: list) -> torch.Tensor:
    """[K] float64: every step's reward, trajectory by trajectory, in step order (CreditInputs' step order)."""
    return torch.tensor([s.reward for t in trajs for s in t.steps], dtype=torch.float64)


def normalized_rewards(step_reward: torch.Tensor, moments: torch.Tensor, mode: str, d,
                       seen: torch.Tensor | None = None) -> torch.Tensor:
    """algo.normalize_reward: add the global moments of every step reward seen this iteration (`seen`: all
    episodes played, also those algo.drop_uniform_groups leaves out of the update; default step_reward)
    to the running ones `moments` (count, sum, sum of squares; float64, updated in place), then normalise
    step_reward. Every rank joins the sum, also one with no steps."""
    if mode == "off":
        return step_reward
    moments += distributed.all_sum(reward_moments(step_reward if seen is None else seen), d).cpu()
    return normalize_rewards(step_reward, moments, mode)


def credit_inputs(trajs: list, plan: Plan, scores: list, step_reward: torch.Tensor, algo, d) -> CreditInputs:
    """Step 3's inputs: this rank's steps and scored tokens, flat and on the CPU (float64 math).

    scores: the learner's Scores of each micro-batch of `plan` (critic values with an estimator that
    needs a critic, reference logprobs with algo.kl_coef > 0: the models r1/learner.py builds);
    step_reward: [K] what step_rewards gives, normalised or not."""
    mbs = plan.micro_batches
    steps = [(ti, si) for ti, t in enumerate(trajs) for si in range(len(t.steps))]
    step_value = tok_value = None
    if ESTIMATORS[algo.advantage].needs_critic:
        step_value = torch.zeros(len(steps))
        if mbs:
            step_value[_cat([mb.step_index for mb in mbs])] = _cat([s.step_values for s in scores]).float()
        tok_value = _cat([s.tok_values for s in scores], torch.float32)
    return CreditInputs(
        groups=[t.group for t in trajs], step_reward=step_reward,
        step_traj=torch.tensor([ti for ti, _ in steps], dtype=torch.long),
        step_index=torch.tensor([si for _, si in steps], dtype=torch.long),
        tok_step=_cat([mb.tok_step for mb in mbs]), tok_traj=_cat([mb.tok_traj for mb in mbs]),
        mask=_cat([mb.mask for mb in mbs], torch.float32),
        old_logp=(None if any(s.old_logp is None for s in scores)
                  else _cat([s.old_logp for s in scores], torch.float32)),
        ref_logp=_cat([s.ref_logp for s in scores], torch.float32) if algo.kl_coef > 0 else None,
        step_value=step_value, tok_value=tok_value, all_sum=lambda x: distributed.all_sum(x, d).cpu())


def score_metrics(batch: CreditInputs, credit: Credit, sampler_logp: torch.Tensor, d, gap: bool = True) -> dict:
    """Sampler-trainer logprob gap and KL to the reference over the global batch (every rank joins). gap=False:
    scoring left the old logprobs to the update (the learner's reuses_logprobs), which logs the gap; a flag the
    same on every rank, not read from this rank's scores (a rank with no micro-batch has none either way)."""
    out = {}
    if gap:
        err = (batch.old_logp - sampler_logp).abs()[batch.mask.bool()]
        g = distributed.all_sum(torch.tensor([float(err.sum()), err.numel()]), d)
        out = {"logprob_gap_mean": float(g[0] / g[1].clamp(min=1)),
               "logprob_gap_max": distributed.all_max(float(err.max()) if err.numel() else 0.0, d)}
    if credit.kl is not None:
        kl = distributed.all_sum(torch.tensor([float(credit.kl.sum()), float(batch.mask.sum())]), d)
        out["kl_ref"] = float(kl[0] / kl[1].clamp(min=1))
    return out


def _cat(tensors: list, dtype=torch.long) -> torch.Tensor:
    """Concatenate per-micro-batch tensors on the CPU; an empty list gives an empty tensor. Concatenated on
    their device, then one copy: a copy per micro-batch is a host sync per micro-batch."""
    return torch.cat(tensors).cpu() if tensors else torch.zeros(0, dtype=dtype)


def sampler_logprobs(trajs: list, tok_step: torch.Tensor) -> torch.Tensor:
    """The generator's logprobs [M] in micro-batch token order (they are stored per step, in step order).

    Token j of the flat order is the k-th token of step tok_step[j] that the order meets, so it takes that
    step's k-th stored logprob: k from a stable sort by step (vectorised: a Python loop over the tokens
    was slow at GSM8K-tool batch sizes, docs/decisions.md "Host work of scoring")."""
    steps = [s for t in trajs for s in t.steps]
    logprobs = torch.from_numpy(np.fromiter(chain.from_iterable(s.logprobs for s in steps), dtype=np.float32))
    if tok_step.numel() == 0:  # (no steps, or none scored)
        return logprobs[:0]
    lens = torch.tensor([len(s.response_ids) for s in steps])
    starts = lens.cumsum(0) - lens
    order = torch.sort(tok_step, stable=True).indices
    by_step = tok_step[order]
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.numel()) - torch.searchsorted(by_step, by_step)
    return logprobs[starts[tok_step] + rank]
