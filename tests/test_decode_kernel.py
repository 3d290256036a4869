"""kernels/triton_decode.py: the Triton decode kernel against a float64 loop and the SDPA path.

The kernel runs on CPU under TRITON_INTERPRET=1 where triton is importable
(in a fresh process: the flag is read when the kernel module is imported),
and on CUDA (marked `gpu`). Cases: GQA ratios 1, 3 (SmolLM2 9/3, D=64),
8 (Qwen2.5-3B 16/2, D=128) and 7 (Qwen 28/4); kv_lens of 1, BLOCK_N - 1,
BLOCK_N, BLOCK_N + 1 and the full L; slots in any order with a repeated
scratch slot (the generator's CUDA-graph padding); one and several KV splits.
"""
import os
import subprocess
import sys

import pytest
import torch

from kernels import attention as A
from kernels.attention import triton_decode

SHAPES = [(4, 4, 64), (9, 3, 64), (16, 2, 128), (28, 4, 128)]  # (Hq, Hkv, D): GQA ratios 1, 3, 8, 7
SCRATCH = 0


def make_case(hq, hkv, d, block_n, dtype=torch.float32, device="cpu", seed=0):
    """Cache [S, L, Hkv, D] with L = 2 * block_n + 7, rows hitting every edge length -> (q, kc, vc, rows, lens)."""
    g = torch.Generator().manual_seed(seed)
    S, L = 7, 2 * block_n + 7
    lens = [1, block_n - 1, block_n, block_n + 1, L, 1, 1, 37, L - 1]
    rows = [5, 2, 6, 1, 3, SCRATCH, SCRATCH, 4, 2]  # any order; scratch repeated; slot 2 read twice
    kc, vc = (torch.randn(S, L, hkv, d, generator=g).to(device, dtype) for _ in range(2))
    q = torch.randn(len(rows), hq, d, generator=g).to(device, dtype)
    return (q, kc, vc, torch.tensor(rows, device=device),
            torch.tensor(lens, dtype=torch.int32, device=device))


def reference(q, kc, vc, rows, lens):
    """softmax(q k^T / sqrt(D)) v per row over its first kv_len keys, GQA by repetition, float64."""
    B, hq, d = q.shape
    rep = hq // kc.shape[2]
    out = torch.empty(B, hq, d, dtype=torch.float64)
    for b, (slot, n) in enumerate(zip(rows.tolist(), lens.tolist())):
        k = kc[slot, :n].double().cpu().repeat_interleave(rep, 1)  # [n, Hq, D]
        v = vc[slot, :n].double().cpu().repeat_interleave(rep, 1)
        att = torch.einsum("hd,nhd->hn", q[b].double().cpu(), k) / d**0.5
        out[b] = torch.einsum("hn,nhd->hd", att.softmax(-1), v)
    return out


def check_kernel(device, dtype, tol, block_n=64):
    """decode_attention against `reference` for every shape, with 1 and 3 KV splits."""
    for hq, hkv, d in SHAPES:
        q, kc, vc, rows, lens = make_case(hq, hkv, d, block_n, dtype, device)
        want = reference(q, kc, vc, rows, lens)
        for splits in (1, 3):
            got = triton_decode.decode_attention(q, kc, vc, rows, lens, splits=splits, block_n=block_n)
            assert got.dtype == q.dtype and got.shape == q.shape
            err = (got.double().cpu() - want).abs()
            b, rest = divmod(err.argmax().item(), hq * d)
            h = rest // d
            assert err.max().item() <= tol, (
                f"Hq={hq} Hkv={hkv} D={d} splits={splits}: max error {err.max().item():.3g} > {tol} "
                f"at row {b} (slot {rows[b].item()}, kv_len {lens[b].item()}), head {h}")


def check_edges(device, dtype):
    """kv_len 0 gives zeros; kv_len > L reads only the L positions of the slot."""
    q, kc, vc, rows, _ = make_case(16, 2, 128, 16, dtype, device)
    L = kc.shape[1]
    for splits in (1, 3):
        got = triton_decode.decode_attention(q[:3], kc, vc, rows[:3], torch.tensor([0, L + 50, L], dtype=torch.int32,
                                             device=device), splits=splits, block_n=16)
        assert not got[0].any()
        full = triton_decode.decode_attention(q[1:2], kc, vc, rows[1:2], torch.tensor([L], dtype=torch.int32,
                                              device=device), splits=splits, block_n=16)
        assert torch.equal(got[1], full[0])


def check_dispatch(device, dtype, tol):
    """cache_attention(backend='triton') equals the math path on decode steps and leaves chunks to it."""
    q, kc, vc, rows, lens = make_case(9, 3, 64, 64, dtype, device)
    B = rows.shape[0]
    cu = torch.arange(B + 1, dtype=torch.int32, device=device)
    got = A.cache_attention(q, kc, vc, cu, 1, rows, lens, backend="triton")
    want = A.cache_attention(q, kc, vc, cu, 1, rows, lens, backend="math")
    assert (got.double() - want.double()).abs().max().item() <= tol
    # A 2-token chunk per row is not a decode step: the math path takes it.
    q2 = torch.cat([q, q])
    lens2 = lens.clamp(min=2)
    cu2 = torch.arange(0, 2 * B + 1, 2, dtype=torch.int32, device=device)
    got = A.cache_attention(q2, kc, vc, cu2, 2, rows, lens2, backend="triton")
    assert torch.equal(got, A.cache_attention(q2, kc, vc, cu2, 2, rows, lens2, backend="math"))


