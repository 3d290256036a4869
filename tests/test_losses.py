"""r1.algos.losses against plain float64 loops: values, gradients, metrics, edge cases.

The references walk over tokens one at a time. Where the gradient matters
(the PPO surrogate, the GSPO sequence ratio) they are built from 0-d tensors
indexed out of `logp`, so autograd of the loop is the reference gradient.
"""

import math

import pytest
import torch

from r1.algos.losses import (
    aggregate,
    entropy_bonus,
    explained_variance,
    kl_penalty,
    kl_reward_penalty,
    ppo_policy_loss,
    segment_sum,
    value_loss,
)

F64 = torch.float64
MODES = ["token_mean", "seq_mean_token_sum", "seq_mean_token_mean", "step_mean"]


# ---------------------------------------------------------------- references


def ref_aggregate(vals, mask, seg, mode, norm=None):
    """vals: list of floats or 0-d tensors; masked-out entries are never touched."""
    if mode == "token_mean":
        kept = [vals[i] for i in range(len(vals)) if mask[i]]
        total = sum(kept, 0.0)
        return total / (norm if norm is not None else max(len(kept), 1))
    per_seg = {}
    for i in range(len(vals)):
        if mask[i]:
            per_seg.setdefault(seg[i], []).append(vals[i])
    total = 0.0
    for members in per_seg.values():
        s = sum(members, 0.0)
        total = total + (s if mode == "seq_mean_token_sum" else s / len(members))
    return total / (norm if norm is not None else max(len(per_seg), 1))


def num(x):
    """A Python float from a float or a 0-d tensor (for comparisons in the loops)."""
    return x.item() if torch.is_tensor(x) else x


def ref_clip(r, lo, hi):
    """clamp that keeps the gradient where r is inside [lo, hi] and cuts it outside."""
    v = num(r)
    return lo if v < lo else hi if v > hi else r


def ref_token_losses(logp, old, adv, mask, clip_low, clip_high, dual_clip=None, sampler=None, tis_cap=None):
    """Per-token PPO losses (None for dropped tokens) from a loop over tokens."""
    out = []
    for i in range(len(old)):
        if not mask[i] or not math.isfinite(old[i]) or (sampler is not None and not math.isfinite(sampler[i])):
            out.append(None)
            continue
        ratio = torch.exp(logp[i] - old[i])
        l = max(-adv[i] * ratio, -adv[i] * ref_clip(ratio, 1 - clip_low, 1 + clip_high))
        if dual_clip is not None and adv[i] < 0:
            l = min(l, -adv[i] * dual_clip)
        if tis_cap is not None:
            l = l * min(math.exp(old[i] - sampler[i]), tis_cap)
        out.append(l)
    return out


def ref_ppo(logp, old, adv, mask, seg, agg, **kw):
    losses = ref_token_losses(logp, old, adv, mask, **kw)
    keep = [l is not None for l in losses]
    vals = [l if l is not None else 0.0 for l in losses]
    return logp.sum() * 0 + ref_aggregate(vals, keep, seg, agg)


def ref_gspo(logp, old, adv, mask, seg, clip_low, clip_high):
    """GSPO as in the paper: s_j = exp(mean_i (logp_i - old_i)), per-sequence clipped loss, mean over sequences."""
    members = {}
    for i in range(len(old)):
        if mask[i]:
            members.setdefault(seg[i], []).append(i)
    total = logp.sum() * 0
    for idx in members.values():
        s = torch.exp(sum((logp[i] - old[i] for i in idx), 0.0) / len(idx))
        per_tok = [max(-adv[i] * s, -adv[i] * ref_clip(s, 1 - clip_low, 1 + clip_high)) for i in idx]
        total = total + sum(per_tok, 0.0) / len(idx)
    return total / max(len(members), 1)


# ---------------------------------------------------------------- inputs


