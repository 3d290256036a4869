"""Decoupled PPO (Hilton et al. 2021; AReaL's loss for asynchronous RL): the policy that bounds the step
is not the policy that sampled.

Three policies meet (train.overlap: 1, rollout.carry_tokens): the behaviour
policy that sampled (`sampler_logp`), the proximal one the update starts from
(`old_logp`, scored in step 2), and the trained one (`logp`). PPO's clip
bounds the step from the proximal policy; a weight prox/behaviour corrects
for who sampled:

    w_i   = sg[min(exp(old_i - sampler_i), tis_cap)]          tis_cap > 0: PPO's truncated IS, bit for bit
    w_i   = sg[exp(min(old_i - sampler_i, log_ratio_clamp))]   tis_cap = 0: uncapped, overflow bounded
    l_i   = w_i * PPO's clipped (and dual-clipped) surrogate of rho_i = exp(clamp(logp_i - old_i))

The entry makes the weight mandatory and logs behav_kl and behav_capped_frac;
the clip, ratio and drop rules are PPO's own functions (r1/algos/losses.py).
"""
import torch

from r1.algos.losses import (_masked_mean, aggregate, check_clip, check_policy_inputs, clipped_surrogate,
                             drop_nonfinite, kl_k3, policy_ratio, ratio_metrics, sampler_correction)


def decoupled_ppo_loss(logp, old_logp, adv, mask, sampler_logp, clip_low=0.2, clip_high=0.2, dual_clip=None,
                       log_ratio_clamp=20.0, tis_cap=None, seg_ids=None, agg="token_mean", norm=None,
                       num_segments=None, seg_sizes=None):
    """logp [N] (differentiated), old_logp [N] (proximal), adv [N], mask [N], sampler_logp [N] (behaviour).
    Returns (loss, metrics): PPO's (clip_frac, dual_clip_frac, approx_kl of new vs proximal over the
    behaviour's samples (losses.ratio_metrics),
    ratio_mean/max/min, dropped_nonfinite, sampler_gap_mean/max) plus behav_weight_mean,
    behav_capped_frac and behav_kl (k3 estimate of KL(behaviour || proximal))."""
    if sampler_logp is None:
        raise ValueError("decoupled_ppo_loss: needs sampler_logp (the behaviour policy's logprobs)")
    tis_cap = check_policy_inputs("decoupled_ppo_loss", logp, old_logp, adv, mask, sampler_logp, tis_cap,
                                  seg_ids=seg_ids)
    dual_clip = check_clip("decoupled_ppo_loss", clip_low, clip_high, dual_clip)
    valid, old, a, sampler, dropped = drop_nonfinite(logp, old_logp, adv, mask, sampler_logp)
    sampler = torch.where(valid, sampler, old)  # dropped tokens: weight 1, no inf reaches the graph
    log_ratio, ratio = policy_ratio(logp, old, valid, log_ratio_clamp)
    pg, clipped, dual = clipped_surrogate(a, ratio, clip_low, clip_high, dual_clip)
    pg, metrics = sampler_correction(pg, old, sampler, valid)  # PPO's gap metrics; the weight is below
    behav_log = old - sampler  # [N] log prox/behaviour
    raw = torch.exp(behav_log)  # may overflow to inf; both weights below are finite
    # capped: PPO's truncated IS as written in sampler_correction; uncapped: only the overflow side bounded
    w = raw.clamp(max=tis_cap) if tis_cap is not None else torch.exp(behav_log.clamp(max=log_ratio_clamp))
    pg = pg * w
    loss = aggregate(pg, valid, seg_ids, agg, num_segments, norm, seg_sizes)
    with torch.no_grad():
        metrics.update({
            "clip_frac": _masked_mean(clipped.to(ratio.dtype), valid),
            "dual_clip_frac": _masked_mean(dual.to(ratio.dtype), valid),
            "behav_weight_mean": _masked_mean(w, valid),
            "behav_capped_frac": _masked_mean((w != raw).to(raw.dtype), valid),
            # k3 of KL(behaviour || proximal) from behaviour samples: r - 1 - log r, r = prox/behaviour;
            # the metric's log r clamped at +-log_ratio_clamp, so one wild token cannot make it inf
            "behav_kl": _masked_mean(kl_k3(torch.zeros_like(raw), behav_log.clamp(-log_ratio_clamp, log_ratio_clamp)),
                                     valid),
        })
    metrics.update(ratio_metrics(log_ratio, ratio, valid), dropped_nonfinite=dropped)
    return loss, metrics
