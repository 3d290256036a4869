"""Every attention backend against the math reference, where it can run."""
import pytest
import torch

from kernels import attention as A


def packed(seed=0, lens=(5, 1, 12, 7), hq=4, hkv=2, d=16, dtype=torch.float32, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    n = sum(lens)
    q, k, v = (torch.randn(n, h, d, generator=g).to(device, dtype) for h in (hq, hkv, hkv))
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=device)
    return q, k, v, cu, max(lens)


def reference_varlen(q, k, v, cu):
    """A plain loop: softmax(q k^T / sqrt(d)) v per sequence, causal, GQA by repetition, float64."""
    out = torch.empty_like(q, dtype=torch.float64)
    rep = q.shape[1] // k.shape[1]
    for s, e in zip(cu[:-1].tolist(), cu[1:].tolist()):
        qs, ks, vs = q[s:e].double(), k[s:e].double().repeat_interleave(rep, 1), v[s:e].double().repeat_interleave(rep, 1)
        att = torch.einsum("qhd,khd->hqk", qs, ks) / qs.shape[-1] ** 0.5
        att = att.masked_fill(torch.ones(e - s, e - s, dtype=torch.bool).triu(1), float("-inf"))
        out[s:e] = torch.einsum("hqk,khd->qhd", att.softmax(-1), vs)
    return out


def test_math_varlen_matches_reference():
    q, k, v, cu, mx = packed()
    got = A.varlen_attention(q, k, v, cu, mx, backend="math")
    assert (got.double() - reference_varlen(q, k, v, cu)).abs().max() < 1e-5


def cache_case(seed=1, device="cpu", dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    S, L, hq, hkv, d = 5, 32, 4, 2, 16
    kc = torch.randn(S, L, hkv, d, generator=g).to(device, dtype)
    vc = torch.randn(S, L, hkv, d, generator=g).to(device, dtype)
    rows = torch.tensor([3, 0, 4], device=device)
    kv_lens = torch.tensor([9, 1, 20], dtype=torch.int32, device=device)
    return kc, vc, rows, kv_lens, hq, d, g


def test_cache_attention_decode_backends_agree():
    kc, vc, rows, kv_lens, hq, d, g = cache_case()
    q = torch.randn(3, hq, d, generator=g)
    cu = torch.arange(4, dtype=torch.int32)
    ref = A.cache_attention(q, kc, vc, cu, 1, rows, kv_lens, backend="math")
    sdpa = A.cache_attention(q, kc, vc, cu, 1, rows, kv_lens, backend="sdpa")
    assert (ref - sdpa).abs().max() < 1e-5
    # the math path itself against the packed reference: row b's query is the last of its kv_len keys
    for b, (slot, n) in enumerate(zip(rows.tolist(), kv_lens.tolist())):
        qq = torch.cat([torch.zeros(n - 1, hq, d), q[b:b + 1]])
        want = reference_varlen(qq, kc[slot, :n], vc[slot, :n], torch.tensor([0, n]))[-1]
        assert (ref[b].double() - want).abs().max() < 1e-5


@pytest.mark.parametrize("hq,hkv", [(4, 4), (9, 3), (8, 2)])
@pytest.mark.parametrize("max_kv", ["exact", "unknown"])
@pytest.mark.parametrize("grouped", [False, True])
def test_batched_chunks_match_the_row_loop(hq, hkv, max_kv, grouped, monkeypatch):
    """_sdpa_chunks (one padded SDPA call) equals the per-row math loop: uneven chunk sizes (1 to 7 new
    tokens), a chunk that is the row's whole cache, shuffled and repeated slots; `grouped` forces the
    path that splits rows to bound the mask."""
    if grouped:
        monkeypatch.setattr(A, "CHUNK_MASK_ELEMENTS", 200)
    g = torch.Generator().manual_seed(hq * 10 + hkv)
    S, L, d = 6, 24, 16
    kc, vc = torch.randn(S, L, hkv, d, generator=g), torch.randn(S, L, hkv, d, generator=g)
    rows = torch.tensor([4, 0, 5, 2, 0])
    n_new = [3, 1, 7, 2, 5]
    kv_lens = torch.tensor([10, 1, 7, 24, 6], dtype=torch.int32)  # row 2: the chunk is its whole cache
    cu = torch.tensor([0, *torch.tensor(n_new).cumsum(0).tolist()], dtype=torch.int32)
    q = torch.randn(int(cu[-1]), hq, d, generator=g)
    mk = int(kv_lens.max()) if max_kv == "exact" else 0
    got = A.cache_attention(q, kc, vc, cu, max(n_new), rows, kv_lens, backend="sdpa", max_kv=mk)
    want = A.cache_attention(q, kc, vc, cu, max(n_new), rows, kv_lens, backend="math")
    assert torch.isfinite(got).all()
    assert (got - want).abs().max() < 1e-5


@pytest.mark.parametrize("backend", ["sdpa", "flash_attn"])
def test_chunk_with_as_many_queries_as_rows_is_not_a_decode_step(backend, monkeypatch):
    """Rows with 2 and 0 new tokens: Nq == B, but it is a chunk (max_q 2), not one query per row."""
    monkeypatch.setattr(A, "flash_attn_with_kvcache", None)  # must not be reached
    kc, vc, rows, kv_lens, hq, d, g = cache_case()
    rows, kv_lens = rows[:2], torch.tensor([5, 3], dtype=torch.int32)
    q = torch.randn(2, hq, d, generator=g)
    cu = torch.tensor([0, 2, 2], dtype=torch.int32)
    got = A.cache_attention(q, kc, vc, cu, 2, rows, kv_lens, backend=backend, max_kv=5)
    want = A.cache_attention(q, kc, vc, cu, 2, rows, kv_lens, backend="math")
    assert (got - want).abs().max() < 1e-5


def test_cache_attention_chunk_is_bottom_right_causal():
    """A 3-token chunk per row attends like the last 3 queries of a full causal pass over the row's keys."""
    kc, vc, rows, kv_lens, hq, d, g = cache_case()
    q = torch.randn(9, hq, d, generator=g)
    kv_lens = torch.tensor([9, 3, 20], dtype=torch.int32)
    cu = torch.tensor([0, 3, 6, 9], dtype=torch.int32)
    got = A.cache_attention(q, kc, vc, cu, 3, rows, kv_lens, backend="math")
    for b, (slot, n) in enumerate(zip(rows.tolist(), kv_lens.tolist())):
        qq = torch.cat([torch.zeros(n - 3, hq, d), q[3 * b:3 * b + 3]])
        want = reference_varlen(qq, kc[slot, :n], vc[slot, :n], torch.tensor([0, n]))[-3:]
        assert (got[3 * b:3 * b + 3].double() - want).abs().max() < 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["torch_flash", "flash_attn"])