def batch(seed, n=48, segs=7, spread=0.4, seg_constant_adv=False):
    g = torch.Generator().manual_seed(seed)
    seg = torch.sort(torch.randint(0, segs, (n,), generator=g)).values
    mask = (torch.rand(n, generator=g) < 0.75).long()
    mask[seg == 2] = 0  # one segment with no trained token
    old = -torch.rand(n, generator=g, dtype=F64) * 3
    logp = (old + spread * torch.randn(n, generator=g, dtype=F64)).requires_grad_(True)
    adv = torch.randn(n, generator=g, dtype=F64)
    if seg_constant_adv:
        adv = torch.randn(segs, generator=g, dtype=F64)[seg]
    return logp, old, adv, mask, seg


def close(a, b, tol=1e-10):
    assert torch.allclose(torch.as_tensor(a, dtype=F64), torch.as_tensor(b, dtype=F64), atol=tol, rtol=tol), (a, b)


def grad_of(loss, x):
    (g,) = torch.autograd.grad(loss, x)
    return g


# ---------------------------------------------------------------- aggregate


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("norm", [None, 13.0])
def test_aggregate_matches_loop(mode, norm):
    g = torch.Generator().manual_seed(0)
    n = 30
    loss = torch.randn(n, generator=g, dtype=F64)
    mask = (torch.rand(n, generator=g) < 0.6).long()
    seg = torch.sort(torch.randint(0, 6, (n,), generator=g)).values
    mask[seg == 3] = 0
    loss[mask == 0] = torch.nan  # masked tokens must not leak, even as NaN
    out = aggregate(loss, mask, seg, mode=mode, num_segments=9, norm=norm)
    close(out, ref_aggregate(loss.tolist(), mask.tolist(), seg.tolist(), mode, norm))


@pytest.mark.parametrize("mode", MODES)
def test_aggregate_all_masked_is_zero(mode):
    x = torch.randn(5, dtype=F64, requires_grad=True)
    out = aggregate(x, torch.zeros(5), torch.zeros(5, dtype=torch.long), mode=mode)
    assert out.item() == 0.0
    assert torch.all(grad_of(out, x) == 0)


def test_aggregate_bad_input():
    x, m, s = torch.zeros(4), torch.ones(4), torch.zeros(4, dtype=torch.long)
    with pytest.raises(ValueError, match="mode="):
        aggregate(x, m, s, mode="sum")
    with pytest.raises(ValueError, match="needs seg_ids"):
        aggregate(x, m, mode="seq_mean_token_mean")
    with pytest.raises(ValueError, match="norm"):
        aggregate(x, m, norm=0.0)
    with pytest.raises(ValueError, match="flat"):
        aggregate(x, torch.ones(3))


def test_segment_sum():
    x = torch.tensor([1.0, 2.0, 4.0, 8.0], dtype=F64)
    out = segment_sum(x, torch.tensor([1, 0, 1, 1]), torch.tensor([0, 0, 2, 2]), num_segments=4)
    assert out.tolist() == [1.0, 0.0, 12.0, 0.0]


# ---------------------------------------------------------------- ppo, token ratio


@pytest.mark.parametrize("clip_low,clip_high,dual_clip", [(0.2, 0.2, None), (0.2, 0.28, None), (0.1, 0.3, 2.0)])
@pytest.mark.parametrize("agg", MODES)
def test_ppo_token_matches_loop(clip_low, clip_high, dual_clip, agg):
    logp, old, adv, mask, seg = batch(1)
    loss, metrics = ppo_policy_loss(logp, old, adv, mask, clip_low=clip_low, clip_high=clip_high,
                                    dual_clip=dual_clip, seg_ids=seg, agg=agg)
    ref = ref_ppo(logp, old.tolist(), adv.tolist(), mask.tolist(), seg.tolist(), agg,
                  clip_low=clip_low, clip_high=clip_high, dual_clip=dual_clip)
    close(loss, ref)
    close(grad_of(loss, logp), grad_of(ref, logp))

    # Metrics, by loop.
    ratios, clipped, kls = [], [], []
    for i in range(len(old)):
        if not mask[i]:
            continue
        r = math.exp(logp[i].item() - old[i].item())
        a = adv[i].item()
        ratios.append(r)
        clipped.append(-a * min(max(r, 1 - clip_low), 1 + clip_high) > -a * r)
        kls.append(r - 1 - math.log(r))
    assert 0 < sum(clipped) < len(clipped)  # the inputs exercise both branches
    close(metrics["clip_frac"], sum(clipped) / len(clipped))
    close(metrics["approx_kl"], sum(kls) / len(kls))
    close(metrics["ratio_mean"], sum(ratios) / len(ratios))
    close(metrics["ratio_max"], max(ratios))
    close(metrics["ratio_min"], min(ratios))
    assert metrics["dropped_nonfinite"].item() == 0
    assert not metrics["clip_frac"].requires_grad


