"""Advantage estimators as pure tensor functions: step- and token-level GAE, GRPO, RLOO, REINFORCE++.

Tensors in, tensors out: no module state, no config (r1/algos/estimators.py
maps `algo.advantage` to them; docs/algorithms.md has the formulas; tests
compare each with a float64 loop). Two layouts: padded `[B, S]` steps or
`[B, T]` tokens with a mask for the GAE family, and flat `[N]` scores with
`group_ids` for the group baselines, which do not know whether a score is a
trajectory's or a step's (`flatten_steps` / `unflatten_steps` /
`broadcast_to_steps` move between them).

GAE skips masked positions instead of treating them as zero-reward
transitions (a padded step or a tool-output token is not an action): both
GAEs share one recursion, `_masked_gae`, which packs each row's real
positions to the left so its loop runs over real positions only.
"""

import math

import torch


def _check_same_shape(name, **tensors):
    shapes = {k: tuple(v.shape) for k, v in tensors.items() if v is not None}
    if len(set(shapes.values())) > 1:
        raise ValueError(f"{name}: shapes differ: {shapes}")


def _check_unit_interval(name, **values):
    for k, v in values.items():
        if not 0.0 <= float(v) <= 1.0:
            raise ValueError(f"{name}: {k}={v} must be in [0, 1]")


def _float_dtype(x):
    # Advantages feed every token's gradient: never compute them in bf16/fp16.
    return torch.promote_types(x.dtype, torch.float32)


def _masked_gae(rewards, values, mask, gamma, lam, last_values):
    """GAE along dim 1 over positions where mask is true, skipping the rest.

    rewards, values, mask: [B, L]; last_values: [B] (value after the last real
    position of each row). Returns (advantages [B, L], returns [B, L]), zero
    where mask is false.
    """
    B, L = rewards.shape
    dtype = _float_dtype(rewards)
    m = mask.bool()
    # torch.where, not multiplication: padding may hold NaN/inf and must not leak.
    r = torch.where(m, rewards.to(dtype), 0.0)
    v = torch.where(m, values.to(dtype), 0.0)
    if last_values is None:
        last = torch.zeros(B, dtype=dtype, device=rewards.device)
    else:
        last = last_values.to(dtype)

    # Stable sort puts each row's real positions first, in their original order.
    order = torch.argsort((~m).to(torch.int8), dim=1, stable=True)  # [B, L]
    counts = m.sum(dim=1)  # [B]
    K = int(counts.max()) if B > 0 else 0
    order = order[:, :K]  # [B, K]
    r_c = r.gather(1, order)  # [B, K]
    v_c = v.gather(1, order)  # [B, K]
    real = torch.arange(K, device=rewards.device)[None, :] < counts[:, None]  # [B, K]

    adv_c = torch.zeros(B, K, dtype=dtype, device=rewards.device)
    next_value = last  # [B]
    next_adv = torch.zeros(B, dtype=dtype, device=rewards.device)
    for k in range(K - 1, -1, -1):
        delta = r_c[:, k] + gamma * next_value - v_c[:, k]
        a = delta + gamma * lam * next_adv
        # Rows shorter than K have padding at the tail of the compacted view;
        # there the recursion state must pass through untouched.
        adv_c[:, k] = torch.where(real[:, k], a, 0.0)
        next_value = torch.where(real[:, k], v_c[:, k], next_value)
        next_adv = torch.where(real[:, k], a, next_adv)

    adv = torch.zeros(B, L, dtype=dtype, device=rewards.device)
    adv.scatter_(1, order, adv_c)
    adv = torch.where(m, adv, 0.0)
    ret = torch.where(m, adv + v, 0.0)
    return adv, ret


