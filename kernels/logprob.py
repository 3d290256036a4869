"""Per-token log-probability and entropy of the LM head, without [N, V] fp32 logits.

RL needs, for each sampled token, log p(target) and the entropy of softmax(logits / T), with gradients
wrt the hidden states and the LM head. Materialising fp32 logits costs N * V * 4 bytes (10 GB at N=16k,
V=152k) and autograd would keep several such tensors. `logprob_entropy` walks the tokens in chunks:
the forward computes a chunk's logits, its logsumexp, logp and entropy, and saves only lse and H ([N]
fp32); the backward recomputes the chunk's logits and forms dlogits = dz / T from the saved lse and H
(derivation below), then grad_hidden = dlogits @ W and grad_W += dlogits^T @ hidden (fp32 accumulator).
Extra memory is O(chunk_size * V) plus the [V, H] accumulator. On CUDA with triton, the softmax
statistics and dz run in kernels/triton_logprob.py, which read logits in their own dtype and write
dlogits over them; elsewhere the torch functions here (`chunk_stats_`, `chunk_dlogits_`), which are
also what those kernels are tested against.
"""
import torch

try:  # Triton is optional: absent in the CPU build of torch
    from kernels import triton_logprob
except ImportError:  # pragma: no cover - depends on the machine
    triton_logprob = None


# Gradient wrt z (a row; p = softmax(z), log p_j = z_j - lse, S = sum_k p_k z_k):
#   d logp / d z_j = onehot_j - p_j
#   H = lse - S,  d lse / d z_j = p_j,  d p_k / d z_j = p_k (delta_kj - p_j)
#   d S / d z_j = p_j + sum_k z_k p_k (delta_kj - p_j) = p_j + p_j (z_j - S)
#   d H / d z_j = p_j - p_j - p_j (z_j - S) = -p_j (z_j - S) = -p_j (log p_j + H)
# The last form (z_j - S = log p_j + lse - S = log p_j + H) needs only the saved lse and H and does not
# subtract two large numbers. With upstream gradients g (for logp) and h (for H):
#   dz_j = g (onehot_j - p_j) - h p_j (log p_j + H),   dlogits = dz / T.
def logprob_entropy_reference(hidden, weight, targets, temperature=1.0):
    """Naive oracle: hidden [N, H], weight [V, H], targets [N] -> (logp [N], entropy [N]).

    Materialises the full logits; outputs are float32 (float64 for float64 inputs).
    """
    out_dtype = torch.promote_types(hidden.dtype, torch.float32)
    logits = (hidden @ weight.t()).to(out_dtype) / temperature  # [N, V]
    logp_all = torch.log_softmax(logits, dim=-1)  # [N, V]
    logp = logp_all.gather(1, targets[:, None]).squeeze(1)  # [N]
    entropy = -(logp_all.exp() * logp_all).sum(-1)  # [N]
    return logp, entropy


def chunk_stats_(logits, targets, temperature, with_entropy):
    """logits [C, V] (any float dtype), targets [C] -> (lse [C], logp [C], entropy [C] or None).

    Statistics of softmax(logits / T) in fp32 (fp64 for fp64 logits). `logits` is
    scratch (a freshly computed chunk): fp32/fp64 logits are overwritten, which
    saves a [C, V] copy.
    """
    z = logits.to(torch.promote_types(logits.dtype, torch.float32))  # [C, V]
    if temperature != 1.0:
        z.mul_(1.0 / temperature)
    lse = torch.logsumexp(z, dim=-1)  # [C]
    logp = z.gather(1, targets[:, None]).squeeze(1) - lse  # [C]
    if not with_entropy:
        return lse, logp, None
    z.sub_(lse[:, None])  # now log p, [C, V]
    entropy = torch.exp(z).mul_(z).sum(-1).neg_()  # [C]
    return lse, logp, entropy