# ---- CPU: the interpreter ---------------------------------------------------------------

def run_interpreted(code):
    env = dict(os.environ, TRITON_INTERPRET="1")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, "-c", "import torch, tests.test_decode_kernel as t; " + code],
                          cwd=root, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]


no_triton = "triton is not importable in this torch build (CPU wheel); the kernel runs on CUDA"


@pytest.mark.skipif(triton_decode is None, reason=no_triton)
@pytest.mark.parametrize("dtype,tol,block_n", [("float32", 1e-5, 64), ("float16", 2e-3, 16)])
def test_kernel_interpreted_on_cpu(dtype, tol, block_n):
    # Not bf16: triton 3.6's interpreter computes tl.dot of bf16 tiles wrongly (the GPU tests cover bf16).
    run_interpreted(f"t.check_kernel('cpu', torch.{dtype}, {tol}, block_n={block_n})")


@pytest.mark.skipif(triton_decode is None, reason=no_triton)
def test_edges_and_dispatch_interpreted_on_cpu():
    run_interpreted("t.check_edges('cpu', torch.float32); t.check_dispatch('cpu', torch.float32, 1e-5)")


def test_reference_matches_sdpa_decode():
    # The float64 loop above against the repo's own batched SDPA decode path.
    q, kc, vc, rows, lens = make_case(28, 4, 128, 16)
    got = A._sdpa_decode(q, kc[rows], vc[rows], lens)
    assert (got.double() - reference(q, kc, vc, rows, lens)).abs().max().item() < 1e-5


# ---- CUDA ---------------------------------------------------------------------------------

needs_triton = pytest.mark.skipif(triton_decode is None, reason="needs triton")


@pytest.mark.gpu
@needs_triton
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2), (torch.float16, 5e-3)])
@pytest.mark.parametrize("block_n", [16, 64])
def test_kernel_cuda(dtype, tol, block_n):
    check_kernel("cuda", dtype, tol, block_n)


@pytest.mark.gpu
@needs_triton
def test_edges_and_dispatch_cuda():
    check_edges("cuda", torch.bfloat16)
    check_dispatch("cuda", torch.bfloat16, 2e-2)


def rollout_case(B, hq=16, hkv=2, d=128, L=512, seed=0):
    """bf16 q [B, Hq, D] and a cache of B + 1 slots; rows a permutation, the tail on the scratch slot."""
    g = torch.Generator().manual_seed(seed)
    kc, vc = (torch.randn(B + 1, L, hkv, d, generator=g).to("cuda", torch.bfloat16) for _ in range(2))
    q = torch.randn(B, hq, d, generator=g).to("cuda", torch.bfloat16)
    rows = torch.randperm(B + 1, generator=g)[:B]
    lens = torch.randint(1, L + 1, (B,), generator=g, dtype=torch.int32)
    rows[-B // 4:], lens[-B // 4:] = SCRATCH, 1  # padding rows
    return q, kc, vc, rows.cuda(), lens.cuda()


@pytest.mark.gpu
@needs_triton
@pytest.mark.parametrize("B", [4, 256])  # few rows: several KV splits; many: one
def test_cache_attention_matches_old_sdpa_path(B, monkeypatch):
    q, kc, vc, rows, lens = rollout_case(B)
    cu = torch.arange(B + 1, dtype=torch.int32, device="cuda")
    old = A._sdpa_decode(q, kc[rows], vc[rows], lens)
    got = A.cache_attention(q, kc, vc, cu, 1, rows, lens, backend="triton")
    assert (got.float() - old.float()).abs().max().item() < 2e-2
    monkeypatch.setattr("kernels.attention.PATHS.attention", "")
    if A.pick_backend(q) in ("torch_flash", "fa4") and not A.PAGED and not A.fa4_reads_cache():
        # The machine this was written for (torch 2.11, no flash_attn): the default takes the kernel.
        assert torch.equal(A.cache_attention(q, kc, vc, cu, 1, rows, lens), got)
    monkeypatch.setattr("kernels.attention.PATHS.attention", "sdpa")  # the switch back to the old path
    assert torch.equal(A.cache_attention(q, kc, vc, cu, 1, rows, lens), old)


@pytest.mark.gpu
@needs_triton
@pytest.mark.parametrize("B", [4, 256])
def test_cuda_graph_replay_with_new_lengths(B):
    q, kc, vc, rows, lens = rollout_case(B, hq=9, hkv=3, d=64, L=1024)
    cu = torch.arange(B + 1, dtype=torch.int32, device="cuda")

    def run():
        return A.cache_attention(q, kc, vc, cu, 1, rows, lens, backend="triton")

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        run()  # compile outside the capture
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()
    for seed in (1, 2):
        q2, kc2, vc2, rows2, lens2 = rollout_case(B, hq=9, hkv=3, d=64, L=1024, seed=seed)
        for buf, new in ((q, q2), (kc, kc2), (vc, vc2), (rows, rows2), (lens, lens2)):
            buf.copy_(new)
        graph.replay()
        want = A._sdpa_decode(q2, kc2[rows2], vc2[rows2], lens2)
        assert (out.float() - want.float()).abs().max().item() < 2e-2, f"replay {seed}"
