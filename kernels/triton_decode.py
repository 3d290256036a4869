"""Triton flash-decoding over the generator's KV cache, read in place.

The one-token decode step: row b's query q[b] [Hq, D] attends to the first kv_lens[b] positions of slot
rows[b] of k_cache/v_cache [S, L, Hkv, D]. torch 2.11's varlen_attn cannot read a cache and the SDPA
fallback gathers every row's whole slot per layer per step; this kernel reads only each row's valid keys,
where they lie. One program per (row, KV head, split); the G query heads of a KV head share its key
blocks; an online softmax in fp32; kv_lens and rows stay on the GPU, so the call is CUDA-graph
capturable. Split-K only when the grid is small (a rollout's tail), with a second kernel merging the
partials. `decode_attention` is the entry point; kernels/attention.py::cache_attention calls it and
tests/test_decode_kernel.py compares it with the SDPA reference. Importing this module fails without
triton.
"""
import functools
import math
import os

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634


# Design details. GQA: the G = Hq / Hkv query heads are one [G_PAD, D] tile, G_PAD = max(16, pow2 >= G)
# because tl.dot needs M >= 16; padded rows are zeros and not stored (decode is bound by reading K/V, so
# the wasted tensor-core work is free). Keys are walked in blocks of BLOCK_N with exp2 and log2(e) folded
# into the scale 1/sqrt(D); p is cast to the cache dtype for p @ V, as FlashAttention does. Split-K: once
# B * Hkv >= 2 x SMs, splits = 1 and the kernel writes the output directly; otherwise each split takes an
# equal share of its row's kv_len (rounded up to BLOCK_N, computed in the kernel from the loaded length)
# and writes fp32 partials (m, l, unnormalised acc) that _combine_kernel merges per (row, query head).
# BLOCK_N = 64, 4 warps: ~90 registers on sm_90, no spills, software-pipelined; not tuned by timing
# (bench/decode_attention.py). Under TRITON_INTERPRET=1 the block step runs in a while loop (the
# interpreter's range() cannot take loaded bounds under NumPy >= 2.4). kv_lens > L is clamped to L (as
# the masked SDPA path); kv_len 0 gives zeros (SDPA would give NaN); the generator never sends either.
@triton.jit
def _attend_block(q, k_base, v_base, n0, end, sk_l, sv_l, qk_scale, acc, m_i, l_i,
                  D: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr):
    """One block of BLOCK_N key positions from n0 (those >= end masked) -> updated (acc, m_i, l_i)."""
    pos = n0 + tl.arange(0, BLOCK_N)
    n_mask = pos < end
    offs_d = tl.arange(0, D)
    k = tl.load(k_base + pos[:, None] * sk_l + offs_d[None, :], mask=n_mask[:, None], other=0.0)
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale  # [G_PAD, BLOCK_N], log2 units
    s = tl.where(n_mask[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))  # finite: every block holds >= 1 valid key
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    v = tl.load(v_base + pos[:, None] * sv_l + offs_d[None, :], mask=n_mask[:, None], other=0.0)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return acc, m_new, l_i


@triton.jit
def _decode_kernel(q_ptr, k_ptr, v_ptr, rows_ptr, lens_ptr, out_ptr, m_ptr, l_ptr, acc_ptr, cu_ptr,
                   sq_b, sq_h, sk_s, sk_l, sk_h, sv_s, sv_l, sv_h, so_b, so_h, L, qk_scale,
                   G: tl.constexpr, G_PAD: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr,
                   SPLITS: tl.constexpr, PRECISION: tl.constexpr, INTERPRET: tl.constexpr, BY_ROW: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)  # KV head
    split = tl.program_id(2)
    slot = tl.load(rows_ptr + b).to(tl.int64)  # int64: slot * stride can pass 2^31
    kv_len = tl.minimum(tl.load(lens_ptr + b).to(tl.int32), L)
    offs_g = tl.arange(0, G_PAD)
    g_mask = offs_g < G
    if BY_ROW:  # packed queries (cu_q): only rows with exactly one query are this kernel's; the others read nothing
        t0 = tl.load(cu_ptr + b)
        one = (tl.load(cu_ptr + b + 1) - t0) == 1
        kv_len = tl.where(one, kv_len, 0)
        g_mask = g_mask & one
        tok = t0.to(tl.int64)
    else:
        tok = b
    chunk = tl.cdiv(tl.cdiv(kv_len, SPLITS), BLOCK_N) * BLOCK_N
    start = split * chunk
    end = tl.minimum(start + chunk, kv_len)

    offs_d = tl.arange(0, D)
    heads = h * G + offs_g  # query heads of this KV head
    q = tl.load(q_ptr + tok * sq_b + heads[:, None] * sq_h + offs_d[None, :], mask=g_mask[:, None], other=0.0)
    k_base = k_ptr + slot * sk_s + h * sk_h
    v_base = v_ptr + slot * sv_s + h * sv_h

    # A finite start, so an empty split merges with weight exp2(-1e30 - m) = 0, never NaN.
    m_i = tl.full([G_PAD], -1e30, dtype=tl.float32)
    l_i = tl.zeros([G_PAD], dtype=tl.float32)
    acc = tl.zeros([G_PAD, D], dtype=tl.float32)
    if INTERPRET:  # NumPy >= 2.4 refuses range() over the interpreter's 1-element scalars
        n0 = start
        while n0 < end:
            acc, m_i, l_i = _attend_block(q, k_base, v_base, n0, end, sk_l, sv_l, qk_scale, acc, m_i, l_i,
                                          D, BLOCK_N, PRECISION)
            n0 += BLOCK_N
    else:  # a for loop, which the compiler software-pipelines
        for n0 in range(start, end, BLOCK_N):
            acc, m_i, l_i = _attend_block(q, k_base, v_base, n0, end, sk_l, sv_l, qk_scale, acc, m_i, l_i,
                                          D, BLOCK_N, PRECISION)

    if SPLITS == 1:
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(out_ptr + tok * so_b + heads[:, None] * so_h + offs_d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=g_mask[:, None])
    else:  # partials [B, Hq, SPLITS] (and [.., D] for acc), contiguous
        part = (b * tl.num_programs(1) * G + heads) * SPLITS + split
        tl.store(m_ptr + part, m_i, mask=g_mask)
        tl.store(l_ptr + part, l_i, mask=g_mask)
        tl.store(acc_ptr + part[:, None] * D + offs_d[None, :], acc, mask=g_mask[:, None])


