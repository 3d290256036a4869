"""Decoupled PPO (Hilton et al. 2021, "Batch size-invariance for policy optimization"; AReaL's loss for
asynchronous RL): the policy that bounds the step is not the policy that sampled.

With one-step off-policy rollouts (train.overlap: 1) three policies meet in a loss:
the behaviour policy that sampled the tokens (its logprobs recorded by the
generator: `sampler_logp`), the proximal policy the update starts from (the
learner's weights before this update, scored in step 2: `old_logp`), and the
policy being trained (`logp`). PPO's clip keeps the update near the proximal
policy; an importance weight prox/behaviour corrects for who sampled:

    w_i   = sg[min(exp(old_i - sampler_i), tis_cap)]          when tis_cap > 0 (PPO's truncated IS)
    w_i   = sg[exp(min(old_i - sampler_i, log_ratio_clamp))]   when tis_cap = 0 (uncapped; overflow bounded)
    rho_i = exp(clamp(logp_i - old_i, +-log_ratio_clamp))
    l_i   = w_i * max(-A_i rho_i, -A_i clip(rho_i, 1 - clip_low, 1 + clip_high))
    dual clip (A_i < 0): min(., -A_i dual_clip) before the weight
    loss  = aggregate(l, valid, seg_ids, agg, norm, seg_sizes)

With tis_cap > 0 this is exactly `ppo_policy_loss` with the same tis_cap (a
test holds them equal): truncated IS against the sampler IS the decoupled
weight. What the entry adds is that the weight is the point, not an option:
the sampler's logprobs are required, tis_cap = 0 means an uncapped weight
(PPO's tis_cap = 0 means no weight), and it logs how far the behaviour
policy was (behav_kl, behav_capped_frac). The clip, ratio and drop rules are
PPO's own functions (r1/algos/losses.py), so the two cannot drift apart.
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
