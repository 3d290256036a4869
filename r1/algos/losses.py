"""Policy, value, entropy and KL losses on a flat token layout, their aggregation, and the KL estimators.

Every tensor is flat `[N]`: a micro-batch's tokens packed without padding;
`mask` marks the trained tokens, `seg_ids` the segment of each (a trajectory
for the `seq_*` modes, a step for `step_mean`); the GSPO ratio has its own
segments (`ratio_seg_ids`). A segment may span micro-batches: `seg_sizes`
then carries its token count over the whole batch.

Each loss hands a per-token loss to `aggregate`, the one place that
normalises; `norm` lets the trainer divide by a count over the global batch,
so the gradient does not depend on how the batch is split. Pure tensor
functions: metrics come back as 0-d detached tensors (no host sync per
micro-batch), inputs not differentiated are detached here. `KL_ESTIMATORS`
is the registry of `algo.kl_estimator`; docs/algorithms.md says what each
piece computes exactly and what it clamps.
"""

import math

import torch

from r1.registry import Registry

AGG_MODES = ("token_mean", "seq_mean_token_sum", "seq_mean_token_mean", "step_mean")


def _check_flat(name, **tensors):
    shapes = {k: tuple(v.shape) for k, v in tensors.items() if v is not None}
    if any(len(s) != 1 for s in shapes.values()) or len(set(shapes.values())) > 1:
        raise ValueError(f"{name}: expected flat [N] tensors of one length, got {shapes}")


def _masked_mean(x, keep):
    """Mean of x over keep (bool); 0 when keep is empty."""
    return torch.where(keep, x, 0.0).sum() / keep.sum().clamp(min=1)


def segment_sum(x, mask, seg_ids, num_segments=None):
    """Per-segment sum over masked tokens: out[j] = sum_{i: seg_ids[i]=j, mask[i]} x[i].

    x, mask, seg_ids: [N]. Returns [M], M = num_segments or seg_ids.max()+1.
    Also the way to turn a per-token KL into a per-step reward penalty.
    """
    _check_flat("segment_sum", x=x, mask=mask, seg_ids=seg_ids)
    if seg_ids.dtype.is_floating_point or seg_ids.dtype == torch.bool:
        raise ValueError(f"segment_sum: seg_ids must be an integer tensor, got {seg_ids.dtype}")
    M = num_segments if num_segments is not None else (int(seg_ids.max()) + 1 if seg_ids.numel() else 0)
    xs = torch.where(mask.bool(), x, 0.0)
    return torch.zeros(M, dtype=xs.dtype, device=xs.device).index_add(0, seg_ids, xs)


def aggregate(loss_tok, mask, seg_ids=None, mode="token_mean", num_segments=None, norm=None, seg_sizes=None):
    """Reduce a per-token loss [N] to a scalar. Masked-out tokens never count.

    token_mean:          sum_i m_i l_i / D,  D = sum_i m_i           (DAPO)
    seq_mean_token_sum:  sum_j (sum_{i in j} m_i l_i) / D,  D = #segments with a masked token   (Dr.GRPO)
    seq_mean_token_mean: sum_j (sum_{i in j} m_i l_i / n_j) / D, n_j = masked tokens of j       (GRPO)
    step_mean:           the same computation as seq_mean_token_mean; the name
                         says the caller numbered STEPS in seg_ids (each step's
                         response weighs the same), where seq_* modes number
                         trajectories (each episode weighs the same).
    norm (float or 0-d tensor) replaces D, e.g. the token or segment count of
    the global batch. seg_sizes ([M], optional) replaces n_j: the masked
    tokens of each segment over the whole batch, when this call sees only a
    part of some segments (a micro-batch). Segments with no masked token add 0
    and are not counted. An all-masked input gives 0 (not NaN).
    """
    if mode not in AGG_MODES:
        raise ValueError(f"aggregate: mode={mode!r} not in {AGG_MODES}")
    _check_flat("aggregate", loss_tok=loss_tok, mask=mask, seg_ids=seg_ids)
    # A tensor norm is not checked: reading it would sync the GPU every micro-batch.
    if norm is not None and not isinstance(norm, torch.Tensor) and not norm > 0:
        raise ValueError(f"aggregate: norm={norm} must be > 0")
    keep = mask.bool()
    if mode == "token_mean":
        total = torch.where(keep, loss_tok, 0.0).sum()
        return total / (keep.sum().clamp(min=1) if norm is None else norm)
    if seg_ids is None:
        raise ValueError(f"aggregate: mode={mode!r} needs seg_ids")
    if seg_sizes is not None:
        num_segments = seg_sizes.numel()
    seg_total = segment_sum(loss_tok, keep, seg_ids, num_segments)  # [M]
    seg_count = segment_sum(torch.ones_like(loss_tok), keep, seg_ids, seg_total.numel())  # [M]
    if mode == "seq_mean_token_sum":
        per_seg = seg_total
    else:
        sizes = seg_count if seg_sizes is None else seg_sizes.to(seg_total.dtype)
        per_seg = seg_total / sizes.clamp(min=1)
    denom = (seg_count > 0).sum().clamp(min=1) if norm is None else norm
    return per_seg.sum() / denom