def step_gae(rewards, values, step_mask, gamma, lam, last_values=None):
    """Step-level GAE (Agent-R1): one value and one reward per environment step.

    rewards, values, step_mask: [B, S]; last_values: [B] or None (= zeros).
    V_next(t) is the value of the next real step of the same trajectory; after
    its last real step it is last_values[b] (0 for a terminal episode, the
    critic's value of the next state for a truncated one).

        delta_t = r_t + gamma * V_next(t) - V_t
        A_t     = delta_t + gamma * lam * A_next(t)
        R_t     = A_t + V_t

    Returns (advantages [B, S], returns [B, S]); both are 0 on masked steps.
    The trainer gives every sampled token of step t the advantage A_t.
    """
    _check_same_shape("step_gae", rewards=rewards, values=values, step_mask=step_mask)
    if rewards.dim() != 2:
        raise ValueError(f"step_gae: rewards must be [B, S], got shape {tuple(rewards.shape)}")
    if last_values is not None and tuple(last_values.shape) != (rewards.shape[0],):
        raise ValueError(
            f"step_gae: last_values must be [B]={rewards.shape[0]}, got {tuple(last_values.shape)}"
        )
    _check_unit_interval("step_gae", gamma=gamma, lam=lam)
    return _masked_gae(rewards, values, step_mask, gamma, lam, last_values)


def token_gae(rewards, values, mask, gamma, lam, last_values=None):
    """Token-level GAE over sampled tokens only (classic PPO-for-LLMs GAE).

    rewards, values, mask: [B, T]. mask is 1 on sampled tokens and 0 on
    prompt, tool-output and forced tokens. The recursion skips masked tokens:
    the next value of a sampled token is the value of the next sampled token
    of the row, and after the last one it is last_values[b] (None = 0).

        delta_t = r_t + gamma * V_next(t) - V_t,   A_t = delta_t + gamma*lam*A_next(t)

    Rewards must sit on sampled tokens (usually the last sampled token of a
    step); a non-zero reward on a masked token is an error, because it would
    otherwise vanish silently.
    Returns (advantages [B, T], returns [B, T]); 0 where mask == 0.
    """
    _check_same_shape("token_gae", rewards=rewards, values=values, mask=mask)
    if rewards.dim() != 2:
        raise ValueError(f"token_gae: rewards must be [B, T], got shape {tuple(rewards.shape)}")
    if last_values is not None and tuple(last_values.shape) != (rewards.shape[0],):
        raise ValueError(
            f"token_gae: last_values must be [B]={rewards.shape[0]}, got {tuple(last_values.shape)}"
        )
    _check_unit_interval("token_gae", gamma=gamma, lam=lam)
    lost = int(((rewards != 0) & ~mask.bool()).sum())
    if lost:
        raise ValueError(f"token_gae: rewards are non-zero on {lost} masked tokens; put rewards on sampled tokens")
    return _masked_gae(rewards, values, mask, gamma, lam, last_values)


def discounted_returns(rewards, mask, gamma, last_values=None):
    """Monte-Carlo returns G_t = r_t + gamma * G_next(t), skipping masked positions.

    rewards, mask: [B, L] (steps or tokens); last_values: [B] bootstrap or None.
    This is GAE with V = 0 and lam = 1; REINFORCE++ uses it for per-step or
    per-token rewards before whitening. Returns [B, L], 0 where mask == 0.
    """
    _check_same_shape("discounted_returns", rewards=rewards, mask=mask)
    if rewards.dim() != 2:
        raise ValueError(f"discounted_returns: rewards must be [B, L], got shape {tuple(rewards.shape)}")
    _check_unit_interval("discounted_returns", gamma=gamma)
    _, ret = _masked_gae(rewards, torch.zeros_like(rewards), mask, gamma, 1.0, last_values)
    return ret


def _groups(name, scores, group_ids):
    """Validate flat scores/group ids; return (scores as float, inverse [N], number of groups)."""
    if scores.dim() != 1:
        raise ValueError(f"{name}: scores must be [N], got shape {tuple(scores.shape)}")
    if group_ids.shape != scores.shape:
        raise ValueError(f"{name}: group_ids shape {tuple(group_ids.shape)} != scores shape {tuple(scores.shape)}")
    if group_ids.dtype.is_floating_point or group_ids.dtype == torch.bool:
        raise ValueError(f"{name}: group_ids must be an integer tensor, got {group_ids.dtype}")
    bad = int((~torch.isfinite(scores)).sum())
    if bad:
        raise ValueError(f"{name}: scores has {bad} non-finite values")
    # Ids may be any integers (prompt indices, hashes): map them to 0..G-1.
    uniq, inv = torch.unique(group_ids, return_inverse=True)
    return scores.to(_float_dtype(scores)), inv, uniq.numel()


