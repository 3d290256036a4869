"""kernels/logprob.py: the chunked logprob+entropy against the naive reference.

CPU tests cover the torch path (values, gradients wrt hidden and weight with
random upstream gradients on both outputs, fp32 and fp64, odd chunk sizes,
temperature, edge sizes, errors). The Triton kernels are tested on CUDA (marked
`gpu`), or on CPU under TRITON_INTERPRET=1 where triton is installed.
"""
import os
import subprocess
import sys

import pytest
import torch

from kernels.logprob import (chunk_dlogits_, chunk_stats_, logprob_entropy,
                             logprob_entropy_reference, triton_logprob)


def make(n, h, v, dtype=torch.float32, device="cpu", scale=1.0, seed=0):
    """Random leaf hidden [n, h], weight [v, h], targets [n]; scale widens the logits."""
    g = torch.Generator().manual_seed(seed)
    hidden = (torch.randn(n, h, generator=g, dtype=torch.float64) * scale).to(device, dtype).requires_grad_()
    weight = (torch.randn(v, h, generator=g, dtype=torch.float64) / h**0.5).to(device, dtype).requires_grad_()
    targets = torch.randint(0, v, (n,), generator=g).to(device)
    return hidden, weight, targets


def values_and_grads(fn, hidden, weight, targets, seed=1, **kw):
    """(logp, entropy, d hidden, d weight) for loss = sum(a * logp + b * entropy), a, b random."""
    logp, ent = fn(hidden, weight, targets, **kw)
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(logp.shape, generator=g, dtype=torch.float64).to(logp)
    b = torch.randn(logp.shape, generator=g, dtype=torch.float64).to(logp)
    dh, dw = torch.autograd.grad((a * logp + b * ent).sum(), (hidden, weight))
    return logp.detach(), ent.detach(), dh, dw


def assert_close(got, want, tol):
    for x, y, name in zip(got, want, ("logp", "entropy", "grad_hidden", "grad_weight")):
        assert x.dtype == y.dtype and x.shape == y.shape, name
        if x.numel() == 0:
            continue
        diff = (x.double() - y.double()).abs()
        err, i = diff.max().item(), diff.argmax().item()
        assert err <= tol, (f"{name}: max abs error {err:.3g} > {tol:.1g} at flat index {i}: "
                            f"{x.flatten()[i].item()!r} vs {y.flatten()[i].item()!r}")


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float64, 1e-12)])
@pytest.mark.parametrize("n,chunk", [(37, 8), (37, 37), (37, 100), (1, 4096), (16, 1)])
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_matches_reference(dtype, tol, n, chunk, temperature):
    hidden, weight, targets = make(n, 24, 61, dtype)
    want = values_and_grads(logprob_entropy_reference, hidden, weight, targets, temperature=temperature)
    got = values_and_grads(logprob_entropy, hidden, weight, targets, temperature=temperature, chunk_size=chunk)
    assert got[0].dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    assert_close(got, want, tol)


def test_peaked_logits_are_stable():
    # Logits spanning hundreds of nats: near one-hot rows, whose entropy must stay >= 0 and exact.
    hidden, weight, targets = make(20, 16, 50, torch.float32, scale=60.0)
    hidden64, weight64 = (t.detach().double().requires_grad_() for t in (hidden, weight))
    want = values_and_grads(logprob_entropy_reference, hidden64, weight64, targets)
    got = values_and_grads(logprob_entropy, hidden, weight, targets, chunk_size=7)
    assert (got[1] >= 0).all() and want[1].min() < 1e-3  # some rows really are near one-hot
    for x, y, name in zip(got, want, ("logp", "entropy", "grad_hidden", "grad_weight")):
        assert torch.isfinite(x).all(), name
        rel = (x.double() - y).abs().max().item() / y.abs().max().item()
        assert rel < 1e-5, f"{name}: error {rel:.3g} of the largest entry"


def test_gradcheck_float64():
    hidden, weight, targets = make(5, 4, 7, torch.float64)

    def f(h, w):
        logp, ent = logprob_entropy(h, w, targets, temperature=1.7, chunk_size=2)
        return logp, ent

    assert torch.autograd.gradcheck(f, (hidden, weight))