def test_ppo_dual_clip_caps_negative_advantage_loss():
    logp = torch.log(torch.tensor([5.0, 5.0, 0.5], dtype=F64)).requires_grad_(True)  # old = 0: ratio 5, 5, 0.5
    old = torch.zeros(3, dtype=F64)
    adv = torch.tensor([-1.0, 1.0, -1.0], dtype=F64)
    tok = []
    for i in range(3):
        l, _ = ppo_policy_loss(logp[i:i + 1], old[i:i + 1], adv[i:i + 1], torch.ones(1), dual_clip=3.0)
        tok.append(l.item())
    # adv<0, ratio 5: max(5, 1.2) = 5 > cap 3 -> 3.  adv>0, ratio 5: max(-5, -1.2) = -1.2.
    # adv<0, ratio .5: max(.5, .8) = .8 (the clip keeps pushing the ratio up), under the cap.
    close(tok, [3.0, -1.2, 0.8])
    _, metrics = ppo_policy_loss(logp, old, adv, torch.ones(3), dual_clip=3.0)
    close(metrics["dual_clip_frac"], 1 / 3)


def test_ppo_drops_nonfinite_old_and_sampler_logprobs():
    logp, old, adv, mask, seg = batch(2)
    sampler = old + 0.05 * torch.randn(len(old), generator=torch.Generator().manual_seed(9), dtype=F64)
    mask[:6] = 1
    old[0], old[1] = torch.nan, torch.inf
    sampler[2], sampler[3] = -torch.inf, torch.nan
    mask[4] = 0
    old[4] = torch.nan  # not trained anyway: not counted as dropped
    loss, metrics = ppo_policy_loss(logp, old, adv, mask, sampler_logp=sampler, tis_cap=2.0, seg_ids=seg,
                                    agg="seq_mean_token_mean")
    ref = ref_ppo(logp, old.tolist(), adv.tolist(), mask.tolist(), seg.tolist(), "seq_mean_token_mean",
                  clip_low=0.2, clip_high=0.2, sampler=sampler.tolist(), tis_cap=2.0)
    assert torch.isfinite(loss)
    g = grad_of(loss, logp)
    assert torch.all(torch.isfinite(g)) and torch.all(g[:4] == 0)
    close(loss, ref)
    close(g, grad_of(ref, logp))
    assert metrics["dropped_nonfinite"].item() == 4
    assert all(torch.isfinite(v) for v in metrics.values())


def test_ppo_truncated_importance_sampling_matches_loop():
    logp, old, adv, mask, seg = batch(3)
    sampler = old - 0.3 * torch.randn(len(old), generator=torch.Generator().manual_seed(4), dtype=F64)
    sampler[0] = old[0] - 50.0  # huge gap: weight must be the cap, not inf
    mask[0] = 1
    loss, metrics = ppo_policy_loss(logp, old, adv, mask, sampler_logp=sampler, tis_cap=1.5)
    ref = ref_ppo(logp, old.tolist(), adv.tolist(), mask.tolist(), seg.tolist(), "token_mean",
                  clip_low=0.2, clip_high=0.2, sampler=sampler.tolist(), tis_cap=1.5)
    close(loss, ref)
    close(grad_of(loss, logp), grad_of(ref, logp))
    gaps = [abs(old[i].item() - sampler[i].item()) for i in range(len(old)) if mask[i]]
    close(metrics["sampler_gap_mean"], sum(gaps) / len(gaps))
    close(metrics["sampler_gap_max"], max(gaps))
    assert metrics["tis_weight_mean"].item() <= 1.5


