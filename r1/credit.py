"""Credit assignment glue: from scored steps to per-token advantages and critic targets.

The math lives in r1/algos (pure functions); this file only lays the batch
out for them according to `cfg.algo` and maps results back to tokens.

Inputs are flat and global for one iteration (this rank's trajectories):
per token [M] (tok_step, tok_traj, mask, old_logp, ref_logp, token values)
and per step [K] (reward, value at the step's last prompt token, owning
trajectory and index in it). Episodes end in a terminal state (answered,
max_steps) or are cut by the context budget; both bootstrap with 0, since
no next state was formed.
"""
import torch

from r1.algos import advantages as A
from r1.algos.losses import kl_penalty


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


def _pad_steps(x, step_traj, step_idx, B):
    S = int(step_idx.max()) + 1 if step_idx.numel() else 1
    out = torch.zeros(B, S, dtype=x.dtype)
    out[step_traj, step_idx] = x
    mask = torch.zeros(B, S)
    mask[step_traj, step_idx] = 1.0
    return out, mask


def _pad_tokens(x, tok_traj, B):
    """Per-token values in trajectory order -> [B, T] padded (tokens keep their order within a trajectory)."""
    counts = torch.bincount(tok_traj, minlength=B)
    T = int(counts.max()) if counts.numel() else 1
    order = torch.argsort(tok_traj, stable=True)
    starts = torch.cumsum(counts, 0) - counts
    col = torch.arange(tok_traj.numel()) - starts[tok_traj[order]]
    out = torch.zeros(B, max(T, 1), dtype=x.dtype)
    out[tok_traj[order], col] = x[order]
    return out, order, col


def compute(algo, B, groups, step_reward, step_traj, step_idx, step_value, tok_step, tok_traj, mask,
            old_logp, ref_logp, tok_value):
    """-> dict(adv [M] per token, value_target: ('step', [K]) | ('token', [M]) | None, kl [M] or None)."""
    step_reward = step_reward.double().clone()
    kl = None
    if ref_logp is not None:
        kl = kl_penalty(old_logp.double(), ref_logp.double(), algo.kl_estimator) * mask
    tok_reward = None
    if kl is not None and algo.kl_in_reward and algo.kl_coef > 0:
        if algo.advantage == "token_gae":
            tok_reward = -algo.kl_coef * kl
        else:
            step_reward -= algo.kl_coef * torch.zeros_like(step_reward).index_add_(0, tok_step, kl)
    kind = algo.advantage
    target = None
    if kind == "step_gae":
        r, smask = _pad_steps(step_reward, step_traj, step_idx, B)
        v, _ = _pad_steps(step_value.double(), step_traj, step_idx, B)
        adv, ret = A.step_gae(r, v, smask, algo.gamma, algo.lam)
        adv_tok = adv[tok_traj, step_idx[tok_step]]
        target = ("step", ret[step_traj, step_idx].float())
    elif kind == "token_gae":
        # the step's reward sits on its last response token
        last = torch.zeros(step_reward.numel(), dtype=torch.long)
        last.index_reduce_(0, tok_step, torch.arange(tok_step.numel()), "amax", include_self=False)
        r_tok = torch.zeros(tok_step.numel(), dtype=torch.float64)
        r_tok[last] += step_reward
        if tok_reward is not None:
            r_tok += tok_reward
        r, order, col = _pad_tokens(r_tok, tok_traj, B)
        v, _, _ = _pad_tokens(tok_value.double(), tok_traj, B)
        m, _, _ = _pad_tokens(mask.double(), tok_traj, B)
        adv, ret = A.token_gae(r, v, m, algo.gamma, algo.lam)
        adv_tok = torch.empty(tok_step.numel(), dtype=torch.float64)
        ret_tok = torch.empty_like(adv_tok)
        adv_tok[order] = adv[tok_traj[order], col]
        ret_tok[order] = ret[tok_traj[order], col]
        target = ("token", ret_tok.float())
    else:
        if algo.reward_level == "trajectory":
            scores = torch.zeros(B, dtype=torch.float64).index_add_(0, step_traj, step_reward)
            gid = torch.as_tensor(groups, dtype=torch.long)
            unit_of_tok = tok_traj
        else:  # step: compare the same step index across the group
            scores = step_reward
            S = int(step_idx.max()) + 1
            gid = torch.as_tensor(groups, dtype=torch.long)[step_traj] * S + step_idx
            unit_of_tok = tok_step
        if kind == "grpo":
            adv_u = A.grpo(scores, gid, std_norm=algo.grpo_std_norm)
        elif kind == "rloo":
            adv_u = A.rloo(scores, gid)
        else:
            weights = torch.zeros(scores.numel(), dtype=torch.float64).index_add_(0, unit_of_tok, mask.double())
            adv_u = A.reinforce_pp(scores, gid if kind == "reinforce_pp_baseline" else None, weights=weights)
        adv_tok = adv_u[unit_of_tok]
    if algo.whiten:
        adv_tok = A.whiten(adv_tok, mask)
    if algo.adv_clip:
        adv_tok = A.clip_advantages(adv_tok, algo.adv_clip)
    return {"adv": (adv_tok * mask).float(), "value_target": target, "kl": kl}