@triton.jit
def _combine_kernel(m_ptr, l_ptr, acc_ptr, out_ptr, so_b, so_h,
                    SPLITS: tl.constexpr, S_PAD: tl.constexpr, D: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)  # query head
    offs_s = tl.arange(0, S_PAD)
    offs_d = tl.arange(0, D)
    s_mask = offs_s < SPLITS
    part = (b * tl.num_programs(1) + h) * SPLITS + offs_s
    m = tl.load(m_ptr + part, mask=s_mask, other=-1e30)
    l = tl.load(l_ptr + part, mask=s_mask, other=0.0)
    acc = tl.load(acc_ptr + part[:, None] * D + offs_d[None, :], mask=s_mask[:, None], other=0.0)
    w = tl.exp2(m - tl.max(m, 0))  # [S_PAD]; 0 for empty splits
    l_sum = tl.sum(w * l, 0)
    out = tl.sum(w[:, None] * acc, 0) / tl.where(l_sum > 0, l_sum, 1.0)
    tl.store(out_ptr + b * so_b + h * so_h + offs_d, out.to(out_ptr.dtype.element_ty))


@functools.cache
def _sm_count(index):
    return torch.cuda.get_device_properties(index).multi_processor_count


def pick_splits(programs: int, max_len: int, device) -> int:
    """KV splits per (row, KV head): 1 when `programs` fill two waves of SMs, else up to 16.

    Depends only on shapes and the device, so a captured CUDA graph keeps a valid choice.
    Each split is worth at least 256 positions of a full slot.
    """
    if device.type != "cuda":
        return 1
    want = 2 * _sm_count(device.index if device.index is not None else torch.cuda.current_device())
    return max(1, min(16, triton.cdiv(want, max(programs, 1)), max_len // 256))


def supports(q, k_cache, v_cache) -> bool:
    """Whether decode_attention can take these tensors (dtype, head dim, layout); shapes are checked there."""
    return (q.dim() == 3 and k_cache.dim() == 4 and q.dtype == k_cache.dtype == v_cache.dtype
            and q.dtype in (torch.float16, torch.bfloat16, torch.float32)
            and q.device == k_cache.device == v_cache.device
            and q.shape[-1] >= 16 and q.shape[-1] & (q.shape[-1] - 1) == 0
            and k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1)


def decode_attention(q, k_cache, v_cache, rows, kv_lens, splits=None, block_n=64, cu_q=None, out=None):
    """q [B, Hq, D], k_cache/v_cache [S, L, Hkv, D], rows [B] (slot of each row), kv_lens [B] -> [B, Hq, D].

    Row b's query is the newest of its kv_lens[b] keys (already in the cache),
    so it sees all of them: no causal mask within the row. Output in q's dtype.
    splits: KV splits per (row, KV head); None picks with `pick_splits`.
    cu_q [B+1] (with out [N, Hq, D]): q is packed [N, Hq, D] (row b owns q[cu_q[b]:cu_q[b+1]]), and
    only the rows with exactly one query are written, into out (a mixed forward: kernels/attention.py
    by_row_attention); one split per row.
    """
    if cu_q is not None:
        B = rows.shape[0]
        Hq, D = q.shape[1:]
        splits = 1
    else:
        B, Hq, D = q.shape
    L, Hkv = k_cache.shape[1], k_cache.shape[2]
    if not supports(q, k_cache, v_cache) or Hq % Hkv or k_cache.shape[3] != D or v_cache.shape != k_cache.shape:
        raise ValueError(f"decode_attention: unsupported q {tuple(q.shape)} {q.dtype}, "
                         f"cache {tuple(k_cache.shape)} {k_cache.dtype}, strides {k_cache.stride()}")
    if q.stride(-1) != 1:
        q = q.contiguous()
    if out is None:
        out = torch.empty(B, Hq, D, dtype=q.dtype, device=q.device)
    if B == 0:
        return out
    G = Hq // Hkv
    splits = splits or pick_splits(B * Hkv, L, q.device)
    if splits > 1:
        m = torch.empty(B, Hq, splits, dtype=torch.float32, device=q.device)
        l = torch.empty_like(m)
        acc = torch.empty(B, Hq, splits, D, dtype=torch.float32, device=q.device)
    else:
        m = l = acc = out  # unused pointers
    _decode_kernel[(B, Hkv, splits)](
        q, k_cache, v_cache, rows, kv_lens, out, m, l, acc, kv_lens if cu_q is None else cu_q,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), out.stride(0), out.stride(1),
        L, LOG2E / math.sqrt(D),
        G=G, G_PAD=max(16, triton.next_power_of_2(G)), D=D, BLOCK_N=block_n, SPLITS=splits,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        INTERPRET=os.environ.get("TRITON_INTERPRET") == "1", BY_ROW=cu_q is not None, num_warps=4)
    if splits > 1:
        _combine_kernel[(B, Hq)](m, l, acc, out, out.stride(0), out.stride(1),
                                 SPLITS=splits, S_PAD=triton.next_power_of_2(splits), D=D, num_warps=4)
    return out
