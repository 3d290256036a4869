"""Attention dispatch shared by the generator and the trainer.

Two entry points, both on packed (unpadded) queries:

- `varlen_attention`: causal self-attention over packed sequences
  (`cu_seqlens`), used by training, scoring and anything without a cache.
- `cache_attention`: queries of some rows attend to those rows' KV cache
  (which already holds the new keys). Prefill, chunked continuation and the
  one-token decode step are the same call; query i of a row with Tq new
  tokens and kv_len valid keys sits at position kv_len - Tq + i
  (bottom-right causal alignment, as in FlashAttention).

Chunks (several new tokens per row, e.g. an observation appended to a live
row) go on CUDA in fp16/bf16 to the Triton kernel of kernels/triton_chunk.py,
which reads each row's keys in place with a causal limit per query and no
host sync; elsewhere through one padded SDPA call (`_sdpa_chunks`), whose
boolean mask sent SDPA to a materialising kernel on the H200 (110 ms per
continuation prefill of the 135M shape in the agent loop, half its wall time).

Backends, picked per call: FlashAttention-4 (`fa4`: `flash_attn.cute`, the
CuTe DSL package of requirements-gpu.txt) on a Hopper or newer GPU (compute
capability >= 9) in fp16/bf16, then the `flash_attn` package when installed (CUDA,
fp16/bf16), torch's own FlashAttention `varlen_attn` (torch >= 2.10, CUDA,
fp16/bf16), else a math path that loops over sequences with SDPA. The math
path is the reference the tests compare the others with; it needs host
sync (lengths as Python ints), which is fine on the CPU. When the backend is
picked automatically and is "math" (the CPU, fp32 on CUDA), a decode step
takes the batched `_sdpa_decode` instead (over the first max_kv keys when the
caller knows max_kv, else all L with a mask: no host sync, so an fp32 decode
graph can be captured), and chunks with a known max_kv take `_sdpa_chunks`.

Decode (one query per row) where `varlen_attn` does not read the cache
(torch 2.11 has no seqused_k/block_table; on newer torch the paged path is
opt-in with R1_PAGED=1, untested on a GPU) and flash_attn is absent: the Triton
kernel of kernels/triton_decode.py reads each row's valid keys in place.
Without triton it falls back to `_sdpa_decode`, which gathers every row's
whole slot (all L positions) per layer per step. R1_ATTN forces a backend
for every call, training included: R1_ATTN=sdpa gives that gather+SDPA decode
(the old behaviour), R1_ATTN=triton the kernel even where the paged torch path
exists. With R1_ATTN=sdpa, chunks take the batched SDPA path and training
the math path; with R1_ATTN=triton, everything but decode takes the math path.
R1_DECODE=sdpa switches the decode step alone back to gather+SDPA, and
R1_CHUNKS=sdpa sends chunks to the padded SDPA call, R1_CHUNKS=loop to the
per-row loop (all for comparisons).

fa4 takes packed causal attention (training forward and backward through its
autograd function, scoring, a generator's first prompts): native GQA, no K/V
repeated, the only backend that needs no copy for 16 q / 2 kv heads on torch
2.11. Its import is guarded (any error: absent, silently, so the CPU and GPUs
without the package run as before); R1_FA4=0 stops picking it, R1_ATTN=fa4
forces it (a one-line error where it cannot run). Cache reads (decode, chunks)
stay on the Triton kernels unless R1_FA4_CACHE=1 sends them to fa4 through a
page table of one page per slot and seqused_k (or R1_ATTN=fa4): on one H200
(2026-12-01, bench/h200_fa4.sh) a decode step of 256 rows took fa4 62 us against
Triton's 34 us, and the 3B-shape agent loop ran at 0.71x, so Triton stays the
default for cache reads (bench/results/attention.json). The package is a beta whose
API moves; a call refused for its signature (TypeError) prints one line naming
the version and turns fa4 off for the process, falling back to the next backend;
so does a failed backward, tried once on tiny inputs before the first forward
that builds a graph (a backward that moved would otherwise fail mid-update).
"""
import functools
import inspect
import os
import warnings

import torch
import torch.nn.functional as F

try:  # FlashAttention-4, optional (requirements-gpu.txt); the CuTe DSL may fail in ways other than ImportError
    from flash_attn.cute import flash_attn_varlen_func as fa4_varlen_func
    # its own kernels pass an argument the CuTe DSL cannot type, and it says so at every first compile
    warnings.filterwarnings("ignore", r"Argument aux_data .* cannot be converted to a JitArgument", UserWarning)
