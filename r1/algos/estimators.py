"""The registry of advantage estimators: `algo.advantage` -> how one rank's scored steps become advantages.

An entry is `fn(batch: CreditInputs, algo) -> (advantages [M], value_target)`
plus the flags the trainer and the config read (`Estimator`); nothing
compares an estimator's name as a string elsewhere. Adding one is a function
and `ESTIMATORS.register(name, Estimator(fn, keys=(...)))` (docs/algorithms.md).

The functions lay the flat batch out for the math of `advantages.py` and map
the result back to tokens. r1/credit.py does the rest once for all of them:
the KL penalty in the reward, whitening over the global batch (`whitens` or
`algo.whiten`), `adv_clip`, and the empty rank (which never calls `fn`).
With `algo.reward_level=step` a step's score is its discounted return-to-go,
compared with the same step index of its group's other episodes (a step
index only one episode reached has no baseline: GRPO and RLOO give it 0).
"""
from dataclasses import dataclass
from typing import Callable

import torch

from r1.algos.advantages import (discounted_returns, grpo as grpo_advantages, rloo as rloo_advantages,
                                 step_gae as step_gae_advantages, subtract_group_mean,
                                 token_gae as token_gae_advantages)
from r1.registry import Registry


@dataclass
class CreditInputs:
    """One rank's scored steps of one iteration, flat. K steps, M scored tokens, B trajectories.

    Token order is the micro-batches' (any order); step order is trajectory by trajectory.
    """
    groups: list  # [B] group (prompt index) of each trajectory
    step_reward: torch.Tensor  # [K] float64 environment reward of each step
    step_traj: torch.Tensor  # [K] long, trajectory of each step (0..B-1)
    step_index: torch.Tensor  # [K] long, position of the step within its trajectory
    tok_step: torch.Tensor  # [M] long, step of each token (0..K-1)
    tok_traj: torch.Tensor  # [M] long, trajectory of each token
    mask: torch.Tensor  # [M] 1 = trained on
    old_logp: torch.Tensor | None  # [M] the policy's logprobs when scored (None: not scored, no reference)
    ref_logp: torch.Tensor | None = None  # [M] the reference's logprobs (kl_coef > 0)
    step_value: torch.Tensor | None = None  # [K] critic value at each step's last prompt token
    tok_value: torch.Tensor | None = None  # [M] critic value before each sampled token
    tok_reward: torch.Tensor | None = None  # [M] float64 per-token reward (KL), for `token_rewards` estimators
    all_sum: Callable | None = None  # sums a float64 tensor over ranks; None = this rank is the whole batch

    @property
    def num_trajs(self) -> int:
        return len(self.groups)

    @property
    def num_steps(self) -> int:
        return self.step_reward.numel()

    def group_ids(self) -> torch.Tensor:
        """[B] long group of each trajectory."""
        return torch.as_tensor(self.groups, dtype=torch.long)

    def pad_steps(self, per_step: torch.Tensor):
        """[K] -> ([B, S] padded, [B, S] step mask), S = most steps in a trajectory."""
        S = int(self.step_index.max()) + 1 if self.num_steps else 1
        out = torch.zeros(self.num_trajs, S, dtype=per_step.dtype)
        out[self.step_traj, self.step_index] = per_step
        step_mask = torch.zeros(self.num_trajs, S)
        step_mask[self.step_traj, self.step_index] = 1.0
        return out, step_mask

    def pad_tokens(self, per_token: torch.Tensor):
        """[M] -> ([B, T] padded in token order within each trajectory, order [M], column [M])."""
        counts = torch.bincount(self.tok_traj, minlength=self.num_trajs)
        T = int(counts.max()) if counts.numel() else 1
        order = torch.argsort(self.tok_traj, stable=True)
        starts = torch.cumsum(counts, 0) - counts
        col = torch.arange(self.tok_traj.numel()) - starts[self.tok_traj[order]]
        out = torch.zeros(self.num_trajs, max(T, 1), dtype=per_token.dtype)
        out[self.tok_traj[order], col] = per_token[order]
        return out, order, col

    def trajectory_totals(self) -> torch.Tensor:
        """[B] float64 undiscounted sum of each trajectory's step rewards."""
        return torch.zeros(self.num_trajs, dtype=torch.float64).index_add_(0, self.step_traj, self.step_reward)

    def returns_to_go(self, gamma: float) -> torch.Tensor:
        """[K] float64 G_t = r_t + gamma * G_{t+1} within each trajectory (0 after its last step)."""
        rewards, step_mask = self.pad_steps(self.step_reward.double())
        return discounted_returns(rewards, step_mask, gamma)[self.step_traj, self.step_index]


@dataclass(frozen=True)
class Estimator:
    fn: Callable  # fn(batch: CreditInputs, algo) -> (advantages [M], value_target [K] | [M] | None)
    needs_critic: bool = False  # the trainer builds and trains a critic; batch.step_value / tok_value are set
    target: str | None = None  # level of the critic's target: "step" ([K]) or "token" ([M]); None without critic
    token_rewards: bool = False  # KL in the reward arrives per token (batch.tok_reward), not summed per step
    whitens: bool = False  # r1/credit whitens the advantages over the global batch (algo.whiten is implied)
    group_baseline: bool = False  # compares the n samples of a prompt: needs rollout.n >= 2
    zero_on_uniform_groups: bool = False  # a group with one total reward gets exactly 0 (drop_uniform_groups)
    keys: tuple = ()  # the algo.* keys it reads; a key of another estimator set away from its default is refused

    def __post_init__(self):
        if self.needs_critic != (self.target in ("step", "token")):
            raise ValueError(f"Estimator({self.fn.__name__}): a critic needs target 'step' or 'token' and only a "
                             f"critic has one; got needs_critic={self.needs_critic} target={self.target!r}")


