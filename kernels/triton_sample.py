"""Triton kernel for r1/generate.py::sample: one pass over each row's logits per decode step.

The torch path makes ~20 full passes over [B, V] per step (temperature, log_softmax, the int64 noise
hash and its temporaries, the race, gather). Here one program per row walks V in blocks, reads each logit
once in its own dtype (math in fp32) and keeps in registers an online logsumexp of z = logits * (1/T) and
the exponential race (key = z - log q, q the row's Exponential(1) noise; ties to the first index, as
torch.argmax). At the end tok = the winner and logprob = z[tok] - logsumexp(z): the full-vocabulary log
softmax(logits / T)[tok]. Greedy (T = 0) races z itself with T = 1 for the logprob.

The noise is bit-exact with `r1.generate.row_uniform`: the same splitmix64 on uint64, then the same fp32
ops. Only seeded sampling with top_k == 0 and top_p == 1 comes here; other cases stay on the torch path.
V is a compile-time constant: one compilation per vocabulary.
"""
import torch
import triton
import triton.language as tl

U_MAX = tl.constexpr(1.0 - 2.0**-24)  # largest fp32 below 1: (2^24 - 1 + 0.5) rounds up to 2^24 in fp32


# What keeps the fp32 values identical to torch's: z = logits * (1/T) is a multiply by the fp32
# reciprocal, as torch does (Triton's `/` is an approximate division); enable_fp_fusion=False, so z - log q
# is not contracted into an FMA that skips rounding z; compiled for NVIDIA, tl.log is libdevice's __nv_logf
# (Triton 3.6 emits the same PTX for tl.log and libdevice.log: no lg2.approx), the CUDA math library's
# logf that torch.log calls; the inputs (u, q) are normal floats, so the flush-to-zero variant computes
# the same values. Under TRITON_INTERPRET=1 it is NumPy's log, which differs from torch's CPU log by up to
# a few ulp, so on the CPU only u is bit-exact and a token could differ on a near-tie. The online
# logsumexp keeps a running max m and s = sum exp(z - m), one exp per element; a lane updates its race
# only on a strictly larger key and the final reduction takes the smallest index among lanes holding the
# maximum. u = min((float(x >> 40) + 0.5) * 2^-24, 1 - 2^-24), q = -log(u).
@triton.jit
def _mix(x):
    """splitmix64 finaliser on uint64."""
    x = x * tl.full([], 0xBF58476D1CE4E5B9, tl.uint64)
    x = x ^ (x >> 27)
    x = x * tl.full([], 0x94D049BB133111EB, tl.uint64)
    return x ^ (x >> 31)


@triton.jit
def _row_hash(seeds_ptr, positions_ptr, row):
    seed = tl.load(seeds_ptr + row).to(tl.uint64, bitcast=True)
    pos = tl.load(positions_ptr + row).to(tl.uint64, bitcast=True)
    # torch's `positions * C % 2^62` is a floor mod, i.e. the low 62 bits of the wrapped product.
    pos = (pos * tl.full([], 0x632BE59BD9B4E019, tl.uint64)) & tl.full([], 0x3FFFFFFFFFFFFFFF, tl.uint64)
    return _mix(seed * tl.full([], 0x9E3779B97F4A7C15, tl.uint64) + pos)


@triton.jit
def _uniform(h, cols):
    """u in (0, 1) for token ids `cols` of the row whose hash is h."""
    x = _mix(h + cols.to(tl.uint64) * tl.full([], 0xD1B54A32D192ED03, tl.uint64))
    u = ((x >> 40).to(tl.int32).to(tl.float32) + 0.5) * (1.0 / 16777216.0)
    return tl.minimum(u, U_MAX)