def test_ppo_log_ratio_clamp_keeps_everything_finite():
    logp = torch.tensor([0.0, -1.0], dtype=F64, requires_grad=True)
    old = torch.tensor([-200.0, -1.0], dtype=F64)
    loss, metrics = ppo_policy_loss(logp, old, torch.tensor([-1.0, 1.0], dtype=F64), torch.ones(2))
    assert torch.isfinite(loss) and torch.all(torch.isfinite(grad_of(loss, logp)))
    close(metrics["ratio_max"], math.exp(20.0))


def test_ppo_all_masked_gives_zero():
    logp, old, adv, _, seg = batch(4)
    for ratio_level in ["token", "seq"]:
        loss, metrics = ppo_policy_loss(logp, old, adv, torch.zeros(len(old)), seg_ids=seg, ratio_level=ratio_level,
                                        agg="seq_mean_token_mean")
        assert loss.item() == 0.0 and torch.all(grad_of(loss, logp) == 0)
        assert all(v.item() == 0.0 for v in metrics.values())


def test_ppo_single_token():
    logp = torch.tensor([-0.5], dtype=F64, requires_grad=True)
    loss, _ = ppo_policy_loss(logp, torch.tensor([-0.6], dtype=F64), torch.tensor([2.0], dtype=F64), torch.ones(1))
    close(loss, -2.0 * math.exp(0.1))
    close(grad_of(loss, logp), [-2.0 * math.exp(0.1)])


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean"])
def test_ppo_global_norm_makes_micro_batches_add_up(agg):
    # The trainer splits a batch into micro-batches and divides each by the GLOBAL count.
    logp, old, adv, mask, seg = batch(5)
    full, _ = ppo_policy_loss(logp, old, adv, mask, seg_ids=seg, agg=agg)
    cut = int((seg <= 3).sum())  # split on a segment boundary
    if agg == "token_mean":
        norm = float(mask.sum())
    else:
        norm = float(len({int(s) for s, m in zip(seg, mask) if m}))
    parts = []
    for sl in [slice(0, cut), slice(cut, None)]:
        part, _ = ppo_policy_loss(logp[sl], old[sl], adv[sl], mask[sl], seg_ids=seg[sl], agg=agg, norm=norm,
                                  num_segments=7)
        parts.append(part)
    close(parts[0] + parts[1], full)


# ---------------------------------------------------------------- ppo, GSPO sequence ratio


@pytest.mark.parametrize("ratio_level", ["seq", "step"])
def test_ppo_seq_ratio_matches_gspo_value_and_gradient(ratio_level):
    logp, old, adv, mask, seg = batch(6, spread=0.05, seg_constant_adv=True)
    clip_low, clip_high = 0.02, 0.03  # GSPO uses tight sequence clip ranges
    loss, metrics = ppo_policy_loss(logp, old, adv, mask, clip_low=clip_low, clip_high=clip_high,
                                    ratio_level=ratio_level, seg_ids=seg, agg="seq_mean_token_mean")
    ref = ref_gspo(logp, old.tolist(), adv.tolist(), mask.tolist(), seg.tolist(), clip_low, clip_high)
    close(loss, ref)
    close(grad_of(loss, logp), grad_of(ref, logp))
    assert 0 < metrics["clip_frac"].item() < 1  # some sequences clipped, some not


def test_ppo_seq_ratio_value_with_token_advantages():
    # Token-varying advantages: each token uses its sequence's ratio s_j.
    logp, old, adv, mask, seg = batch(7, spread=0.1)
    loss, metrics = ppo_policy_loss(logp, old, adv, mask, ratio_level="seq", seg_ids=seg, agg="token_mean")
    s = {}
    for j in set(seg.tolist()):
        idx = [i for i in range(len(old)) if mask[i] and seg[i] == j]
        if idx:
            s[j] = math.exp(sum(logp[i].item() - old[i].item() for i in idx) / len(idx))
    vals = []
    for i in range(len(old)):
        if mask[i]:
            r, a = s[seg[i].item()], adv[i].item()
            vals.append(max(-a * r, -a * min(max(r, 0.8), 1.2)))
    close(loss, sum(vals) / len(vals))
    close(metrics["ratio_max"], max(s.values()))