def _group_sum(x, inv, G):
    return torch.zeros(G, dtype=x.dtype, device=x.device).index_add_(0, inv, x)  # [G]


def _constant_group(x, inv, G):
    """[N] bool: the member's group has max == min (exact, so no rounding noise)."""
    hi = torch.full((G,), -torch.inf, dtype=x.dtype, device=x.device).scatter_reduce(0, inv, x, "amax")
    lo = torch.full((G,), torch.inf, dtype=x.dtype, device=x.device).scatter_reduce(0, inv, x, "amin")
    return (hi == lo)[inv]


def grpo(scores, group_ids, std_norm=True, eps=1e-6):
    """GRPO group-relative advantage (std_norm=False gives Dr.GRPO).

    scores: [N] float, group_ids: [N] int. For a member i of group g:
        std_norm=True:  A_i = (s_i - mean_g) / (std_g + eps)
        std_norm=False: A_i =  s_i - mean_g
    std_g is the UNBIASED sample std (divide by n_g - 1), as torch.std and the
    common GRPO implementations compute it. A group of size 1 and a group whose
    scores are all equal give exactly 0 (no signal, and no eps-amplified
    rounding noise). Returns [N].
    """
    s, inv, G = _groups("grpo", scores, group_ids)
    n = _group_sum(torch.ones_like(s), inv, G)  # [G]
    mean = _group_sum(s, inv, G) / n  # [G]
    dev = s - mean[inv]  # [N]
    if std_norm:
        var = _group_sum(dev * dev, inv, G) / (n - 1).clamp(min=1)  # [G]
        adv = dev / (var.sqrt()[inv] + eps)
    else:
        adv = dev
    return torch.where(_constant_group(s, inv, G), 0.0, adv)


def rloo(scores, group_ids):
    """RLOO leave-one-out advantage: A_i = s_i - mean of the OTHER members of i's group.

    scores: [N] float, group_ids: [N] int. A group of size 1 has no other
    member and gives 0; an all-equal group gives exactly 0. Returns [N].
    """
    s, inv, G = _groups("rloo", scores, group_ids)
    n = _group_sum(torch.ones_like(s), inv, G)[inv]  # [N]
    total = _group_sum(s, inv, G)[inv]  # [N]
    adv = s - (total - s) / (n - 1).clamp(min=1)
    return torch.where((n < 2) | _constant_group(s, inv, G), 0.0, adv)


def whiten_moments(x, mask):
    """[3] float64: (sum w, sum w x, sum w x^2) over positions with mask > 0 (x, mask: same shape).

    The sufficient statistics of `whiten`: added over ranks they give the
    global mean and variance, whatever share of the batch each rank holds.
    """
    _check_same_shape("whiten_moments", x=x, mask=mask)
    w = mask.to(torch.float64)
    if bool((w < 0).any()):
        raise ValueError("whiten: mask has negative weights")
    xs = torch.where(w > 0, x.to(torch.float64), 0.0)
    return torch.stack([w.sum(), (w * xs).sum(), (w * xs * xs).sum()])


def whiten(x, mask, shift_mean=True, eps=1e-8, all_sum=None):
    """Masked whitening, global over every position where mask > 0 (on every rank, with all_sum).

    x, mask: same shape (any). mask is 0/1, or non-negative frequency weights
    (e.g. token counts, so that whitening per-trajectory scores equals
    whitening the same score broadcast to each of its tokens).
        W = sum(w),  mean = sum(w x) / W
        var  = (sum(w x^2) - W mean^2) / (W - 1)     (unbiased; 0 if W <= 1)
        out  = (x - mean) / sqrt(var + eps)            (+ mean if not shift_mean)
    all_sum: None (this batch is the whole batch) or a callable that sums a
    float64 [3] tensor over ranks, so the moments are those of the global
    batch; every rank must then call whiten, even with an empty batch.
    The moments are summed in float64. Returns x's shape, 0 where mask == 0.
    """
    _check_same_shape("whiten", x=x, mask=mask)
    dtype = _float_dtype(x)
    moments = whiten_moments(x, mask)
    if all_sum is not None:
        moments = all_sum(moments).to(torch.float64).cpu()
    total, s1, s2 = moments.tolist()
    mean = s1 / total if total > 0 else 0.0
    var = max(s2 - total * mean * mean, 0.0) / (total - 1) if total > 1 else 0.0
    keep = mask.to(dtype) > 0
    dev = torch.where(keep, x.to(torch.float64) - mean, 0.0)
    out = dev / math.sqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return torch.where(keep, out, 0.0).to(dtype)