def chunk_dlogits_(logits, targets, lse, entropy, grad_logp, grad_entropy, temperature):
    """Gradient wrt the chunk's logits, [C, V] in the logits' dtype; `logits` is scratch.

    grad_logp / grad_entropy [C] (either may be None: no gradient flows there);
    lse, entropy [C] as saved by `chunk_stats_` (entropy only needed with grad_entropy).
    dz_j = g (onehot_j - p_j) - h p_j (log p_j + H), dlogits = dz / T (see module docstring).
    """
    z = logits.to(torch.promote_types(logits.dtype, torch.float32))  # [C, V]
    inv_t = 1.0 / temperature
    if temperature != 1.0:
        z.mul_(inv_t)
    logp_all = z.sub_(lse[:, None])  # [C, V]
    if grad_entropy is None:
        # dz = -g p (+ g at the target): one buffer, p overwrites log p.
        dz = logp_all.exp_().mul_((-inv_t * grad_logp)[:, None])
    else:
        p = torch.exp(logp_all)  # [C, V]
        coef = logp_all.add_(entropy[:, None]).mul_(grad_entropy[:, None])  # h (log p + H)
        if grad_logp is not None:
            coef.add_(grad_logp[:, None])
        dz = coef.mul_(p).mul_(-inv_t)
        del p
    if grad_logp is not None:
        rows = torch.arange(dz.shape[0], device=dz.device)
        dz[rows, targets] += inv_t * grad_logp
    return dz.to(logits.dtype)