def drop_nonfinite(logp, old_logp, adv, mask, sampler_logp=None):
    """Tokens whose old or sampler logprob is not finite leave the loss: -> (valid [N] bool,
    old [N], adv [N], sampler_logp [N] or None, dropped count). Dropped tokens get old = logp
    (ratio 1) and adv = 0 so no NaN or inf can reach the graph, even through branches
    torch.where does not select. Everything returned is detached."""
    keep = mask.bool()
    old_logp = old_logp.detach()
    finite = torch.isfinite(old_logp)
    if sampler_logp is not None:
        sampler_logp = sampler_logp.detach()
        finite = finite & torch.isfinite(sampler_logp)
    valid = keep & finite  # [N]
    old = torch.where(valid, old_logp, logp.detach())
    a = torch.where(valid, adv.detach(), 0.0)
    return valid, old, a, sampler_logp, (keep & ~finite).sum().to(logp.dtype)


def check_policy_inputs(name, logp, old_logp, adv, mask, sampler_logp=None, tis_cap=None, **segments):
    """The checks every policy loss makes on its inputs -> tis_cap (None when off; 0 means off, as
    algo.tis_cap = 0). segments: the [N] segment tensors the loss takes, checked for shape only."""
    _check_flat(name, logp=logp, old_logp=old_logp, adv=adv, mask=mask, sampler_logp=sampler_logp, **segments)
    if logp.numel() == 0:
        raise ValueError(f"{name}: empty batch (N = 0)")
    tis_cap = tis_cap or None
    if tis_cap is not None and (sampler_logp is None or not tis_cap > 0):
        raise ValueError(f"{name}: tis_cap={tis_cap} needs sampler_logp and a value > 0 (or 0/None for off)")
    return tis_cap


def check_clip(name, clip_low, clip_high, dual_clip=None):
    """The clip settings a PPO-style loss takes -> dual_clip (None when off; 0 means off, as algo.dual_clip = 0)."""
    if not 0.0 <= clip_low < 1.0 or not clip_high >= 0.0:
        raise ValueError(f"{name}: need 0 <= clip_low < 1 and clip_high >= 0, got {clip_low}, {clip_high}")
    dual_clip = dual_clip or None
    if dual_clip is not None and not dual_clip > 1.0:
        raise ValueError(f"{name}: dual_clip={dual_clip} must be > 1 (or 0/None for off)")
    return dual_clip