def test_logp_only_and_entropy_only_gradients():
    hidden, weight, targets = make(13, 8, 29, torch.float64)
    logp_ref, ent_ref = logprob_entropy_reference(hidden, weight, targets, 0.8)
    logp, ent = logprob_entropy(hidden, weight, targets, 0.8, chunk_size=5, with_entropy=False)
    assert ent is None
    want = torch.autograd.grad(logp_ref.sum(), (hidden, weight), retain_graph=True)
    got = torch.autograd.grad(logp.sum(), (hidden, weight))
    for x, y in zip(got, want):
        torch.testing.assert_close(x, y, rtol=0, atol=1e-12)
    # Entropy bonus alone: logp is returned but takes no part in the loss.
    _, ent = logprob_entropy(hidden, weight, targets, 0.8, chunk_size=5)
    want = torch.autograd.grad(ent_ref.sum(), (hidden, weight))
    got = torch.autograd.grad(ent.sum(), (hidden, weight))
    for x, y in zip(got, want):
        torch.testing.assert_close(x, y, rtol=0, atol=1e-12)


def test_frozen_weight_gets_no_gradient():
    hidden, weight, targets = make(9, 8, 17)
    weight.requires_grad_(False)
    logp, ent = logprob_entropy(hidden, weight, targets, chunk_size=4)
    (logp.sum() + ent.sum()).backward()
    assert weight.grad is None
    ref_h = hidden.detach().clone().requires_grad_()
    logp_r, ent_r = logprob_entropy_reference(ref_h, weight, targets)
    (logp_r.sum() + ent_r.sum()).backward()
    torch.testing.assert_close(hidden.grad, ref_h.grad, rtol=0, atol=1e-5)


def test_empty_batch():
    hidden, weight, targets = make(0, 8, 11)
    logp, ent = logprob_entropy(hidden, weight, targets)
    assert logp.shape == (0,) and ent.shape == (0,)
    (logp.sum() + ent.sum()).backward()
    assert hidden.grad.shape == (0, 8)
    assert weight.grad.shape == (11, 8) and not weight.grad.any()


def test_reference_agrees_with_categorical():
    hidden, weight, targets = make(6, 5, 9, torch.float64)
    logp, ent = logprob_entropy_reference(hidden, weight, targets, 1.3)
    dist = torch.distributions.Categorical(logits=(hidden @ weight.t()) / 1.3)
    torch.testing.assert_close(logp, dist.log_prob(targets))
    torch.testing.assert_close(ent, dist.entropy())


@pytest.mark.parametrize("kwargs,culprit", [
    (dict(targets=torch.tensor([0, 11, 2])), "targets must lie in"),
    (dict(targets=torch.tensor([0, -1, 2])), "targets must lie in"),
    (dict(targets=torch.tensor([0, 1])), "targets must be int64"),
    (dict(targets=torch.tensor([0.0, 1.0, 2.0])), "targets must be int64"),
    (dict(temperature=0.0), "temperature"),
    (dict(temperature=-1.0), "temperature"),
    (dict(temperature=float("nan")), "temperature"),
    (dict(chunk_size=0), "chunk_size"),
    (dict(hidden=torch.randn(3, 7)), "weight must be"),
    (dict(hidden=torch.randn(1, 3, 8)), "hidden must be"),
    (dict(weight=torch.randn(11, 8, dtype=torch.float64)), "share a float dtype"),
])
def test_bad_input_names_the_culprit(kwargs, culprit):
    args = dict(hidden=torch.randn(3, 8), weight=torch.randn(11, 8), targets=torch.tensor([0, 1, 2]))
    args.update(kwargs)
    with pytest.raises(ValueError, match=culprit):
        logprob_entropy(**args)


def test_use_triton_without_cuda_is_an_error():
    hidden, weight, targets = make(3, 8, 11)
    with pytest.raises(ValueError, match="use_triton=True"):
        logprob_entropy(hidden, weight, targets, use_triton=True)


# ---- Triton: the chunk kernels against their torch twins ------------------------------------

def check_triton_chunks(device, dtype, tol):
    """Compare triton_logprob.chunk_* with kernels.logprob.chunk_* on one chunk."""
    g = torch.Generator().manual_seed(0)
    c, v = 19, 5003  # V not a multiple of the block, several blocks per row
    logits = (torch.randn(c, v, generator=g) * 4).to(device, dtype)
    targets = torch.randint(0, v, (c,), generator=g).to(device)
    for t in (1.0, 0.7):
        want = chunk_stats_(logits.clone(), targets, t, True)
        got = triton_logprob.chunk_stats_(logits.clone(), targets, t, True)
        for x, y in zip(got, want):
            assert (x - y).abs().max().item() <= tol
        lse, _, ent = want
        g_logp, g_ent = torch.randn(c, generator=g).to(device), torch.randn(c, generator=g).to(device)
        for gl, ge in ((g_logp, g_ent), (g_logp, None), (None, g_ent)):
            want_d = chunk_dlogits_(logits.clone(), targets, lse, ent, gl, ge, t).float()
            got_d = triton_logprob.chunk_dlogits_(logits.clone(), targets, lse, ent, gl, ge, t).float()
            scale = want_d.abs().max().item()
            assert (got_d - want_d).abs().max().item() <= tol * max(scale, 1.0)