except Exception:  # pragma: no cover - depends on the machine
    fa4_varlen_func = None

try:  # the optional GPU package (FlashAttention-2)
    from flash_attn import flash_attn_varlen_func, flash_attn_with_kvcache
except ImportError:  # pragma: no cover - depends on the machine
    flash_attn_varlen_func = flash_attn_with_kvcache = None

try:
    from torch.nn.attention.varlen import varlen_attn
except ImportError:  # pragma: no cover - torch < 2.10
    varlen_attn = None

try:  # Triton is optional: absent in the CPU build of torch
    from kernels import triton_chunk, triton_decode
except ImportError:  # pragma: no cover - depends on the machine
    triton_chunk = triton_decode = None


# torch's varlen_attn gained seqused_k/block_table (KV-cache reads) after 2.10; older ones cannot read a cache.
_PARAMS = inspect.signature(varlen_attn).parameters if varlen_attn is not None else {}
GQA = "enable_gqa" in _PARAMS  # torch 2.11's varlen_attn lacks it: K/V heads are repeated instead
# Reading the cache through varlen_attn's block table (one page per slot) is opt-in, R1_PAGED=1, until it
# has been checked on a GPU: the Triton decode kernel and the batched chunk path have been (torch 2.11).
PAGED = "block_table" in _PARAMS and GQA and os.environ.get("R1_PAGED") == "1"


def _disable_paged():
    global PAGED
    PAGED = False


def fa4_version() -> str:
    try:
        from importlib.metadata import version
        return version("flash-attn-4")
    except Exception:
        return "unknown"


@functools.lru_cache(maxsize=None)
def _capability(device: torch.device) -> tuple:
    return torch.cuda.get_device_capability(device)


def fa4_refusal(q: torch.Tensor) -> str:
    """Why fa4 cannot take this query tensor ('' where it can)."""
    if fa4_varlen_func is None:
        return "flash_attn.cute is not importable (pip install -r requirements-gpu.txt)"
    if not q.is_cuda or q.dtype not in (torch.float16, torch.bfloat16):
        return f"it needs a CUDA fp16/bf16 tensor, got {q.device.type} {q.dtype}"
    major = _capability(q.device)[0]
    if not 9 <= major <= 12:  # 4.0.0b36's interface.py asserts 8.x-12.x; 8.x keeps torch's kernels here
        return f"it takes compute capability 9.x to 12.x (Hopper, Blackwell), this GPU has {_capability(q.device)}"
    d = q.shape[-1]  # the head dims its 4.0.0b36 sources accept (interface.py _validate_head_dims)
    if d % 8 or not (8 <= d <= (256 if major == 9 else 128) or d == 256):
        return f"head dim {d} is not one it takes on compute capability {major}.x"
    return ""


def fa4_reads_cache() -> bool:
    """R1_FA4_CACHE=1: an automatically picked fa4 reads the KV cache too (decode, chunks); else Triton."""
    return os.environ.get("R1_FA4_CACHE") == "1"


def pick_backend(q: torch.Tensor) -> str:
    """'fa4', 'flash_attn', 'torch_flash' or 'math' for a query tensor; R1_ATTN overrides."""
    forced = os.environ.get("R1_ATTN")
    if forced == "fa4" and fa4_refusal(q):
        raise RuntimeError(f"R1_ATTN=fa4: {fa4_refusal(q)}")
    if forced:
        return forced
    if fa4_varlen_func is not None and os.environ.get("R1_FA4") != "0" and not fa4_refusal(q):
        return "fa4"
    return _without_fa4(q)


def _without_fa4(q: torch.Tensor) -> str:
    """The automatic pick when fa4 is not there (the pick before fa4 existed)."""
    if q.is_cuda and q.dtype in (torch.float16, torch.bfloat16):
        if flash_attn_varlen_func is not None:
            return "flash_attn"
        if varlen_attn is not None:
            return "torch_flash"
    return "math"