# ---------------------------------------------------------------- ppo, bad input


def test_ppo_bad_input():
    logp, old, adv, mask, seg = batch(8, n=6)
    with pytest.raises(ValueError, match="dual_clip"):
        ppo_policy_loss(logp, old, adv, mask, dual_clip=0.5)
    off, _ = ppo_policy_loss(logp, old, adv, mask, dual_clip=0.0, tis_cap=0.0)  # the config's 0 = off
    close(off, ppo_policy_loss(logp, old, adv, mask)[0])
    with pytest.raises(ValueError, match="tis_cap"):
        ppo_policy_loss(logp, old, adv, mask, tis_cap=2.0)
    with pytest.raises(ValueError, match="needs seg_ids"):
        ppo_policy_loss(logp, old, adv, mask, ratio_level="seq")
    with pytest.raises(ValueError, match="ratio_level"):
        ppo_policy_loss(logp, old, adv, mask, ratio_level="sentence")
    with pytest.raises(ValueError, match="clip_low"):
        ppo_policy_loss(logp, old, adv, mask, clip_low=1.0)
    with pytest.raises(ValueError, match="flat"):
        ppo_policy_loss(logp, old[:5], adv, mask)
    with pytest.raises(ValueError, match="empty"):
        ppo_policy_loss(logp[:0], old[:0], adv[:0], mask[:0])


# ---------------------------------------------------------------- value loss, explained variance


def ref_explained_variance(pred, target, mask):
    t = [target[i] for i in range(len(mask)) if mask[i]]
    r = [target[i] - pred[i] for i in range(len(mask)) if mask[i]]
    if not t or max(t) == min(t):
        return 0.0
    mt, mr = sum(t) / len(t), sum(r) / len(r)
    var_t = sum((x - mt) ** 2 for x in t) / len(t)
    var_r = sum((x - mr) ** 2 for x in r) / len(r)
    return 1 - var_r / var_t


@pytest.mark.parametrize("clip", [None, 0.2])
@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean"])
def test_value_loss_matches_loop(clip, agg):
    g = torch.Generator().manual_seed(10)
    n = 40
    old_v = torch.randn(n, generator=g, dtype=F64)
    values = (old_v + 0.4 * torch.randn(n, generator=g, dtype=F64)).requires_grad_(True)
    returns = torch.randn(n, generator=g, dtype=F64)
    mask = (torch.rand(n, generator=g) < 0.7).long()
    seg = torch.sort(torch.randint(0, 5, (n,), generator=g)).values
    returns[mask == 0] = torch.nan
    loss, metrics = value_loss(values, old_v, returns, mask, clip=clip, agg=agg, seg_ids=seg)
    vals, clipped = [], []
    for i in range(n):
        if not mask[i]:
            vals.append(0.0)
            continue
        v, o, R = values[i], old_v[i].item(), returns[i].item()
        err = (v - R) ** 2
        if clip is not None:
            v_c = o + ref_clip(v - o, -clip, clip)
            clipped.append(num((v_c - R) ** 2) > num(err))
            err = max(err, (v_c - R) ** 2)
        vals.append(0.5 * err)
    ref = values.sum() * 0 + ref_aggregate(vals, mask.tolist(), seg.tolist(), agg)
    close(loss, ref)
    close(grad_of(loss, values), grad_of(ref, values))
    kept = [values[i].item() for i in range(n) if mask[i]]
    close(metrics["value_mean"], sum(kept) / len(kept))
    close(metrics["explained_variance"],
          ref_explained_variance(values.tolist(), returns.tolist(), mask.tolist()))
    if clip is not None:
        assert 0 < sum(clipped) < len(clipped)
        close(metrics["value_clip_frac"], sum(clipped) / len(clipped))


