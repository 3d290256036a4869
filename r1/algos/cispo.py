"""CISPO (MiniMax-M1, 2025): clipped importance-sampling weights on a REINFORCE gradient.

PPO's clip zeroes the gradient of a token whose ratio left the trust region,
so rare tokens that matter (a "wait", a tool call) stop learning once they
moved. CISPO clips the importance weight instead and keeps every token's
gradient:

    rho_i = exp(clamp(logp_i - old_i, +-log_ratio_clamp))
    w_i   = sg[clamp(rho_i, 1 - clip_low, 1 + clip_high)]       (clip_low = 1: no lower bound)
    l_i   = -w_i * A_i * exp(logp_i - sg[logp_i])                (value -w_i A_i, gradient -w_i A_i d log pi)
    truncated IS:  l_i *= sg[min(exp(old_i - sampler_i), tis_cap)]

The input checks, dropped tokens, sampler gap, truncated IS and ratio
statistics are PPO's own functions (r1/algos/losses.py), so the two cannot
drift apart.
"""
import torch

from r1.algos.losses import _masked_mean, aggregate, check_policy_inputs, drop_nonfinite, ratio_metrics, sampler_correction


def cispo_policy_loss(logp, old_logp, adv, mask, clip_low=1.0, clip_high=0.2, log_ratio_clamp=20.0,
                      sampler_logp=None, tis_cap=None, seg_ids=None, agg="token_mean", norm=None,
                      num_segments=None, seg_sizes=None):
    """logp [N] (differentiated), old_logp [N], adv [N], mask [N]; sampler_logp [N] optional.
    Returns (loss, metrics): clip_frac (the weight was clipped; the token still has a gradient),
    approx_kl, ratio_mean/max/min, is_weight_mean, dropped_nonfinite, sampler_gap_mean/max, tis_weight_mean."""
    tis_cap = check_policy_inputs("cispo_policy_loss", logp, old_logp, adv, mask, sampler_logp, tis_cap,
                                  seg_ids=seg_ids)
    if not 0.0 <= clip_low <= 1.0 or not clip_high >= 0.0:
        raise ValueError(f"cispo_policy_loss: need 0 <= clip_low <= 1 and clip_high >= 0, got {clip_low}, {clip_high}")
    valid, old, a, sampler_logp, dropped = drop_nonfinite(logp, old_logp, adv, mask, sampler_logp)

    log_ratio = (logp.detach() - old).clamp(-log_ratio_clamp, log_ratio_clamp)  # [N]
    ratio = torch.exp(log_ratio)
    weight = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)  # [N], no gradient
    pg = -weight * a * torch.exp(logp - logp.detach())
    pg, metrics = sampler_correction(pg, old, sampler_logp, valid, tis_cap)
    loss = aggregate(pg, valid, seg_ids, agg, num_segments, norm, seg_sizes)
    metrics["clip_frac"] = _masked_mean((weight != ratio).to(ratio.dtype), valid)
    metrics.update(ratio_metrics(log_ratio, ratio, valid))
    metrics.update(is_weight_mean=_masked_mean(weight, valid), dropped_nonfinite=dropped)
    return loss, {k: v.detach() for k, v in metrics.items()}