def policy_ratio(logp, old, valid, log_ratio_clamp=20.0, ratio_level="token", ratio_seg=None, num_segments=None):
    """-> (log_ratio [N], ratio [N]). log_ratio = clamp(logp - old, +-log_ratio_clamp) per token; the
    ratio is its exp (token), or the GSPO segment ratio (seq/step): value exp(mean log_ratio over the
    segment's valid tokens), gradient that of exp(logp_i) scaled by it (see ppo_policy_loss)."""
    log_ratio = (logp - old).clamp(-log_ratio_clamp, log_ratio_clamp)  # [N]
    if ratio_level == "token":
        return log_ratio, torch.exp(log_ratio)
    seg_lr = segment_sum(log_ratio.detach(), valid, ratio_seg, num_segments)  # [R]
    seg_n = segment_sum(torch.ones_like(log_ratio), valid, ratio_seg, seg_lr.numel())  # [R]
    seq_log_ratio = (seg_lr / seg_n.clamp(min=1))[ratio_seg]  # [N]
    return log_ratio, torch.exp(seq_log_ratio + logp - logp.detach())


def clipped_surrogate(a, ratio, clip_low, clip_high, dual_clip=None):
    """PPO's pessimistic clipped objective per token -> (l [N], clipped [N] bool, dual [N] bool):
    l = max(-A rho, -A clip(rho, 1 - clip_low, 1 + clip_high)), then min(l, -A dual_clip) where A < 0."""
    clipped_ratio = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    pg_unclipped = -a * ratio
    pg_clipped = -a * clipped_ratio
    pg = torch.maximum(pg_unclipped, pg_clipped)  # [N]
    clipped = pg_clipped > pg_unclipped
    dual = torch.zeros_like(clipped)
    if dual_clip is not None:
        pg_dual = -a * dual_clip
        dual = (a < 0) & (pg > pg_dual)
        pg = torch.where(a < 0, torch.minimum(pg, pg_dual), pg)
    return pg, clipped, dual


def sampler_correction(pg, old, sampler_logp, valid, tis_cap=None):
    """The sampler/trainer logprob gap and truncated importance sampling -> (pg [N], metrics).

    With sampler_logp: sampler_gap_mean/max = |old - sampler| over valid tokens (logged every
    iteration), and with tis_cap: pg_i *= sg[min(exp(old_i - sampler_i), tis_cap)], tis_weight_mean."""
    metrics = {}
    if sampler_logp is None:
        return pg, metrics
    sampler = torch.where(valid, sampler_logp, old)
    gap = (old - sampler).abs()
    metrics["sampler_gap_mean"] = _masked_mean(gap, valid).detach()
    metrics["sampler_gap_max"] = torch.where(valid, gap, 0.0).max().detach()
    if tis_cap is not None:
        # exp may overflow to inf; clamp(max=cap) turns that into cap exactly.
        w = torch.exp(old - sampler).clamp(max=tis_cap).detach()
        pg = pg * w
        metrics["tis_weight_mean"] = _masked_mean(w, valid)
    return pg, metrics


def ratio_metrics(log_ratio, ratio, valid):
    """approx_kl (mean of r - 1 - log r, r = exp(log_ratio) = new/old per token) and ratio_mean/max/min of
    the ratio used, over valid tokens (0 when there are none). approx_kl is the k3 estimate of
    KL(old || new) when old sampled the tokens; under train.overlap or rollout.carry_tokens the behaviour
    policy sampled them, and it is the same mean under the behaviour's samples, not importance-weighted."""
    with torch.no_grad():
        log_ratio, r = log_ratio.detach(), ratio.detach()
        any_valid = valid.any()
        return {
            "approx_kl": _masked_mean(torch.exp(log_ratio) - 1.0 - log_ratio, valid),
            "ratio_mean": _masked_mean(r, valid),
            "ratio_max": torch.where(any_valid, torch.where(valid, r, 0.0).max(), 0.0),
            "ratio_min": torch.where(any_valid, torch.where(valid, r, torch.inf).min(), 0.0),
        }


