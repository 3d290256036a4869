"""kernels/triton_chunk.py: chunks of new queries over the KV cache, against the per-row math path.

The kernel runs on CPU under TRITON_INTERPRET=1 where triton is importable (in a
fresh process: the flag is read when the kernel module is imported), and on CUDA
(marked `gpu`). Cases: GQA ratios 1, 3 (SmolLM2 9/3, D=64) and 8 (Qwen2.5-3B
16/2, D=128); chunks of 1 token, of BLOCK_M - 1, BLOCK_M and BLOCK_M + 1 tokens,
one that fills its row from position 0, rows with no new token; kv_len
crossing BLOCK_N; slots in any order, one slot read twice. by_row_attention (decode
and chunk kernels on one packed batch, a mixed step) against the same reference.
"""
import os
import subprocess
import sys

import pytest
import torch

from kernels import attention as A
from kernels.attention import triton_decode

SHAPES = [(4, 4, 64), (9, 3, 64), (16, 2, 128)]


def make_case(hq, hkv, d, dtype=torch.float32, device="cpu", seed=0):
    """-> (q, k_cache, v_cache, cu_q, max_q, rows, kv_lens) with every edge above."""
    g = torch.Generator().manual_seed(seed)
    S, L = 6, 150
    news = [1, 15, 16, 17, 40, 0, 3]  # new tokens per row (0: a row with nothing new)
    lens = [70, 15, 100, 64, 40, 9, 140]  # the 40-token row fills its row from position 0
    rows = [4, 1, 0, 5, 2, 3, 4]
    kc, vc = (torch.randn(S, L, hkv, d, generator=g).to(device, dtype) for _ in range(2))
    q = torch.randn(sum(news), hq, d, generator=g).to(device, dtype)
    cu = torch.tensor([0] + list(torch.tensor(news).cumsum(0).tolist()), dtype=torch.int32, device=device)
    return (q, kc, vc, cu, max(news), torch.tensor(rows, device=device),
            torch.tensor(lens, dtype=torch.int32, device=device))


def check_kernel(device, dtype, tol):
    from kernels import triton_chunk

    for hq, hkv, d in SHAPES:
        q, kc, vc, cu, max_q, rows, lens = make_case(hq, hkv, d, dtype, device)
        want = A.cache_attention(q.double(), kc.double(), vc.double(), cu, max_q, rows, lens, backend="math")
        for block_m in (16, 4):
            got = triton_chunk.chunk_attention(q, kc, vc, cu, max_q, rows, lens, block_m=block_m, block_n=32)
            assert got.dtype == q.dtype and got.shape == q.shape
            err = (got.double().cpu() - want.cpu()).abs().max().item()
            assert err <= tol, f"Hq={hq} Hkv={hkv} D={d} block_m={block_m}: max error {err:.3g} > {tol}"


def check_dispatch(device, dtype, tol):
    """cache_attention sends chunks to the kernel on CUDA (bf16/fp16) unless kernels.chunks says otherwise."""
    q, kc, vc, cu, max_q, rows, lens = make_case(9, 3, 64, dtype, device)
    want = A.cache_attention(q, kc, vc, cu, max_q, rows, lens, backend="math")
    got = A.cache_attention(q, kc, vc, cu, max_q, rows, lens, backend="triton_chunk")
    assert (got.double() - want.double()).abs().max().item() <= tol


