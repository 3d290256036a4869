"""CISPO (MiniMax-M1, 2025): clipped importance-sampling weights on a REINFORCE gradient.

PPO's clip zeroes the gradient of a token whose ratio left the trust region,
so rare tokens that matter (a "wait", a tool call) stop learning once they
moved. CISPO clips the importance weight instead and keeps every token's
gradient:

    rho_i = exp(clamp(logp_i - old_i, +-log_ratio_clamp))
    w_i   = sg[clamp(rho_i, 1 - clip_low, 1 + clip_high)]       (clip_low = 1: no lower bound)
    l_i   = -w_i * A_i * exp(logp_i - sg[logp_i])                (value -w_i A_i, d l_i / d logp_i = -w_i A_i)
    truncated IS:  l_i *= sg[min(exp(old_i - sampler_i), tis_cap)]
    loss  = aggregate(l, valid, seg_ids, agg, norm, seg_sizes)

The paper writes sg[w] A log pi; the exp form has the same gradient and a
value that reads as the weighted advantage. Tokens with a non-finite old or
sampler logprob are dropped and counted, as in `ppo_policy_loss`.
"""
import torch

from r1.algos.losses import _check_flat, _masked_mean, aggregate, drop_nonfinite


def cispo_policy_loss(logp, old_logp, adv, mask, clip_low=1.0, clip_high=0.2, log_ratio_clamp=20.0,
                      sampler_logp=None, tis_cap=None, seg_ids=None, agg="token_mean", norm=None,
                      num_segments=None, seg_sizes=None):
    """logp [N] (differentiated), old_logp [N], adv [N], mask [N]; sampler_logp [N] optional.
    Returns (loss, metrics): clip_frac (the weight was clipped; the token still has a gradient),
    approx_kl, ratio_mean/max/min, is_weight_mean, dropped_nonfinite, sampler_gap_mean/max, tis_weight_mean."""
    _check_flat("cispo_policy_loss", logp=logp, old_logp=old_logp, adv=adv, mask=mask,
                sampler_logp=sampler_logp, seg_ids=seg_ids)
    if logp.numel() == 0:
        raise ValueError("cispo_policy_loss: empty batch (N = 0)")
    if not 0.0 <= clip_low <= 1.0 or not clip_high >= 0.0:
        raise ValueError(f"cispo_policy_loss: need 0 <= clip_low <= 1 and clip_high >= 0, got {clip_low}, {clip_high}")
    tis_cap = tis_cap or None
    if tis_cap is not None and (sampler_logp is None or not tis_cap > 0):
        raise ValueError(f"cispo_policy_loss: tis_cap={tis_cap} needs sampler_logp and a value > 0 (or 0/None for off)")
    valid, old, a, sampler_logp, dropped = drop_nonfinite(logp, old_logp, adv, mask, sampler_logp)

    log_ratio = (logp.detach() - old).clamp(-log_ratio_clamp, log_ratio_clamp)  # [N]
    ratio = torch.exp(log_ratio)
    weight = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)  # [N], no gradient
    pg = -weight * a * torch.exp(logp - logp.detach())
    metrics = {}
    if sampler_logp is not None:
        sampler = torch.where(valid, sampler_logp, old)
        gap = (old - sampler).abs()
        metrics["sampler_gap_mean"] = _masked_mean(gap, valid)
        metrics["sampler_gap_max"] = torch.where(valid, gap, 0.0).max()
        if tis_cap is not None:
            w = torch.exp(old - sampler).clamp(max=tis_cap)
            pg = pg * w
            metrics["tis_weight_mean"] = _masked_mean(w, valid)
    loss = aggregate(pg, valid, seg_ids, agg, num_segments, norm, seg_sizes)
    any_valid = valid.any()
    metrics.update(
        clip_frac=_masked_mean((weight != ratio).to(ratio.dtype), valid),
        approx_kl=_masked_mean(ratio - 1.0 - log_ratio, valid),
        ratio_mean=_masked_mean(ratio, valid),
        ratio_max=torch.where(any_valid, torch.where(valid, ratio, 0.0).max(), 0.0),
        ratio_min=torch.where(any_valid, torch.where(valid, ratio, torch.inf).min(), 0.0),
        is_weight_mean=_masked_mean(weight, valid),
        dropped_nonfinite=dropped,
    )
    return loss, {k: v.detach() for k, v in metrics.items()}