triton_cpu_reason = "triton is not importable in this torch build (CPU wheel); the kernels run on CUDA"


@pytest.mark.skipif(triton_logprob is None, reason=triton_cpu_reason)
def test_triton_kernels_interpreted_on_cpu():
    # The interpreter flag is read at import, so run in a fresh process.
    code = ("import torch, tests.test_logprob as t; t.check_triton_chunks('cpu', torch.float32, 1e-5)")
    env = dict(os.environ, TRITON_INTERPRET="1")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.gpu
@pytest.mark.skipif(triton_logprob is None, reason="needs triton")
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 1e-4)])
def test_triton_chunks_cuda(dtype, tol):
    # Same bf16 input to both sides: only the fp32 arithmetic differs, hence the tight tolerance.
    check_triton_chunks("cuda", dtype, tol)


@pytest.mark.gpu
@pytest.mark.parametrize("use_triton", [False, True])
def test_cuda_fp32_matches_reference(use_triton):
    if use_triton and triton_logprob is None:
        pytest.skip("needs triton")
    torch.backends.cuda.matmul.allow_tf32 = False
    hidden, weight, targets = make(300, 64, 1000, torch.float32, device="cuda")
    want = values_and_grads(logprob_entropy_reference, hidden, weight, targets, temperature=0.9)
    got = values_and_grads(logprob_entropy, hidden, weight, targets, temperature=0.9, chunk_size=128,
                           use_triton=use_triton)
    assert_close(got, want, 1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("use_triton", [False, True])
def test_cuda_bf16_matches_reference(use_triton):
    if use_triton and triton_logprob is None:
        pytest.skip("needs triton")
    hidden, weight, targets = make(1000, 256, 8000, torch.bfloat16, device="cuda", scale=3.0)
    want = values_and_grads(logprob_entropy_reference, hidden, weight, targets, temperature=0.9)
    got = values_and_grads(logprob_entropy, hidden, weight, targets, temperature=0.9, chunk_size=384,
                           use_triton=use_triton)
    # Same bf16 logits on both sides, so logp/entropy agree to fp32 rounding; the gradients go
    # through bf16 dlogits and bf16 GEMMs in both, so compare them relative to their size.
    assert_close(got[:2], want[:2], 1e-3)
    for name, x, y in (("grad_hidden", got[2], want[2]), ("grad_weight", got[3], want[3])):
        rel = ((x.float() - y.float()).norm() / y.float().norm()).item()
        assert rel < 2e-2, f"{name}: relative error {rel:.3g}"


@pytest.mark.gpu
@pytest.mark.skipif(triton_logprob is None, reason="needs triton")
def test_cuda_triton_logp_only():
    torch.backends.cuda.matmul.allow_tf32 = False
    hidden, weight, targets = make(200, 32, 777, torch.float32, device="cuda")
    logp_ref, _ = logprob_entropy_reference(hidden, weight, targets, 1.5)
    logp, ent = logprob_entropy(hidden, weight, targets, 1.5, chunk_size=64, with_entropy=False,
                                use_triton=True)
    assert ent is None
    torch.testing.assert_close(logp, logp_ref, rtol=0, atol=1e-5)
    want = torch.autograd.grad(logp_ref.sum(), (hidden, weight))
    got = torch.autograd.grad(logp.sum(), (hidden, weight))
    for x, y in zip(got, want):
        torch.testing.assert_close(x, y, rtol=0, atol=1e-5)


@pytest.mark.gpu
def test_cuda_fused_peak_memory_is_chunk_sized():
    # Naive fp32 logits here are 4096 x 32000 x 4 B = 0.5 GB, and autograd keeps several.
    hidden, weight, targets = make(4096, 512, 32000, torch.bfloat16, device="cuda")

    def peak(fn, **kw):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        logp, ent = fn(hidden, weight, targets, **kw)
        (logp.sum() + ent.sum()).backward()
        hidden.grad = weight.grad = None
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base

    naive = peak(logprob_entropy_reference)
    fused = peak(logprob_entropy, chunk_size=512)
    full_fp32_logits = 4096 * 32000 * 4
    assert fused < full_fp32_logits / 2 < naive, (fused, naive)