def step_gae(batch: CreditInputs, algo):
    """Agent-R1 step-level GAE: one value and one reward per step; every token of step t gets A_t."""
    rewards, step_mask = batch.pad_steps(batch.step_reward)
    values, _ = batch.pad_steps(batch.step_value.double())
    adv, ret = step_gae_advantages(rewards, values, step_mask, algo.gamma, algo.lam)
    return adv[batch.tok_traj, batch.step_index[batch.tok_step]], ret[batch.step_traj, batch.step_index].float()


def token_gae(batch: CreditInputs, algo):
    """Token-level GAE over the sampled tokens; a step's reward sits on its last response token."""
    last = torch.zeros(batch.num_steps, dtype=torch.long)
    last.index_reduce_(0, batch.tok_step, torch.arange(batch.tok_step.numel()), "amax", include_self=False)
    tok_reward = torch.zeros(batch.tok_step.numel(), dtype=torch.float64)
    tok_reward[last] += batch.step_reward
    if batch.tok_reward is not None:
        tok_reward += batch.tok_reward
    rewards, order, col = batch.pad_tokens(tok_reward)
    values, _, _ = batch.pad_tokens(batch.tok_value.double())
    token_mask, _, _ = batch.pad_tokens(batch.mask.double())
    adv, ret = token_gae_advantages(rewards, values, token_mask, algo.gamma, algo.lam)
    adv_tok = torch.empty(batch.tok_step.numel(), dtype=torch.float64)
    ret_tok = torch.empty_like(adv_tok)
    adv_tok[order] = adv[batch.tok_traj[order], col]
    ret_tok[order] = ret[batch.tok_traj[order], col]
    return adv_tok, ret_tok.float()


def scores_by_level(batch: CreditInputs, algo):
    """(scores [U], group ids [U], unit of each token [M]) for the group estimators.

    trajectory: U = B, the undiscounted total reward, grouped by prompt.
    step: U = K, the discounted return-to-go, grouped by (prompt, step index).
    """
    groups = batch.group_ids()
    if algo.reward_level == "trajectory":
        return batch.trajectory_totals(), groups, batch.tok_traj
    depth = int(batch.step_index.max()) + 1
    return batch.returns_to_go(algo.gamma), groups[batch.step_traj] * depth + batch.step_index, batch.tok_step


def grpo(batch: CreditInputs, algo):
    """GRPO (Dr.GRPO with grpo_std_norm=false): each score minus its group's mean, over the group's std."""
    scores, group_ids, unit = scores_by_level(batch, algo)
    return grpo_advantages(scores, group_ids, std_norm=algo.grpo_std_norm)[unit], None


def rloo(batch: CreditInputs, algo):
    """RLOO: each score minus the mean of the other scores of its group (leave-one-out baseline)."""
    scores, group_ids, unit = scores_by_level(batch, algo)
    return rloo_advantages(scores, group_ids)[unit], None


def reinforce_pp(batch: CreditInputs, algo):
    """REINFORCE++: the scores themselves; r1/credit whitens them over the global batch (`whitens`)."""
    scores, _, unit = scores_by_level(batch, algo)
    return scores.double()[unit], None


def reinforce_pp_baseline(batch: CreditInputs, algo):
    """REINFORCE++-baseline: scores minus their group's mean, then whitened over the global batch."""
    scores, group_ids, unit = scores_by_level(batch, algo)
    return subtract_group_mean(scores, group_ids)[unit], None


GROUP_KEYS = ("reward_level", "gamma")  # gamma discounts step rewards (reward_level=step) only
ESTIMATORS = Registry("advantage estimator", {
    "step_gae": Estimator(step_gae, needs_critic=True, target="step", keys=("gamma", "lam", "whiten")),
    "token_gae": Estimator(token_gae, needs_critic=True, target="token", token_rewards=True,
                           keys=("gamma", "lam", "whiten")),
    "grpo": Estimator(grpo, group_baseline=True, zero_on_uniform_groups=True,
                      keys=GROUP_KEYS + ("grpo_std_norm", "whiten", "drop_uniform_groups")),
    "rloo": Estimator(rloo, group_baseline=True, zero_on_uniform_groups=True,
                      keys=GROUP_KEYS + ("whiten", "drop_uniform_groups")),
    "reinforce_pp": Estimator(reinforce_pp, whitens=True, keys=GROUP_KEYS),
    "reinforce_pp_baseline": Estimator(reinforce_pp_baseline, whitens=True, keys=GROUP_KEYS),
}, kind=Estimator)
# keys of the critic: read when the estimator needs one (the config refuses them otherwise)
CRITIC_KEYS = ("value_clip", "vf_coef", "vf_epochs", "critic_warmup")