def test_gpu_varlen_backends(backend):
    if backend == "flash_attn" and A.flash_attn_varlen_func is None:
        pytest.skip("flash_attn not installed")
    if backend == "torch_flash" and A.varlen_attn is None:
        pytest.skip("torch has no varlen_attn")
    q, k, v, cu, mx = packed(dtype=torch.bfloat16, device="cuda")
    got = A.varlen_attention(q, k, v, cu, mx, backend=backend)
    assert (got.double().cpu() - reference_varlen(q.cpu(), k.cpu(), v.cpu(), cu.cpu())).abs().max() < 2e-2


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["torch_flash", "sdpa"])
def test_gpu_cache_decode_backends(backend):
    kc, vc, rows, kv_lens, hq, d, g = cache_case(device="cuda", dtype=torch.bfloat16)
    q = torch.randn(3, hq, d, generator=g).to("cuda", torch.bfloat16)
    cu = torch.arange(4, dtype=torch.int32, device="cuda")
    got = A.cache_attention(q, kc, vc, cu, 1, rows, kv_lens, backend=backend)
    ref = A.cache_attention(q.float(), kc.float(), vc.float(), cu, 1, rows, kv_lens, backend="math")
    assert (got.float() - ref).abs().max() < 2e-2


def test_cpu_auto_backend_batches_cache_reads_when_max_kv_is_known(monkeypatch):
    """With the backend picked automatically where no GPU kernel applies (the CPU, fp32 on CUDA), decode
    takes one batched SDPA call (over the first max_kv keys when given, else all of them, with no host
    sync) and chunks with max_kv the padded chunk call: the math loop's results (backend='math')."""
    monkeypatch.delenv("R1_ATTN", raising=False)
    kc, vc, rows, kv_lens, hq, d, g = cache_case()
    calls = []
    for name in ("_sdpa_decode", "_sdpa_chunks"):
        real = getattr(A, name)
        monkeypatch.setattr(A, name, lambda *a, _real=real, _n=name, **k: calls.append(_n) or _real(*a, **k))
    q = torch.randn(3, hq, d, generator=g)
    cu = torch.arange(4, dtype=torch.int32)
    ref = A.cache_attention(q, kc, vc, cu, 1, rows, kv_lens, backend="math")
    got = A.cache_attention(q, kc, vc, cu, 1, rows, kv_lens, max_kv=int(kv_lens.max()))
    assert calls == ["_sdpa_decode"] and (got - ref).abs().max() < 1e-5
    # without max_kv (a captured CUDA graph decode in fp32) too, and with no host sync: the loop's
    # .tolist() cannot run while a graph is captured
    monkeypatch.setattr(torch.Tensor, "tolist", lambda self: pytest.fail("host sync in a decode step"))
    got = A.cache_attention(q, kc, vc, cu, 1, rows, kv_lens)
    assert calls == ["_sdpa_decode"] * 2 and (got - ref).abs().max() < 1e-5
    monkeypatch.undo()
    monkeypatch.delenv("R1_ATTN", raising=False)
    for name in ("_sdpa_decode", "_sdpa_chunks"):
        real = getattr(A, name)
        monkeypatch.setattr(A, name, lambda *a, _real=real, _n=name, **k: calls.append(_n) or _real(*a, **k))
    n_new = [2, 1, 4]
    cu = torch.tensor([0, 2, 3, 7], dtype=torch.int32)
    q = torch.randn(7, hq, d, generator=g)
    ref = A.cache_attention(q, kc, vc, cu, 4, rows, kv_lens, backend="math")
    got = A.cache_attention(q, kc, vc, cu, max(n_new), rows, kv_lens, max_kv=int(kv_lens.max()))
    assert calls[-1] == "_sdpa_chunks" and (got - ref).abs().max() < 1e-5