def subtract_group_mean(scores, group_ids):
    """s_i - mean of i's group (the group includes i); an all-equal group gives exactly 0. [N] -> [N]."""
    s, inv, G = _groups("subtract_group_mean", scores, group_ids)
    mean = _group_sum(s, inv, G) / _group_sum(torch.ones_like(s), inv, G)
    return torch.where(_constant_group(s, inv, G), 0.0, s - mean[inv])


def reinforce_pp(scores, group_ids=None, weights=None, eps=1e-8, all_sum=None):
    """REINFORCE++ advantage: global (batch) whitening of returns, no critic.

    scores: [N] returns at whatever level the caller trains on:
      * trajectory: one outcome score per trajectory (pass weights = the
        number of sampled tokens of each trajectory to reproduce token-level
        whitening exactly, as OpenRLHF/verl do when they broadcast first);
      * step: per-step discounted returns (`discounted_returns`) flattened over
        real steps, weights = tokens per step;
      * token: per-token discounted returns flattened over sampled tokens.
    group_ids: [N] int or None. None: REINFORCE++ (A = whiten(s)). Given:
      REINFORCE++-baseline, A = whiten(s - mean_group(s)); a group of size 1
      subtracts its own score and gives 0 before whitening.
    weights: [N] non-negative or None (= ones). Whitening as in `whiten`,
    global over ranks with all_sum (see `whiten`). Returns [N].
    """
    if scores.dim() != 1:
        raise ValueError(f"reinforce_pp: scores must be [N], got shape {tuple(scores.shape)}")
    if group_ids is not None:
        s = subtract_group_mean(scores, group_ids)
    else:
        s = scores.to(_float_dtype(scores))
    if weights is None:
        weights = torch.ones_like(s)
    elif weights.shape != s.shape:
        raise ValueError(f"reinforce_pp: weights shape {tuple(weights.shape)} != scores shape {tuple(s.shape)}")
    return whiten(s, weights, shift_mean=True, eps=eps, all_sum=all_sum)


def clip_advantages(x, max_abs):
    """Clamp advantages to [-max_abs, max_abs] (algo.adv_clip; None or 0 = off). Any shape in, same out."""
    if not max_abs:
        return x
    if not max_abs > 0:
        raise ValueError(f"clip_advantages: max_abs={max_abs} must be > 0 (or 0/None for off)")
    return x.clamp(-max_abs, max_abs)


def flatten_steps(x, step_mask):
    """[B, S] padded per-step values -> [N] values of the real steps, row-major order."""
    _check_same_shape("flatten_steps", x=x, step_mask=step_mask)
    return x[step_mask.bool()]


def unflatten_steps(flat, step_mask, fill=0.0):
    """[N] values of real steps (row-major, as `flatten_steps` gives) -> [B, S], `fill` on padding."""
    m = step_mask.bool()
    n = int(m.sum())
    if flat.shape != (n,):
        raise ValueError(f"unflatten_steps: flat must be [{n}] (real steps in step_mask), got {tuple(flat.shape)}")
    out = torch.full(m.shape, fill, dtype=flat.dtype, device=flat.device)
    out[m] = flat
    return out


def broadcast_to_steps(per_traj, step_mask, fill=0.0):
    """[B] one value per trajectory (a score, a group id) -> [B, S] on real steps, `fill` on padding."""
    if per_traj.shape != step_mask.shape[:1]:
        raise ValueError(
            f"broadcast_to_steps: per_traj must be [B]={step_mask.shape[0]}, got {tuple(per_traj.shape)}"
        )
    full = per_traj[:, None].expand(step_mask.shape)
    return torch.where(step_mask.bool(), full, torch.full_like(full, fill))
