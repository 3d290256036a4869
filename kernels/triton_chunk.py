"""Triton attention for chunks: several new queries per row over the row's KV cache, read in place.

A chunk is what an agent's turn boundary prefills: the observation appended to a live row, so row b
brings n_b new queries at the last n_b positions of its slot and attends causally to every key up to its
own position (bottom-right alignment). The batched SDPA path pads queries, gathers keys and builds a
boolean mask, which sends SDPA to a materialising kernel (docs/decisions.md, "Attention backends"). As in
kernels/triton_decode.py: one program per (row, KV head, block of BLOCK_M new queries), the G query heads
of the KV head riding along in one tile so each key block is read once for all; online softmax in fp32;
rows, kv_lens and cu_q on the GPU (no host sync; the grid needs only max_q). `chunk_attention` is the
entry point; kernels/attention.py::cache_attention calls it on CUDA in fp16/bf16; tests/test_attention.py
checks it against the per-row reference, under TRITON_INTERPRET=1 on the CPU and on CUDA.
"""
import math
import os

import torch
import triton
import triton.language as tl

from kernels.triton_decode import LOG2E, supports  # noqa: F401 (supports: same tensor requirements)


# Tile layout: [BLOCK_M * G_PAD, D], token i and head g at tile row i * G_PAD + g (G_PAD the power of
# two >= G). Keys are walked in blocks of BLOCK_N from position 0 up to the tile's last query position,
# exp2 with log2(e) in the scale, causal and validity masks per tile row; padding tile rows (past the
# row's n_b, or g >= G) load zeros and are not stored. kv_lens are clamped to L; a row with no new query
# does nothing.
@triton.jit
def _chunk_block(q, k_base, v_base, n0, hi, qpos, sk_l, sv_l, qk_scale, acc, m_i, l_i,
                 D: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr):
    pos = n0 + tl.arange(0, BLOCK_N)
    n_mask = pos < hi
    offs_d = tl.arange(0, D)
    k = tl.load(k_base + pos[:, None] * sk_l + offs_d[None, :], mask=n_mask[:, None], other=0.0)
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale  # [M, BLOCK_N], log2 units
    s = tl.where(n_mask[None, :] & (pos[None, :] <= qpos[:, None]), s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))  # stays finite (m_i starts at -1e30): no NaN for masked rows
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    v = tl.load(v_base + pos[:, None] * sv_l + offs_d[None, :], mask=n_mask[:, None], other=0.0)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return acc, m_new, l_i


@triton.jit
def _chunk_kernel(q_ptr, k_ptr, v_ptr, cu_ptr, rows_ptr, lens_ptr, out_ptr, blk_row_ptr, blk_mb_ptr,
                  sq_n, sq_h, sk_s, sk_l, sk_h, sv_s, sv_l, sv_h, so_n, so_h, L, qk_scale,
                  G: tl.constexpr, G_PAD: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr,
                  BLOCK_N: tl.constexpr, PRECISION: tl.constexpr, INTERPRET: tl.constexpr, MAPPED: tl.constexpr):
    h = tl.program_id(1)  # KV head
    if MAPPED:  # program j takes the (row, block of new queries) of the block map; row -1: nothing to do
        j = tl.program_id(0)
        b_map = tl.load(blk_row_ptr + j)
        mb = tl.load(blk_mb_ptr + j)
        b = tl.maximum(b_map, 0)
    else:
        b = tl.program_id(0)
        mb = tl.program_id(2)  # block of new queries
    q0 = tl.load(cu_ptr + b)
    n_new = tl.load(cu_ptr + b + 1) - q0
    if MAPPED:
        n_new = tl.where(b_map >= 0, n_new, 0)
    slot = tl.load(rows_ptr + b).to(tl.int64)
    kv_len = tl.minimum(tl.load(lens_ptr + b).to(tl.int32), L)

    offs_m = tl.arange(0, BLOCK_M * G_PAD)
    offs_d = tl.arange(0, D)
    i = mb * BLOCK_M + offs_m // G_PAD  # new-token index within the row
    g = offs_m % G_PAD
    valid = (i < n_new) & (g < G)
    qpos = kv_len - n_new + i  # the token's position: it sees keys 0..qpos
    heads = h * G + g
    tok = (q0 + i).to(tl.int64)
    q = tl.load(q_ptr + tok[:, None] * sq_n + heads[:, None] * sq_h + offs_d[None, :], mask=valid[:, None], other=0.0)
    last = tl.minimum((mb + 1) * BLOCK_M, n_new)  # one past the tile's last new token
    hi = tl.where(mb * BLOCK_M < n_new, tl.minimum(kv_len - n_new + last, kv_len), 0)
    k_base = k_ptr + slot * sk_s + h * sk_h
    v_base = v_ptr + slot * sv_s + h * sv_h

    m_i = tl.full([BLOCK_M * G_PAD], -1e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M * G_PAD], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M * G_PAD, D], dtype=tl.float32)
    if INTERPRET:  # NumPy >= 2.4 refuses range() over the interpreter's 1-element scalars
        n0 = hi * 0
        while n0 < hi:
            acc, m_i, l_i = _chunk_block(q, k_base, v_base, n0, hi, qpos, sk_l, sv_l, qk_scale, acc, m_i, l_i,
                                         D, BLOCK_N, PRECISION)
            n0 += BLOCK_N
    else:
        for n0 in range(0, hi, BLOCK_N):
            acc, m_i, l_i = _chunk_block(q, k_base, v_base, n0, hi, qpos, sk_l, sv_l, qk_scale, acc, m_i, l_i,
                                         D, BLOCK_N, PRECISION)
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(out_ptr + tok[:, None] * so_n + heads[:, None] * so_h + offs_d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=valid[:, None])