def test_explained_variance_edges():
    t = torch.tensor([0.1, 0.1, 0.1, 5.0], dtype=F64)
    mask = torch.tensor([1, 1, 1, 0])
    assert explained_variance(torch.zeros(4, dtype=F64), t, mask).item() == 0.0  # constant target
    assert explained_variance(t, t, torch.zeros(4)).item() == 0.0  # empty mask
    assert explained_variance(t, t, torch.ones(4)).item() == 1.0  # perfect critic
    g = torch.Generator().manual_seed(11)
    p, y = torch.randn(20, generator=g, dtype=F64), torch.randn(20, generator=g, dtype=F64)
    m = (torch.rand(20, generator=g) < 0.5).long()
    close(explained_variance(p, y, m), ref_explained_variance(p.tolist(), y.tolist(), m.tolist()))


def test_entropy_bonus_is_the_aggregate():
    g = torch.Generator().manual_seed(12)
    ent = torch.rand(20, generator=g, dtype=F64)
    mask = (torch.rand(20, generator=g) < 0.5).long()
    seg = torch.sort(torch.randint(0, 4, (20,), generator=g)).values
    for mode in MODES:
        close(entropy_bonus(ent, mask, seg_ids=seg, agg=mode),
              ref_aggregate(ent.tolist(), mask.tolist(), seg.tolist(), mode))


# ---------------------------------------------------------------- KL


def ref_kl(lp, rl, kind):
    d = rl - lp
    if kind == "k1":
        return -d
    if kind == "k2":
        return 0.5 * d * d
    if kind == "k3":
        return math.expm1(d) - d
    return min(math.expm1(d) - d, 10.0)  # k3_clamped


@pytest.mark.parametrize("kind", ["k1", "k2", "k3", "k3_clamped"])
def test_kl_penalty_matches_loop(kind):
    g = torch.Generator().manual_seed(13)
    logp = -torch.rand(30, generator=g, dtype=F64) * 4
    ref = logp + torch.randn(30, generator=g, dtype=F64)
    ref[0] = -1000.0  # the reference finds this token impossible
    ref[1] = logp[1] + 40.0
    out = kl_penalty(logp, ref, kind)
    close(out, [ref_kl(a, b, kind) for a, b in zip(logp.tolist(), ref.tolist())])
    assert torch.all(torch.isfinite(out))


def test_kl_penalty_gradients():
    # k2 differentiates to (logp - ref); k3 to 1 - exp(ref - logp): checked against those closed forms.
    logp = torch.tensor([-1.0, -2.0, -0.3], dtype=F64, requires_grad=True)
    ref = torch.tensor([-1.5, -1.0, -0.3], dtype=F64)
    close(grad_of(kl_penalty(logp, ref, "k2").sum(), logp), (logp - ref).detach())
    close(grad_of(kl_penalty(logp, ref, "k3").sum(), logp), (1 - torch.exp(ref - logp)).detach())


def test_k3_is_unbiased_and_exact_k3_clamped_is_not():
    """E_pi[k3] = KL(pi || ref) exactly (sum over the support, float64), also far from ref; k3 at logp = -5,
    ref = 0 is e^5 - 6 with gradient 1 - e^5. k3_clamped is min(k3, 10): its expectation falls short."""
    pi = torch.tensor([0.9, 0.07, 0.03], dtype=F64)
    ref = torch.tensor([0.05, 0.05, 0.9], dtype=F64)
    kl = float((pi * (pi.log() - ref.log())).sum())
    assert kl == pytest.approx(2.5228517172, rel=1e-10)
    assert float((pi * kl_penalty(pi.log(), ref.log(), "k3")).sum()) == pytest.approx(kl, rel=1e-14)
    clamped = float((pi * kl_penalty(pi.log(), ref.log(), "k3_clamped")).sum())
    assert clamped == pytest.approx(2.0548876387, rel=1e-10) and clamped < kl
    logp = torch.tensor([-5.0], dtype=F64, requires_grad=True)
    k3 = kl_penalty(logp, torch.zeros(1, dtype=F64), "k3")
    close(k3, [math.exp(5) - 6])
    close(grad_of(k3.sum(), logp), [1 - math.exp(5)])
    logp = torch.tensor([-5.0], dtype=F64, requires_grad=True)
    k3c = kl_penalty(logp, torch.zeros(1, dtype=F64), "k3_clamped")
    close(k3c, [10.0])
    close(grad_of(k3c.sum(), logp), [0.0])
    # near d = 0, where exp(d) - 1 - d cancels: k3 keeps its relative precision (d^2 / 2 + d^3 / 6 ...)
    for d in (1e-9, -1e-6, 3e-4, -9e-4):
        got = float(kl_penalty(torch.zeros(1, dtype=F64), torch.tensor([d], dtype=F64), "k3"))
        assert got == pytest.approx(d * d / 2 + d ** 3 / 6 + d ** 4 / 24, rel=1e-13)