def check_by_row(device, dtype, tol):
    """by_row_attention (a mixed step: decode rows and chunks in one forward): rows of one query through the
    decode kernel, the others through the chunk kernel's block map; every query as the per-row math path."""
    g = torch.Generator().manual_seed(1)
    for hq, hkv, d in SHAPES:
        for news, lens in (([1, 1, 1, 20, 1, 33, 0, 2], [9, 150, 64, 80, 1, 40, 7, 2]),
                           ([1, 15, 16, 17, 40, 0, 3], [70, 15, 100, 64, 40, 9, 140])):
            B, S, L = len(news), 9, 150
            kc, vc = (torch.randn(S, L, hkv, d, generator=g).to(device, dtype) for _ in range(2))
            q = torch.randn(sum(news), hq, d, generator=g).to(device, dtype)
            cu = torch.tensor([0] + list(torch.tensor(news).cumsum(0).tolist()), dtype=torch.int32, device=device)
            rows = torch.tensor([(3 * b + 1) % S for b in range(B)], device=device)
            lens_t = torch.tensor(lens, dtype=torch.int32, device=device)
            want = A.cache_attention(q.double(), kc.double(), vc.double(), cu, max(news), rows, lens_t, backend="math")
            blocks = A.block_map(cu, q.shape[0] // 16 + B)
            got = A.by_row_attention(q, kc, vc, cu, rows, lens_t, blocks)
            err = (got.double().cpu() - want.cpu()).abs().max().item()
            assert err <= tol, f"Hq={hq} Hkv={hkv} D={d} rows {news}: max error {err:.3g} > {tol}"
            got = A.cache_attention(q, kc, vc, cu, max(news), rows, lens_t, backend="triton_chunk", blocks=blocks)
            assert (got.double().cpu() - want.cpu()).abs().max().item() <= tol


def test_block_map_lists_every_block_of_rows_with_more_than_one_query():
    cu = torch.tensor([0, 1, 21, 21, 22, 55, 57], dtype=torch.int32)  # rows of 1, 20, 0, 1, 33, 2 queries
    row, mb = A.block_map(cu, 30)
    live = [(int(r), int(m)) for r, m in zip(row, mb) if r >= 0]
    assert live == [(1, 0), (1, 1), (4, 0), (4, 1), (4, 2), (5, 0)]
    assert row.dtype == mb.dtype == torch.int32 and row.tolist()[6:] == [-1] * 24
    assert A.block_map(cu, 6)[0].tolist() == [1, 1, 4, 4, 4, 5]  # the exact count
    assert A.block_map(torch.tensor([0, 1, 2], dtype=torch.int32), 4)[0].tolist() == [-1] * 4  # decode rows only


def run_interpreted(code):
    env = dict(os.environ, TRITON_INTERPRET="1")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, "-c", "import torch, tests.test_chunk_kernel as t; " + code],
                          cwd=root, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]


no_triton = "triton is not importable in this torch build (CPU wheel); the kernel runs on CUDA"


@pytest.mark.skipif(triton_decode is None, reason=no_triton)
def test_kernel_interpreted_on_cpu():
    # fp32 and fp16 only: triton 3.6's interpreter computes tl.dot of bf16 tiles wrongly (the GPU test covers bf16).
    run_interpreted("t.check_kernel('cpu', torch.float32, 1e-5); t.check_kernel('cpu', torch.float16, 3e-3); "
                    "t.check_dispatch('cpu', torch.float32, 1e-5); t.check_by_row('cpu', torch.float32, 1e-5)")


@pytest.mark.gpu
@pytest.mark.skipif(triton_decode is None, reason="needs triton")
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.bfloat16, 2e-2), (torch.float16, 5e-3)])
def test_kernel_cuda(dtype, tol):
    check_kernel("cuda", dtype, tol)
    check_dispatch("cuda", dtype, tol)
    check_by_row("cuda", dtype, tol)


@pytest.mark.gpu
@pytest.mark.skipif(triton_decode is None, reason="needs triton")
def test_default_chunk_path_on_cuda_is_the_kernel(monkeypatch):
    monkeypatch.setattr("kernels.attention.PATHS.attention", "")
    monkeypatch.setattr("kernels.attention.PATHS.chunks", "")
    q, kc, vc, cu, max_q, rows, lens = make_case(16, 2, 128, torch.bfloat16, "cuda")
    from kernels import triton_chunk

    want = triton_chunk.chunk_attention(q, kc, vc, cu, max_q, rows, lens)
    got = A.cache_attention(q, kc, vc, cu, max_q, rows, lens, max_kv=int(lens.max()))
    if A.pick_backend(q) in ("torch_flash", "fa4") and not A.PAGED and not A.fa4_reads_cache():
        assert torch.equal(got, want)