def ppo_policy_loss(
    logp,
    old_logp,
    adv,
    mask,
    clip_low=0.2,
    clip_high=0.2,
    dual_clip=None,
    log_ratio_clamp=20.0,
    sampler_logp=None,
    tis_cap=None,
    ratio_level="token",
    seg_ids=None,
    agg="token_mean",
    norm=None,
    num_segments=None,
    ratio_seg_ids=None,
    seg_sizes=None,
):
    """Clipped PPO surrogate with clip-higher, dual clip, GSPO ratio and truncated IS.

    logp [N] (current policy, differentiated), old_logp [N] (policy that the
    advantages belong to), adv [N], mask [N]; sampler_logp [N] (the
    generator's logprobs) optional; seg_ids [N] for segment aggregation and,
    unless ratio_seg_ids [N] is given, for ratio_level "seq"/"step";
    seg_sizes [M] as in `aggregate`.

        valid_i = m_i and old_logp_i, sampler_logp_i finite   (others dropped, counted)
        token ratio:  rho_i = exp(clamp(logp_i - old_i, +-log_ratio_clamp))
        seq ratio (GSPO, ratio_level "seq" or "step"; the segment is ratio_seg_ids, else seg_ids):
              s_j = exp(mean_{i in j, valid} clamp(logp_i - old_i))
              rho_i = sg[s_j] * exp(logp_i - sg[logp_i])   (value s_j, d rho_i / d logp_i = s_j)
        l_i = max(-A_i rho_i, -A_i clip(rho_i, 1 - clip_low, 1 + clip_high))
        dual clip (A_i < 0): l_i = min(l_i, -A_i * dual_clip)            (dual_clip > 1)
        truncated IS:  l_i *= sg[min(exp(old_i - sampler_i), tis_cap)]
        loss = aggregate(l, valid, seg_ids, agg, norm, seg_sizes)
    dual_clip and tis_cap are off when None or 0 (the config's "0 = off").

    Returns (loss scalar, metrics). Metrics (0-d detached, over valid tokens,
    0 when there are none): clip_frac (the clipped branch is taken, so the
    token gets no gradient), dual_clip_frac, approx_kl (mean of rho - 1 -
    log rho with the token ratio: k3 of KL(old || new) when old sampled; see ratio_metrics),
    ratio_mean/max/min (the ratio used), dropped_nonfinite (count), and with
    sampler_logp: sampler_gap_mean/max (|old - sampler|), tis_weight_mean.
    """
    tis_cap = check_policy_inputs("ppo_policy_loss", logp, old_logp, adv, mask, sampler_logp, tis_cap,
                                  seg_ids=seg_ids, ratio_seg_ids=ratio_seg_ids)
    dual_clip = check_clip("ppo_policy_loss", clip_low, clip_high, dual_clip)
    if ratio_level not in ("token", "seq", "step"):
        raise ValueError(f"ppo_policy_loss: ratio_level={ratio_level!r} not in ('token', 'seq', 'step')")
    ratio_seg = seg_ids if ratio_seg_ids is None else ratio_seg_ids
    if ratio_level != "token" and ratio_seg is None:
        raise ValueError(f"ppo_policy_loss: ratio_level={ratio_level!r} needs seg_ids or ratio_seg_ids")

    valid, old, a, sampler_logp, dropped = drop_nonfinite(logp, old_logp, adv, mask, sampler_logp)
    log_ratio, ratio = policy_ratio(logp, old, valid, log_ratio_clamp, ratio_level, ratio_seg,
                                    num_segments if ratio_seg_ids is None else None)
    pg, clipped, dual = clipped_surrogate(a, ratio, clip_low, clip_high, dual_clip)
    pg, metrics = sampler_correction(pg, old, sampler_logp, valid, tis_cap)
    loss = aggregate(pg, valid, seg_ids, agg, num_segments, norm, seg_sizes)
    with torch.no_grad():
        metrics["clip_frac"] = _masked_mean(clipped.to(ratio.dtype), valid)
        metrics["dual_clip_frac"] = _masked_mean(dual.to(ratio.dtype), valid)
    metrics.update(ratio_metrics(log_ratio, ratio, valid), dropped_nonfinite=dropped)
    return loss, metrics