def test_kl_reward_penalty_matches_loop():
    g = torch.Generator().manual_seed(14)
    rewards = torch.randn(3, 6, generator=g, dtype=F64)
    logp = -torch.rand(3, 6, generator=g, dtype=F64)
    ref = -torch.rand(3, 6, generator=g, dtype=F64)
    mask = (torch.rand(3, 6, generator=g) < 0.6).long()
    logp[mask == 0] = torch.nan  # garbage on non-sampled positions
    new, kl = kl_reward_penalty(rewards, logp, ref, mask, coef=0.1, kind="k3")
    for b in range(3):
        for t in range(6):
            k = ref_kl(logp[b, t].item(), ref[b, t].item(), "k3") if mask[b, t] else 0.0
            close(kl[b, t], k)
            close(new[b, t], rewards[b, t].item() - 0.1 * k)
    with pytest.raises(ValueError, match="kind"):
        kl_penalty(logp, ref, "k4")
    with pytest.raises(ValueError, match="coef"):
        kl_reward_penalty(rewards, logp, ref, mask, coef=-1.0)


# ---------------------------------------------------------------- segments across micro-batches
@pytest.mark.parametrize("mode", ["seq_mean_token_sum", "seq_mean_token_mean", "step_mean"])
def test_aggregate_with_segment_sizes_sums_micro_batches_to_the_whole(mode):
    """A segment cut in two micro-batches: with seg_sizes (its tokens over the whole batch) and the global
    segment count as norm, the two partial losses add up to the whole batch's loss (bug B)."""
    g = torch.Generator().manual_seed(4)
    n = 30
    loss = torch.randn(n, generator=g, dtype=F64)
    seg = torch.sort(torch.randint(0, 5, (n,), generator=g)).values
    mask = (torch.rand(n, generator=g) < 0.8).to(F64)
    sizes = torch.bincount(seg[mask > 0], minlength=5).to(F64)
    norm = float((sizes > 0).sum())
    whole = aggregate(loss, mask, seg, mode, norm=norm)
    cut = n // 2 + 1  # inside a segment
    parts = sum(aggregate(loss[s], mask[s], seg[s], mode, norm=norm, seg_sizes=sizes)
                for s in (slice(0, cut), slice(cut, n)))
    close(parts, whole)
    close(whole, ref_aggregate(loss.tolist(), mask.tolist(), seg.tolist(), mode))


def test_step_ratio_with_trajectory_aggregation_matches_loop():
    """ratio_seg_ids (steps) and seg_ids (trajectories) differ: the GSPO ratio per step, the mean per trajectory
    (bug A carried both). Reference: the paper's ratio per step, token losses averaged per trajectory."""
    logp, old, adv, mask, step = batch(6, seg_constant_adv=True)
    traj = step // 3  # trajectories of up to 3 steps
    loss, _ = ppo_policy_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.28, ratio_level="step",
                              ratio_seg_ids=step, seg_ids=traj, agg="seq_mean_token_mean")
    members = {}
    for i in range(len(old)):
        if mask[i]:
            members.setdefault(int(step[i]), []).append(i)
    per_token = {}
    for idx in members.values():
        s = torch.exp(sum((logp[i] - old[i] for i in idx), 0.0) / len(idx))
        for i in idx:
            per_token[i] = torch.maximum(-adv[i] * s, -adv[i] * s.clamp(0.8, 1.28))
    by_traj = {}
    for i, v in per_token.items():
        by_traj.setdefault(int(traj[i]), []).append(v)
    want = sum(sum(v) / len(v) for v in by_traj.values()) / len(by_traj)
    close(loss, want)
    close(grad_of(loss, logp), grad_of(want, logp))