@triton.jit
def _sample_kernel(logits_ptr, row_stride, seeds_ptr, positions_ptr, tokens_ptr, logprobs_ptr, inv_t,
                   V: tl.constexpr, GREEDY: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    base = logits_ptr + row * row_stride
    h = _row_hash(seeds_ptr, positions_ptr, row)
    neg_inf = float("-inf")
    m = tl.full([BLOCK], neg_inf, tl.float32)
    s = tl.zeros([BLOCK], tl.float32)
    best = tl.full([BLOCK], neg_inf, tl.float32)
    best_i = tl.zeros([BLOCK], tl.int32)
    best_z = tl.zeros([BLOCK], tl.float32)
    for start in range(0, V, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        z = tl.load(base + cols, mask=cols < V, other=neg_inf).to(tl.float32) * inv_t
        hi = tl.maximum(m, z)
        e = tl.exp(tl.minimum(m, z) - tl.where(hi == neg_inf, 0.0, hi))  # 0, not NaN, while both are -inf
        s = tl.where(z > m, s * e + 1.0, s + e)
        m = hi
        if GREEDY:
            key = z
        else:
            key = z - tl.log(-tl.log(_uniform(h, cols)))
        take = key > best
        best = tl.where(take, key, best)
        best_i = tl.where(take, cols, best_i)
        best_z = tl.where(take, z, best_z)
    m_row = tl.max(m, axis=0)
    s_row = tl.sum(tl.where(m == neg_inf, 0.0, s * tl.exp(m - m_row)), axis=0)
    top = tl.max(best, axis=0)
    tok = tl.min(tl.where(best == top, best_i, V), axis=0)
    z_tok = tl.max(tl.where((best == top) & (best_i == tok), best_z, neg_inf), axis=0)
    tl.store(tokens_ptr + row, tok.to(tl.int64))
    tl.store(logprobs_ptr + row, z_tok - (m_row + tl.log(s_row)))


@triton.jit
def _noise_kernel(seeds_ptr, positions_ptr, u_ptr, q_ptr, V: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    h = _row_hash(seeds_ptr, positions_ptr, row)
    for start in range(0, V, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        u = _uniform(h, cols)
        tl.store(u_ptr + row * V + cols, u, mask=cols < V)
        tl.store(q_ptr + row * V + cols, -tl.log(u), mask=cols < V)


def _launch_config(v):
    block = min(2048, triton.next_power_of_2(v))
    return block, (8 if block >= 2048 else 4)


def _rows(seeds, positions, device):
    return seeds.to(device, torch.int64).contiguous(), positions.to(device, torch.int64).contiguous()


def sample(logits, temperature: float, seeds, positions):
    """logits [B, V] (bf16/fp16/fp32), seeds [B], positions [B] int64 -> (tokens [B] int64, logprobs [B] fp32).

    The same tokens and logprobs as r1.generate.sample with Sampling(temperature, top_p=1, top_k=0)
    and these seeds (temperature <= 0: greedy).
    """
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    b, v = logits.shape
    seeds, positions = _rows(seeds, positions, logits.device)
    tokens = torch.empty(b, dtype=torch.int64, device=logits.device)
    logprobs = torch.empty(b, dtype=torch.float32, device=logits.device)
    if b > 0:
        greedy = temperature <= 0
        block, warps = _launch_config(v)
        _sample_kernel[(b,)](logits, logits.stride(0), seeds, positions, tokens, logprobs,
                             1.0 if greedy else 1.0 / temperature, V=v, GREEDY=greedy, BLOCK=block,
                             num_warps=warps, enable_fp_fusion=False)
    return tokens, logprobs


def noise(seeds, positions, vocab: int):
    """Debug twin of r1.generate.row_uniform / row_noise: (u [B, V], q = -log u [B, V]), fp32."""
    seeds, positions = _rows(seeds, positions, seeds.device)
    u = torch.empty(seeds.shape[0], vocab, dtype=torch.float32, device=seeds.device)
    q = torch.empty_like(u)
    if seeds.shape[0] > 0:
        block, warps = _launch_config(vocab)
        _noise_kernel[(seeds.shape[0],)](seeds, positions, u, q, V=vocab, BLOCK=block, num_warps=warps,
                                         enable_fp_fusion=False)
    return u, q