def explained_variance(pred, target, mask):
    """1 - Var[target - pred] / Var[target] over masked positions (population variances).

    pred, target, mask: [N]. Returns a 0-d detached tensor: 1 is a perfect
    critic, 0 no better than a constant. When target is constant over the mask
    (max == min, checked exactly) or the mask is empty, returns 0: there is no
    variance to explain.
    """
    _check_flat("explained_variance", pred=pred, target=target, mask=mask)
    with torch.no_grad():
        keep = mask.bool()
        t = torch.where(keep, target, 0.0)
        res = torch.where(keep, target - pred, 0.0)
        n = keep.sum().clamp(min=1)
        var_t = (torch.where(keep, t - t.sum() / n, 0.0) ** 2).sum() / n
        var_r = (torch.where(keep, res - res.sum() / n, 0.0) ** 2).sum() / n
        if keep.numel() == 0:
            return torch.zeros((), dtype=target.dtype, device=target.device)
        hi = torch.where(keep, target, -torch.inf).max()
        lo = torch.where(keep, target, torch.inf).min()
        constant = ~keep.any() | (hi == lo)
        return torch.where(constant, 0.0, 1.0 - var_r / torch.where(constant, 1.0, var_t))


def value_loss(values, old_values, returns, mask, clip=None, agg="token_mean", seg_ids=None, norm=None,
               num_segments=None, explained=True):
    """Critic loss 0.5 * (v - R)^2, optionally PPO-clipped around the old values.

    values [N] (differentiated), old_values [N], returns [N], mask [N].
        l_i = 0.5 * (v_i - R_i)^2
        clip c (None or 0 = off):
              v_c = old_i + clamp(v_i - old_i, -c, c),  l_i = 0.5 * max((v_i - R_i)^2, (v_c - R_i)^2)
        loss = aggregate(l, mask, seg_ids, agg, norm)
    Returns (loss, metrics): value_mean, explained_variance (see
    `explained_variance`; left out with explained=False, for a caller that
    computes it over more than this batch), value_clip_frac (the clipped term is larger).
    """
    _check_flat("value_loss", values=values, old_values=old_values, returns=returns, mask=mask, seg_ids=seg_ids)
    clip = clip or None  # 0 means off, as algo.value_clip = 0
    if clip is not None and not clip > 0:
        raise ValueError(f"value_loss: clip={clip} must be > 0 (or 0/None for off)")
    keep = mask.bool()
    R = torch.where(keep, returns.detach(), 0.0)
    v = values
    err = (v - R) ** 2  # [N]
    clip_frac = torch.zeros((), dtype=values.dtype, device=values.device)
    if clip is not None:
        old = torch.where(keep, old_values.detach(), v.detach())
        v_c = old + (v - old).clamp(-clip, clip)
        err_c = (v_c - R) ** 2
        clip_frac = _masked_mean((err_c > err).to(values.dtype), keep).detach()
        err = torch.maximum(err, err_c)
    loss = aggregate(0.5 * err, keep, seg_ids, agg, num_segments, norm)
    metrics = {"value_mean": _masked_mean(v.detach(), keep), "value_clip_frac": clip_frac}
    if explained:
        metrics["explained_variance"] = explained_variance(v.detach(), R, keep)
    return loss, metrics


def entropy_bonus(entropy, mask, seg_ids=None, agg="token_mean", norm=None, num_segments=None, seg_sizes=None):
    """Aggregated per-token entropy [N] -> scalar, same normalisation as the policy loss.

    The trainer minimises pg_loss - entropy_coef * entropy_bonus(...), so a
    positive coefficient rewards entropy.
    """
    return aggregate(entropy, mask, seg_ids, agg, num_segments, norm, seg_sizes)


def kl_k1(logp, ref_logp):
    """k1 = logp - ref_logp: unbiased, can be negative; its gradient is zero in expectation (use it in the reward)."""
    return logp - ref_logp


def kl_k2(logp, ref_logp):
    """k2 = 0.5 (logp - ref_logp)^2: biased, >= 0; its gradient is the on-policy gradient of KL(pi || ref)."""
    return 0.5 * (logp - ref_logp) ** 2