def chunk_attention(q, k_cache, v_cache, cu_q, max_q: int, rows, kv_lens, block_m=16, block_n=64, blocks=None,
                    out=None):
    """q [Nq, Hq, D] packed (row b owns q[cu_q[b]:cu_q[b+1]]), k_cache/v_cache [S, L, Hkv, D],
    rows [B] (slot of each row), kv_lens [B] (valid keys, the new ones included), max_q: the
    longest chunk (host int) -> [Nq, Hq, D]. Query i of a row with n new tokens sits at
    position kv_len - n + i and sees the keys up to it.

    blocks: (row, block) int32 tensors of kernels.attention.block_map (block_m 16): one program per
    entry instead of a grid over every row and max_q (max_q unused), written into `out`; rows with
    one query are not in the map (the decode kernel takes them: by_row_attention)."""
    Nq, Hq, D = q.shape
    B = rows.shape[0]
    L, Hkv = k_cache.shape[1], k_cache.shape[2]
    if not supports(q, k_cache, v_cache) or Hq % Hkv or k_cache.shape[3] != D or v_cache.shape != k_cache.shape:
        raise ValueError(f"chunk_attention: unsupported q {tuple(q.shape)} {q.dtype}, "
                         f"cache {tuple(k_cache.shape)} {k_cache.dtype}, strides {k_cache.stride()}")
    if q.stride(-1) != 1:
        q = q.contiguous()
    if out is None:
        out = torch.empty_like(q)
    if B == 0 or Nq == 0 or (max_q <= 0 and blocks is None):
        return out
    G = Hq // Hkv
    g_pad = triton.next_power_of_2(G)
    block_m = max(block_m, triton.cdiv(16, g_pad))  # tl.dot needs M >= 16
    if blocks is not None and block_m != 16:
        raise ValueError(f"chunk_attention: a block map is made for 16 queries a block, not {block_m}")
    grid = (blocks[0].shape[0], Hkv) if blocks is not None else (B, Hkv, triton.cdiv(max_q, block_m))
    blk_row, blk_mb = blocks if blocks is not None else (rows, rows)  # unused pointers without a map
    _chunk_kernel[grid](
        q, k_cache, v_cache, cu_q, rows, kv_lens, out, blk_row, blk_mb,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), out.stride(0), out.stride(1),
        L, LOG2E / math.sqrt(D),
        G=G, G_PAD=g_pad, D=D, BLOCK_M=block_m, BLOCK_N=block_n,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        INTERPRET=os.environ.get("TRITON_INTERPRET") == "1", MAPPED=blocks is not None,
        num_warps=8 if block_m * g_pad >= 128 else 4)
    return out