class _LogprobEntropy(torch.autograd.Function):
    """Chunked forward/backward; see the module docstring for the math."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature, chunk_size, with_entropy, use_triton):
        n = hidden.shape[0]
        stat_dtype = torch.promote_types(hidden.dtype, torch.float32)
        lse = torch.empty(n, dtype=stat_dtype, device=hidden.device)
        logp = torch.empty(n, dtype=stat_dtype, device=hidden.device)
        entropy = torch.empty(n, dtype=stat_dtype, device=hidden.device) if with_entropy else None
        stats = triton_logprob.chunk_stats_ if use_triton else chunk_stats_
        for start in range(0, n, chunk_size):
            end = min(start + chunk_size, n)
            logits = hidden[start:end] @ weight.t()  # [C, V] in the input dtype
            lse_c, logp_c, ent_c = stats(logits, targets[start:end], temperature, with_entropy)
            del logits
            lse[start:end] = lse_c
            logp[start:end] = logp_c
            if with_entropy:
                entropy[start:end] = ent_c
        ctx.save_for_backward(hidden, weight, targets, lse, entropy if with_entropy else lse)
        ctx.config = (temperature, chunk_size, with_entropy, use_triton)
        ctx.set_materialize_grads(False)  # None grads let the backward skip work
        if with_entropy:
            return logp, entropy
        return logp

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_logp, grad_entropy=None):
        hidden, weight, targets, lse, entropy = ctx.saved_tensors
        temperature, chunk_size, with_entropy, use_triton = ctx.config
        need_hidden, need_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        n = hidden.shape[0]
        if grad_logp is not None:
            grad_logp = grad_logp.to(lse.dtype).contiguous()
        if grad_entropy is not None:
            grad_entropy = grad_entropy.to(lse.dtype).contiguous()
        # Contiguous, so each chunk's product can be written straight into its rows.
        grad_hidden = torch.zeros(hidden.shape, dtype=hidden.dtype, device=hidden.device) if need_hidden else None
        grad_weight = None
        if need_weight:
            acc_dtype = torch.promote_types(weight.dtype, torch.float32)
            grad_weight = torch.zeros(weight.shape, dtype=acc_dtype, device=weight.device)  # [V, H]
        if grad_logp is None and grad_entropy is None:
            return grad_hidden, _cast(grad_weight, weight.dtype), None, None, None, None, None
        dlogits_ = triton_logprob.chunk_dlogits_ if use_triton else chunk_dlogits_
        for start in range(0, n, chunk_size):
            end = min(start + chunk_size, n)
            hidden_c = hidden[start:end]  # [C, H]
            logits = hidden_c @ weight.t()  # [C, V]
            g = None if grad_logp is None else grad_logp[start:end]
            h = None if grad_entropy is None else grad_entropy[start:end]
            dlogits = dlogits_(logits, targets[start:end], lse[start:end], entropy[start:end], g, h, temperature)
            del logits
            if need_hidden:
                torch.mm(dlogits, weight, out=grad_hidden[start:end])
            if need_weight:
                if grad_weight.dtype == dlogits.dtype:
                    grad_weight.addmm_(dlogits.t(), hidden_c)
                else:  # bf16/fp16 product (fp32 accumulation inside the GEMM), summed in fp32
                    grad_weight.add_(dlogits.t() @ hidden_c)
            del dlogits
        return grad_hidden, _cast(grad_weight, weight.dtype), None, None, None, None, None


def _cast(t, dtype):
    return None if t is None else t.to(dtype)


def logprob_entropy(hidden, weight, targets, temperature=1.0, chunk_size=4096, with_entropy=True,
                    use_triton=None):
    """hidden [N, H], weight [V, H], targets [N] long -> (logp [N], entropy [N] or None).

    logp = log softmax(hidden @ weight^T / temperature)[target] and the entropy of
    that distribution, both float32 (float64 for float64 inputs), both
    differentiable wrt hidden and weight. Peak extra memory O(chunk_size * V).
    use_triton: None picks the Triton kernels when available and the tensors are
    on CUDA in fp32/bf16/fp16; True insists; False forces the torch path.
    """
    _check(hidden, weight, targets, temperature, chunk_size)
    temperature = float(temperature)
    triton_ok = (triton_logprob is not None and hidden.is_cuda
                 and hidden.dtype in (torch.float32, torch.bfloat16, torch.float16))
    if use_triton and not triton_ok:
        raise ValueError(
            f"use_triton=True needs triton and CUDA fp32/bf16/fp16 tensors; got triton "
            f"{'present' if triton_logprob is not None else 'absent'}, {hidden.device}, {hidden.dtype}"
        )
    use_triton = triton_ok if use_triton is None else bool(use_triton)
    out = _LogprobEntropy.apply(hidden, weight, targets, temperature, int(chunk_size),
                                bool(with_entropy), use_triton)
    return out if with_entropy else (out, None)


def _check(hidden, weight, targets, temperature, chunk_size):
    """One clear error per bad argument, before any work."""
    if hidden.dim() != 2:
        raise ValueError(f"hidden must be [N, H], got shape {tuple(hidden.shape)}")
    if weight.dim() != 2 or weight.shape[1] != hidden.shape[1]:
        raise ValueError(f"weight must be [V, H={hidden.shape[1]}], got shape {tuple(weight.shape)}")
    if not hidden.is_floating_point() or hidden.dtype != weight.dtype:
        raise ValueError(f"hidden and weight must share a float dtype, got {hidden.dtype} and {weight.dtype}")
    if hidden.device != weight.device or targets.device != hidden.device:
        raise ValueError(f"hidden, weight, targets must be on one device, got "
                         f"{hidden.device}, {weight.device}, {targets.device}")
    if targets.dtype != torch.long or targets.shape != hidden.shape[:1]:
        raise ValueError(f"targets must be int64 [N={hidden.shape[0]}], got {targets.dtype} "
                         f"{tuple(targets.shape)}")
    try:
        t = float(temperature)
    except (TypeError, ValueError):
        t = float("nan")
    if not 0.0 < t < float("inf"):
        raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}")
    if not isinstance(chunk_size, int) or chunk_size <= 0:
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
    if targets.numel() > 0:
        lo, hi = torch.stack([targets.min(), targets.max()]).tolist()  # one host sync, worth a clear error
        if lo < 0 or hi >= weight.shape[0]:
            raise ValueError(f"targets must lie in [0, V={weight.shape[0]}), got min {lo} max {hi}")