def kl_k3(logp, ref_logp):
    """k3 = exp(d) - d - 1, d = ref_logp - logp: unbiased, >= 0, exact (no clamp); gradient 1 - exp(d)."""
    d = ref_logp - logp
    small = d.abs() < 1e-3  # exp(d) - 1 - d cancels there: its Taylor series, exact to float64 rounding
    ds, db = torch.where(small, d, 0.0), torch.where(small, 1.0, d)  # neither branch feeds inf to the other's grad
    series = ds * ds * (0.5 + ds * (1.0 / 6.0 + ds * (1.0 / 24.0 + ds / 120.0)))
    return torch.where(small, series, torch.expm1(db) - db)


def kl_k3_clamped(logp, ref_logp, k3_max=10.0, log_ratio_clamp=20.0):
    """min(k3, 10): bounded per token, so biased low (by E[(k3 - 10)+]) with a zero gradient where clamped."""
    d = (ref_logp - logp).clamp(-log_ratio_clamp, log_ratio_clamp)  # no inf even in the gradient; min() decides
    return kl_k3(-d, torch.zeros_like(d)).clamp(max=k3_max)


KL_ESTIMATORS = Registry("KL estimator", {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3, "k3_clamped": kl_k3_clamped})


def kl_penalty(logp, ref_logp, kind):
    """Per-token estimate of KL(pi || ref) from tokens sampled by pi: the KL_ESTIMATORS entry `kind`.
    [N] -> [N] (any shape works).

    With d = ref_logp - logp:
        k1 = -d = logp - ref_logp            unbiased, can be negative
        k2 = 0.5 * d^2                        biased, >= 0
        k3 = exp(d) - d - 1                   unbiased, >= 0, low variance (Schulman); exact, no clamp
        k3_clamped = min(k3, 10)              biased low by E[(k3 - 10)+]; gradient 0 where clamped
    k3 is exact in the precision it is given: in float32 a token the policy finds e^88 times less likely
    than the reference gives inf, and the step is skipped as non-finite (r1/learner.py); k3_clamped
    trades that for its bias.
    As a loss term, differentiating the estimate at fixed samples gives:
    k2 -> the on-policy gradient of KL(pi||ref); k3 -> the gradient of
    KL(ref||pi); k1 -> zero in expectation (use k1 in the reward instead).
    """
    if kind not in KL_ESTIMATORS:
        raise ValueError(f"kl_penalty: kind={kind!r} not in {tuple(KL_ESTIMATORS)}")
    if logp.shape != ref_logp.shape:
        raise ValueError(f"kl_penalty: logp shape {tuple(logp.shape)} != ref_logp shape {tuple(ref_logp.shape)}")
    return KL_ESTIMATORS[kind](logp, ref_logp.detach())


def kl_reward_penalty(rewards, logp, ref_logp, mask, coef, kind="k1"):
    """KL as a reward penalty on sampled tokens (algo.kl_in_reward = true).

    rewards, logp, ref_logp, mask: one shape (e.g. [B, T] for token_gae).
        kl_t = kl_penalty(logp, ref_logp, kind) on mask, 0 elsewhere
        rewards'_t = rewards_t - coef * kl_t
    Returns (new rewards, kl) with no gradient. For step-level rewards, sum
    the token KL of each step first: segment_sum(kl, mask, step_ids).
    """
    shapes = {"rewards": rewards.shape, "logp": logp.shape, "ref_logp": ref_logp.shape, "mask": mask.shape}
    if len(set(tuple(s) for s in shapes.values())) > 1:
        raise ValueError(f"kl_reward_penalty: shapes differ: { {k: tuple(v) for k, v in shapes.items()} }")
    if not math.isfinite(coef) or coef < 0:
        raise ValueError(f"kl_reward_penalty: coef={coef} must be finite and >= 0")
    with torch.no_grad():
        keep = mask.bool()
        # Non-sampled positions may hold garbage logprobs: select before computing.
        kl = torch.where(keep, kl_penalty(torch.where(keep, logp, 0.0), torch.where(keep, ref_logp, 0.0), kind), 0.0)
        return rewards - coef * kl, kl
