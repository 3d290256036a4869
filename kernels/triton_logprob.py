"""Triton kernels for one chunk of kernels/logprob.py: softmax statistics and dlogits.

The chunk's logits [C, V] come from cuBLAS in the model's dtype. The torch path upcasts them to an fp32
[C, V] copy (2.4 GB at C=4096, V=152k) and more temporaries; these kernels read each element in its own
dtype, do the fp32 math in registers, and (backward) write dlogits over the logits buffer. One program
per row, walking V in blocks: `_stats_kernel` is a one-pass online logsumexp that also gives the entropy
without subtracting two large numbers; `_dlogits_kernel` forms dz (derivation in kernels/logprob.py).
V is a compile-time constant: one compilation per vocabulary, and TRITON_INTERPRET=1 keeps working under
NumPy 2.5. Importing this module fails without triton; kernels/logprob.py then uses its torch functions,
which take the same arguments and which the tests compare these against.
"""
import torch
import triton
import triton.language as tl


# _stats_kernel: with running max m, s = sum exp(z - m) and a = sum exp(z - m) (z - m), a new max m'
# rescales s' = s e^(m - m') and a' = e^(m - m') (a + (m - m') s); at the end lse = m + log s and
# H = lse - sum p z = log s - a / s. _dlogits_kernel: dz_j = g (onehot_j - p_j) - h p_j (log p_j + H) with
# p_j = exp(z_j - lse), dlogits = dz / T.
@triton.jit
def _stats_kernel(logits_ptr, row_stride, targets_ptr, lse_ptr, logp_ptr, entropy_ptr, V: tl.constexpr, inv_t,
                  WITH_ENTROPY: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    base = logits_ptr + row * row_stride
    # A finite start, so the first rescale is 0 * finite rather than 0 * inf.
    m = -1e30
    s = 0.0
    a = 0.0
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < V
        z = tl.load(base + offs, mask=mask, other=float("-inf")).to(tl.float32) * inv_t
        m_new = tl.maximum(m, tl.max(z, axis=0))
        scale = tl.exp(m - m_new)
        e = tl.exp(z - m_new)  # 0 where masked
        if WITH_ENTROPY:
            d = tl.where(mask, z - m_new, 0.0)
            a = scale * (a + (m - m_new) * s) + tl.sum(e * d, axis=0)
        s = s * scale + tl.sum(e, axis=0)
        m = m_new
    lse = m + tl.log(s)
    target = tl.load(targets_ptr + row)
    z_target = tl.load(base + target).to(tl.float32) * inv_t
    tl.store(lse_ptr + row, lse)
    tl.store(logp_ptr + row, z_target - lse)
    if WITH_ENTROPY:
        tl.store(entropy_ptr + row, tl.log(s) - a / s)


@triton.jit
def _dlogits_kernel(logits_ptr, row_stride, targets_ptr, lse_ptr, entropy_ptr, grad_logp_ptr,
                    grad_entropy_ptr, V: tl.constexpr, inv_t, HAS_GRAD_LOGP: tl.constexpr,
                    HAS_GRAD_ENTROPY: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    base = logits_ptr + row * row_stride
    lse = tl.load(lse_ptr + row)
    target = tl.load(targets_ptr + row)
    g = 0.0
    if HAS_GRAD_LOGP:
        g = tl.load(grad_logp_ptr + row)
    h = 0.0
    entropy = 0.0
    if HAS_GRAD_ENTROPY:
        h = tl.load(grad_entropy_ptr + row)
        entropy = tl.load(entropy_ptr + row)
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < V
        logp = tl.load(base + offs, mask=mask, other=0.0).to(tl.float32) * inv_t - lse
        p = tl.exp(logp)
        if HAS_GRAD_ENTROPY:
            dz = -p * (g + h * (logp + entropy))
        else:
            dz = -p * g
        dz = tl.where(offs == target, dz + g, dz)
        tl.store(base + offs, (dz * inv_t).to(logits_ptr.dtype.element_ty), mask=mask)


def _launch_config(V):
    block = min(4096, triton.next_power_of_2(V))
    return block, (8 if block >= 2048 else 4)


def chunk_stats_(logits, targets, temperature, with_entropy):
    """logits [C, V] (fp32/bf16/fp16, CUDA), targets [C] -> (lse, logp, entropy or None), each [C] fp32.

    Reads logits only (the trailing underscore matches the torch twin, which may overwrite).
    """
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    c, v = logits.shape
    lse = torch.empty(c, dtype=torch.float32, device=logits.device)
    logp = torch.empty_like(lse)
    entropy = torch.empty_like(lse) if with_entropy else lse  # placeholder pointer when unused
    if c > 0:
        block, warps = _launch_config(v)
        _stats_kernel[(c,)](logits, logits.stride(0), targets, lse, logp, entropy, v, 1.0 / temperature,
                            WITH_ENTROPY=with_entropy, BLOCK=block, num_warps=warps)
    return lse, logp, (entropy if with_entropy else None)


def chunk_dlogits_(logits, targets, lse, entropy, grad_logp, grad_entropy, temperature):
    """dlogits [C, V] in the logits' dtype, written over `logits` (returned).

    lse, entropy, grad_logp, grad_entropy: [C] fp32, contiguous; either grad may be None.
    """
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    c, v = logits.shape
    if c > 0:
        block, warps = _launch_config(v)
        _dlogits_kernel[(c,)](
            logits, logits.stride(0), targets, lse, entropy,
            lse if grad_logp is None else grad_logp, lse if grad_entropy is None else grad_entropy,
            v, 1.0 / temperature, HAS_GRAD_LOGP=grad_logp is not None,
            HAS_GRAD_ENTROPY=grad_entropy is not None, BLOCK=block, num_warps=warps,
        )
    return logits
