"""Decoupled PPO (r1/algos/decoupled_ppo.py) against a float64 loop over tokens, value and gradient; equal
to PPO with truncated IS when capped; a registry entry the config accepts and checks."""
import math

import pytest
import torch

from r1.algos.decoupled_ppo import decoupled_ppo_loss
from r1.algos.losses import ppo_policy_loss
from r1.algos.policy_losses import POLICY_LOSSES
from r1.config import ConfigError, load_config
from test_algo_registry import ref_token_weights
from test_trainer import SMOKE

F64 = torch.float64


def ref_decoupled(logp, prox, adv, mask, behav, clip_low, clip_high, dual_clip, tis_cap, seg, agg):
    """Loss value and d loss / d logp, token by token in Python floats."""
    valid, scales = ref_token_weights(mask, prox, behav, seg, agg)
    loss, grad = 0.0, [0.0] * len(logp)
    for i, v in enumerate(valid):
        if not v:
            continue
        rho = math.exp(max(-20.0, min(20.0, logp[i] - prox[i])))
        gap = prox[i] - behav[i]
        w = min(math.exp(min(gap, 700.0)), tis_cap) if tis_cap else math.exp(min(gap, 20.0))
        a = adv[i]
        clipped = min(max(rho, 1 - clip_low), 1 + clip_high)
        l, g = -a * rho, -a * rho  # the unclipped branch: d(-A rho)/d logp = -A rho
        if -a * clipped > l:
            l, g = -a * clipped, 0.0
        if dual_clip and a < 0 and l > -a * dual_clip:
            l, g = -a * dual_clip, 0.0
        scale = scales[i]
        loss += w * l * scale
        grad[i] = w * g * scale
    return loss, grad


def batch(seed=3, n=48):
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(n, generator=g, dtype=F64) * 3
    prox = logp + 0.4 * torch.randn(n, generator=g, dtype=F64)  # the update has moved off the proximal policy
    behav = prox + 0.6 * torch.randn(n, generator=g, dtype=F64)  # an older policy sampled
    adv = torch.randn(n, generator=g, dtype=F64)
    mask = (torch.rand(n, generator=g) < 0.85).to(F64)
    prox[3], behav[7] = float("nan"), float("-inf")  # dropped, counted
    seg = torch.sort(torch.randint(0, 6, (n,), generator=g)).values
    return logp, prox, adv, mask, behav, seg


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean", "step_mean"])
@pytest.mark.parametrize("clip_low, clip_high, dual_clip, tis_cap", [(0.2, 0.2, None, 0.0), (0.2, 0.28, 3.0, 2.0),
                                                                      (0.1, 0.3, None, 1.5)])
def test_decoupled_ppo_matches_float64_loop(agg, clip_low, clip_high, dual_clip, tis_cap):
    logp, prox, adv, mask, behav, seg = batch()
    x = logp.clone().requires_grad_(True)
    loss, metrics = decoupled_ppo_loss(x, prox, adv, mask, behav, clip_low=clip_low, clip_high=clip_high,
                                       dual_clip=dual_clip, tis_cap=tis_cap, seg_ids=seg, agg=agg)
    loss.backward()
    want, want_grad = ref_decoupled(logp.tolist(), prox.tolist(), adv.tolist(), mask.tolist(), behav.tolist(),
                                    clip_low, clip_high, dual_clip, tis_cap, seg.tolist(), agg)
    assert abs(float(loss.detach()) - want) < 1e-10
    assert torch.allclose(x.grad, torch.tensor(want_grad, dtype=F64), atol=1e-12, rtol=1e-10)
    assert float(metrics["dropped_nonfinite"]) == float(mask[3] + mask[7])
    assert 0 < float(metrics["clip_frac"]) < 1
    capped = float(metrics["behav_capped_frac"])
    assert (capped == 0) if not tis_cap else (0 < capped < 1)
    assert float(metrics["behav_kl"]) > 0


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_sum"])
@pytest.mark.parametrize("gaps", [False, True])
def test_capped_decoupled_ppo_is_ppo_with_truncated_is(agg, gaps):
    """The identity the docstring states: same loss, same gradient, bit for bit; also where the behaviour
    policy is further than log_ratio_clamp from the proximal one (gaps: |prox - behav| = 25, 60, 800)."""
    logp, prox, adv, mask, behav, seg = batch(seed=5)
    if gaps:
        for i, gap in zip((0, 1, 2, 4, 5, 6), (25.0, -25.0, 60.0, -60.0, 800.0, -800.0)):
            behav[i], mask[i] = prox[i] - gap, 1.0
    grads = []
    for fn in ("decoupled", "ppo"):
        x = logp.clone().requires_grad_(True)
        kw = dict(clip_low=0.2, clip_high=0.28, dual_clip=3.0, tis_cap=2.0, seg_ids=seg, agg=agg)
        loss = (decoupled_ppo_loss(x, prox, adv, mask, behav, **kw)[0] if fn == "decoupled"
                else ppo_policy_loss(x, prox, adv, mask, sampler_logp=behav, **kw)[0])
        loss.backward()
        grads.append((loss.detach(), x.grad))
    assert torch.equal(grads[0][0], grads[1][0]) and torch.equal(grads[0][1], grads[1][1])


def test_on_policy_it_is_ppo():
    """behaviour = proximal (overlap 0, the sampler exact): weight 1, PPO's loss and gradient."""
    logp, prox, adv, mask, _, seg = batch(seed=7)
    a = logp.clone().requires_grad_(True)
    b = logp.clone().requires_grad_(True)
    la, _ = decoupled_ppo_loss(a, prox, adv, mask, prox.clone())
    lb, _ = ppo_policy_loss(b, prox, adv, mask)
    la.backward()
    lb.backward()
    assert torch.equal(la.detach(), lb.detach()) and torch.equal(a.grad, b.grad)


def test_uncapped_weight_stays_finite_and_needs_the_sampler():
    logp = torch.zeros(3, dtype=F64, requires_grad=True)
    prox = torch.tensor([0.0, 0.0, 0.0], dtype=F64)
    behav = torch.tensor([-1000.0, 0.0, -float("inf")], dtype=F64)  # e^1000 would overflow: clamped at e^20
    loss, m = decoupled_ppo_loss(logp, prox, torch.ones(3, dtype=F64), torch.ones(3, dtype=F64), behav)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logp.grad).all()
    assert float(m["dropped_nonfinite"]) == 1.0 and logp.grad[2] == 0
    with pytest.raises(ValueError, match="sampler_logp"):
        decoupled_ppo_loss(logp, prox, torch.ones(3), torch.ones(3), None)


def test_registry_entry_and_its_keys():
    assert "decoupled_ppo" in POLICY_LOSSES
    cfg = load_config(SMOKE, ["algo.policy_loss=decoupled_ppo", "algo.tis_cap=2", "algo.dual_clip=3"])
    assert cfg.algo.policy_loss == "decoupled_ppo"
    with pytest.raises(ConfigError, match="algo.ratio_level"):
        load_config(SMOKE, ["algo.policy_loss=decoupled_ppo", "algo.ratio_level=step"])
    with pytest.raises(ConfigError, match="algo.clip_low"):
        load_config(SMOKE, ["algo.policy_loss=decoupled_ppo", "algo.clip_low=1.0"])