def _sdpa(q, k, v, causal_offset):
    """q [Tq, Hq, D], k/v [Tk, Hkv, D] -> [Tq, Hq, D]; query i sees keys <= i + causal_offset."""
    hq, hkv = q.shape[1], k.shape[1]
    if hq != hkv:
        k = k.repeat_interleave(hq // hkv, dim=1)
        v = v.repeat_interleave(hq // hkv, dim=1)
    tq, tk = q.shape[0], k.shape[0]
    qi = torch.arange(tq, device=q.device)[:, None]
    kj = torch.arange(tk, device=q.device)[None, :]
    mask = kj <= qi + causal_offset  # [Tq, Tk]
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask
    )
    return out.transpose(0, 1)


def varlen_attention(q, k, v, cu_seqlens, max_seqlen: int, backend: str | None = None, kv=None):
    """Causal attention over packed sequences.

    q [N, Hq, D], k/v [N, Hkv, D], cu_seqlens [S+1] int32 (sequence i is
    rows cu[i]:cu[i+1]), max_seqlen: longest sequence -> out [N, Hq, D].

    kv = (index [N'], cu_k [S+1] int32, max_k): sequence i's keys and values
    are rows index[cu_k[i]:cu_k[i+1]] of k/v, which may start with rows of
    another sequence (a shared prompt computed once: r1/packing.py), and its
    queries are the last of them (bottom-right causal alignment, as every
    backend here has it). None: each sequence attends to its own rows.
    """
    cu_k, max_k = cu_seqlens, max_seqlen
    if kv is not None:
        index, cu_k, max_k = kv
        k, v = k.index_select(0, index), v.index_select(0, index)
    backend = backend or pick_backend(q)
    if backend == "fa4":
        out = _fa4(q, k, v, cu_seqlens_q=cu_seqlens, cu_seqlens_k=cu_k, max_seqlen_q=max_seqlen, max_seqlen_k=max_k)
        if out is not None:
            return out
        backend = _without_fa4(q)  # the API moved: fa4 is off now
    if backend == "flash_attn":
        return flash_attn_varlen_func(q, k, v, cu_seqlens, cu_k, max_seqlen, max_k, causal=True)
    if backend == "torch_flash":
        if not GQA and q.shape[1] != k.shape[1]:
            k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
            v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
            return varlen_attn(q, k, v, cu_seqlens, cu_k, max_seqlen, max_k, window_size=(-1, 0))
        return varlen_attn(q, k, v, cu_seqlens, cu_k, max_seqlen, max_k,
                           window_size=(-1, 0), enable_gqa=q.shape[1] != k.shape[1])
    bounds, kb = cu_seqlens.tolist(), cu_k.tolist()
    out = torch.empty_like(q)
    for s, e, ks, ke in zip(bounds[:-1], bounds[1:], kb[:-1], kb[1:]):
        if e > s:
            out[s:e] = _sdpa(q[s:e], k[ks:ke], v[ks:ke], (ke - ks) - (e - s))
    return out


def cache_attention(q, k_cache, v_cache, cu_q, max_q: int, rows, kv_lens, backend: str | None = None,
                    max_kv: int = 0, blocks=None):
    """Queries of B rows attend to their rows of a KV cache.

    q [Nq, Hq, D] packed (row b owns q[cu_q[b]:cu_q[b+1]]), k_cache/v_cache
    [S, L, Hkv, D] (S slots of L positions), rows [B] long: the slot of each
    row, kv_lens [B] int32: valid keys per row, new ones included -> [Nq, Hq, D].
    max_kv: the largest kv_lens (a host int; 0 = unknown, read all L), bounds what
    the batched chunk path reads.
    blocks: a block map of cu_q (block_map), for chunks whose rows may have any
    length, decode rows among them (a mixed step, r1/generate.py): where the Triton
    chunk kernel is the backend, by_row_attention takes them (no max_q needed).
    """
    picked = backend is None and not os.environ.get("R1_ATTN")
    backend = backend or pick_backend(q)
    B = rows.shape[0]
    decode = q.shape[0] == B and max_q == 1
    if backend == "fa4" and picked and not fa4_reads_cache():
        backend = _without_fa4(q)  # cache reads through fa4 are opt-in: the path of a machine without fa4
    if backend == "fa4":
        # One page per slot (page size L), as torch_flash's paged path: no cache row copied, no host sync
        # (max_q is the bucket's bound; 0 for a mixed by_row step: no bound given).
        out = _fa4(q, k_cache, v_cache, cu_seqlens_q=cu_q, max_seqlen_q=max_q or None, seqused_k=kv_lens,
                   page_table=rows.to(torch.int32)[:, None])
        if out is not None:
            return out
        backend = _without_fa4(q)
    if picked and backend == "math" and (max_kv > 0 or decode):
        # No GPU kernel applies (the CPU, fp32 on CUDA): the batched SDPA calls (one per layer, not one
        # per row). A decode step needs no host sync on that path (max_kv = 0: it masks all L keys), so a
        # captured fp32 decode graph works; backend="math" keeps the per-row loop, the reference. After the
        # fa4 lines: where fa4 is installed but not reading the cache, the same path as without it.
        backend = "sdpa"
    if backend == "torch_flash" and not PAGED:
        backend = _decode_fallback(q, k_cache, v_cache, decode)
    if backend == "torch_flash":
        # One page per slot: the block table maps each row to its slot, so no
        # cache row is ever copied, and decode needs no host sync (graph-safe).
        try:
            return varlen_attn(q, k_cache, v_cache, cu_q, None, max_q, k_cache.shape[1],
                               window_size=(-1, 0), enable_gqa=q.shape[1] != k_cache.shape[2],
                               seqused_k=kv_lens, block_table=rows.to(torch.int32)[:, None])
        except (RuntimeError, TypeError, ValueError) as e:  # e.g. a page size this torch build refuses
            _disable_paged()
            backend = _decode_fallback(q, k_cache, v_cache, decode)
            print(f"kernels.attention: varlen_attn cannot read the cache here ({str(e)[:120]}); using {backend}")
    if backend == "triton" and decode:  # reads each row's kv_lens[b] keys in place, graph-safe
        return triton_decode.decode_attention(q, k_cache, v_cache, rows, kv_lens)
    if backend == "triton_chunk" and blocks is not None:  # rows of any length, decode rows among them
        return by_row_attention(q, k_cache, v_cache, cu_q, rows, kv_lens, blocks)
    if backend == "triton_chunk":  # chunks: each row's keys read in place, causal per query, no host sync
        return triton_chunk.chunk_attention(q, k_cache, v_cache, cu_q, max_q, rows, kv_lens)
    if backend == "sdpa" and decode:  # decode fallback: batched SDPA over the rows' caches (max_kv keys if known)
        L = max_kv or k_cache.shape[1]
        return _sdpa_decode(q, k_cache[rows, :L], v_cache[rows, :L], kv_lens)
    if backend == "flash_attn" and decode:  # decode: one query per row
        out = flash_attn_with_kvcache(q[:, None], k_cache, v_cache, cache_seqlens=kv_lens,
                                      cache_batch_idx=rows.to(torch.int32), causal=True)
        return out[:, 0]
    if backend in ("sdpa", "flash_attn") and os.environ.get("R1_CHUNKS") != "loop":
        # chunks (continuations): one padded SDPA call, not a loop over rows (R1_CHUNKS=loop: the loop)
        return _sdpa_chunks(q, k_cache, v_cache, cu_q, max_q, rows, kv_lens, max_kv or k_cache.shape[1])
    bounds, lens, slots = cu_q.tolist(), kv_lens.tolist(), rows.tolist()
    out = torch.empty_like(q)
    for b in range(B):
        s, e, n = bounds[b], bounds[b + 1], lens[b]
        if e > s:
            out[s:e] = _sdpa(q[s:e], k_cache[slots[b], :n], v_cache[slots[b], :n], n - (e - s))
    return out


_FA4_BACKWARD_OK: set = set()  # (dtype, q heads, kv heads, head dim) whose backward ran in _fa4_backward_probe


def _fa4(q, k, v, **kw):
    """flash_attn.cute's varlen call, causal (bottom-right aligned), native GQA -> out, or None where the
    installed version refuses the call's signature: one printed line, fa4 off for the process. A call that
    builds a graph first has its backward tried once (_fa4_backward_probe): a backward that moved would
    otherwise surface in the middle of loss.backward(), past any fallback."""
    global fa4_varlen_func
    if fa4_varlen_func is None:  # turned off earlier in this process (a call named the backend anyway)
        return None
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        if not _fa4_backward_probe(q, k):
            return None
    try:
        out = fa4_varlen_func(q, k, v, causal=True, **kw)
    except TypeError as e:  # the beta's API moved (a keyword renamed or gone); shapes it refuses still raise
        fa4_varlen_func = None
        print(f"kernels.attention: flash-attn-4 {fa4_version()} refused the call ({str(e)[:160]}); fa4 off")
        return None
    return out[0] if isinstance(out, tuple) else out  # (out, lse) in 4.0.0b36


def _fa4_backward_probe(q, k) -> bool:
    """Forward and backward of fa4 on two tiny sequences with q's and k's heads, dtype and device (the kernels
    the real call compiles anyway), once per such shape: True where both ran; else one printed line, fa4 off
    for the process, False. The inputs are valid by construction, so any error means this install cannot
    train here."""
    global fa4_varlen_func
    key = (q.dtype, q.shape[1], k.shape[1], q.shape[2])
    if key in _FA4_BACKWARD_OK:
        return True
    g = torch.Generator(device=q.device).manual_seed(0)
    qp, kp, vp = (torch.randn(8, h, q.shape[2], generator=g, device=q.device).to(q.dtype).requires_grad_()
                  for h in (q.shape[1], k.shape[1], k.shape[1]))
    cu = torch.tensor([0, 3, 8], dtype=torch.int32, device=q.device)
    try:
        # plain saved tensors: the probe may run inside a checkpointed block's forward (activation
        # checkpointing), whose hooks would otherwise take the probe's tensors and re-run the block for them
        with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
            out = fa4_varlen_func(qp, kp, vp, causal=True, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=5,
                                  max_seqlen_k=5)
            (out[0] if isinstance(out, tuple) else out).float().sum().backward()
    except torch.OutOfMemoryError:  # the GPU is full, not fa4 broken: the real call would say the same
        raise
    except Exception as e:  # noqa: BLE001 - any failure on valid inputs: this install does not train here
        fa4_varlen_func = None
        print(f"kernels.attention: flash-attn-4 {fa4_version()} failed a backward probe "
              f"({type(e).__name__}: {str(e)[:140]}); fa4 off")
        return False
    _FA4_BACKWARD_OK.add(key)
    return True


def block_map(cu_q, n_blocks: int, block_m: int = 16):
    """The work list of a chunk whose rows may have any length -> (row, block) int32 [n_blocks] each.

    Entry j names a row with more than one query and a block of block_m of its queries; entries past the
    last are row -1. n_blocks must be >= sum(ceil(n_b / block_m)) over those rows: Nq // block_m + B is.
    Torch ops on the device with static shapes (no host value), so a CUDA graph holds them: the Triton
    chunk kernel's grid then depends on n_blocks only, not on max_q, and rows with one query cost it
    nothing (the decode kernel takes them)."""
    n = cu_q[1:] - cu_q[:-1]
    blocks = torch.where(n > 1, (n + block_m - 1) // block_m, 0).to(torch.int64)
    cum = torch.cumsum(blocks, 0)
    j = torch.arange(n_blocks, device=cu_q.device)
    row = torch.searchsorted(cum, j, right=True).clamp_(max=max(n.shape[0] - 1, 0))
    mb = j - (cum[row] - blocks[row])
    live = j < cum[-1:] if n.shape[0] else torch.zeros_like(j, dtype=torch.bool)
    return torch.where(live, row, -1).to(torch.int32), mb.to(torch.int32)


def by_row_attention(q, k_cache, v_cache, cu_q, rows, kv_lens, blocks):
    """A chunk whose rows may have any length (a mixed step: decode rows and continuations in one forward):
    rows with one query take the Triton decode kernel, the others the chunk kernel through the block map.
    Each kernel reads only its rows' keys; both write into one output. No host value: graph-safe."""
    out = torch.empty_like(q)
    triton_decode.decode_attention(q, k_cache, v_cache, rows, kv_lens, cu_q=cu_q, out=out)
    triton_chunk.chunk_attention(q, k_cache, v_cache, cu_q, 0, rows, kv_lens, blocks=blocks, out=out)
    return out


def _decode_fallback(q, k_cache, v_cache, decode):
    """'triton' for a CUDA fp16/bf16 decode step the Triton kernel can take, 'triton_chunk' for such a
    chunk, else 'sdpa'.

    R1_DECODE=sdpa keeps the gather+SDPA decode while every other call keeps its fast backend;
    R1_CHUNKS=sdpa (the batched padded SDPA call) or loop (the per-row loop) does the same for chunks.
    """
    fits = (triton_decode is not None and q.is_cuda and q.dtype in (torch.float16, torch.bfloat16)
            and triton_decode.supports(q, k_cache, v_cache))
    if decode:
        return "triton" if fits and os.environ.get("R1_DECODE") != "sdpa" else "sdpa"
    return "triton_chunk" if fits and os.environ.get("R1_CHUNKS") not in ("sdpa", "loop") else "sdpa"


def _sdpa_decode(q, k, v, kv_lens):
    """One query per row: q [B, Hq, D], k/v [B, L, Hkv, D], kv_lens [B] -> [B, Hq, D].

    GQA without copying keys: the G query heads sharing a KV head become G
    query rows of that head (they sit at the same position, so one mask).
    """
    B, Hq, D = q.shape
    L, Hkv = k.shape[1], k.shape[2]
    G = Hq // Hkv
    qg = q.view(B, Hkv, G, D)
    mask = (torch.arange(L, device=q.device)[None, :] < kv_lens[:, None])[:, None, None, :]  # [B,1,1,L]
    out = F.scaled_dot_product_attention(qg, k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask)
    return out.reshape(B, Hq, D)


CHUNK_MASK_ELEMENTS = 1 << 27  # bound on B x Hq x max_q x max_kv (the scores) per SDPA call of _sdpa_chunks


def _sdpa_chunks(q, k_cache, v_cache, cu_q, max_q: int, rows, kv_lens, max_kv: int):
    """Several new tokens per row (chunked prefill of observations), all rows in one SDPA call.

    The per-row math loop costs ~10 kernel launches per row per layer plus
    three host syncs per layer; a turn boundary of 256 episodes made that the
    slowest part of multi-turn rollouts. Here queries are padded to
    [B, max_q], keys read from the rows' slots up to max_kv, and the mask is
    bottom-right causal per row (query i of a row with n new tokens and
    kv_len keys sits at kv_len - n + i). GQA without copying keys, as in
    _sdpa_decode: the G query heads of a KV head become G x max_q query rows.
    Padding queries see at least key 0 (no NaN) and are dropped. No host
    sync unless the scores would pass CHUNK_MASK_ELEMENTS, when rows go in groups.
    """
    Nq, Hq, D = q.shape
    B, Hkv = rows.shape[0], k_cache.shape[2]
    G = Hq // Hkv
    per_row = Hq * max_q * max_kv  # scores per row: SDPA's math backend materialises them
    if B > 1 and B * per_row > CHUNK_MASK_ELEMENTS:
        step = max(1, CHUNK_MASK_ELEMENTS // per_row)
        bounds = cu_q.tolist()
        out = torch.empty_like(q)
        for b0 in range(0, B, step):
            b1 = min(B, b0 + step)
            s, e = bounds[b0], bounds[b1]
            out[s:e] = _sdpa_chunks(q[s:e], k_cache, v_cache, cu_q[b0:b1 + 1] - s, max_q, rows[b0:b1],
                                    kv_lens[b0:b1], max_kv)
        return out
    dev = q.device
    n_new = (cu_q[1:] - cu_q[:-1]).long()  # [B]
    tok_row = torch.repeat_interleave(torch.arange(B, device=dev), n_new, output_size=Nq)
    flat = tok_row * max_q + (torch.arange(Nq, device=dev) - cu_q[:-1].long()[tok_row])
    qp = q.new_zeros(B * max_q, Hq, D).index_copy_(0, flat, q)
    qp = qp.view(B, max_q, Hkv, G, D).permute(0, 2, 3, 1, 4).reshape(B, Hkv, G * max_q, D)
    k = k_cache[rows, :max_kv].transpose(1, 2)  # [B, Hkv, max_kv, D]
    v = v_cache[rows, :max_kv].transpose(1, 2)
    qpos = (kv_lens.long() - n_new)[:, None] + torch.arange(max_q, device=dev)[None, :]  # [B, max_q]
    mask = torch.arange(max_kv, device=dev)[None, None, :] <= qpos[:, :, None]  # [B, max_q, max_kv]
    mask = mask[:, None].expand(B, G, max_q, max_kv).reshape(B, 1, G * max_q, max_kv)
    out = F.scaled_dot_product_attention(qp, k, v, attn_mask=mask)  # [B, Hkv, G * max_q, D]
    out = out.view(B, Hkv, G, max_q, D).permute(0, 3, 1, 2, 4).reshape(B * max_q, Hq, D)
    return out[flat]
