"""The Transformer every model family runs: Llama-shaped blocks with the switches of r1/families.

One file, one config dataclass, every op of a layer on one screen. The core forward is packed:
token ids [N] with position ids [N] and `cu_seqlens` (no padding, no attention mask). The same
forward serves training and scoring (packed steps, `kernels.attention.varlen_attention`) and the
generator (prefill, chunked continuation and decode write their keys into a `KVCache` and attend
through `kernels.attention.cache_attention`), so sampler and trainer run the same ops and their
logprobs agree by construction. `model(input_ids)` with a [B, T] tensor is the convenience form
returning [B, T, vocab] logits. Parameter names are Hugging Face's, so checkpoints load without a
name map. What differs between families (q/k/v biases, q/k norms, Llama 3's rope scaling, layers
without RoPE) is a ModelConfig field that r1/families sets from the HF config. With
`value_head=True` the LM head is replaced by a scalar head (the critic).
"""
import math
from dataclasses import asdict, dataclass, replace
from types import SimpleNamespace

import torch
import torch.nn as nn
import torch.nn.functional as F

from kernels.attention import block_map, cache_attention, varlen_attention
from kernels.logprob import logprob_entropy
from r1.environment import moved_switch
from r1 import families


@dataclass
class ModelConfig:
    arch: str = "llama"  # a registered family (r1/families): llama, qwen2, qwen3, mistral, smollm3
    vocab_size: int = 49152
    hidden_size: int = 576
    intermediate_size: int = 1536
    num_layers: int = 30
    num_heads: int = 9
    num_kv_heads: int = 3
    head_dim: int = 64
    rope_theta: float = 10000.0
    rms_eps: float = 1e-5
    tie_embeddings: bool = True
    qkv_bias: bool = False  # qwen2
    qk_norm: bool = False  # qwen3
    max_position_embeddings: int = 8192
    bos_token_id: int | None = None
    eos_token_id: int | list | None = None
    rope_llama3: tuple | None = None  # Llama 3.x: (factor, low_freq_factor, high_freq_factor, original context)
    rope_layers: tuple | None = None  # per layer, 1 = RoPE, 0 = none (SmolLM3's NoPE layers); None: all RoPE

    @classmethod
    def from_hf(cls, hf: dict) -> "ModelConfig":
        family = families.get(hf.get("model_type"))
        scaling = hf.get("rope_scaling") or (hf.get("rope_parameters") or {})
        theta = hf.get("rope_theta", scaling.get("rope_theta", 10000.0))
        return cls(
            arch=family.name, vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"], num_layers=hf["num_hidden_layers"],
            num_heads=hf["num_attention_heads"],
            num_kv_heads=hf.get("num_key_value_heads") or hf["num_attention_heads"],
            head_dim=hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"],
            rope_theta=float(theta), rms_eps=hf.get("rms_norm_eps", 1e-6),
            tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
            max_position_embeddings=hf.get("max_position_embeddings", 8192),
            bos_token_id=hf.get("bos_token_id"), eos_token_id=hf.get("eos_token_id"),
            rope_llama3=rope_llama3(scaling, hf), **family.switches(hf),
        )

    def to_hf(self, dtype: torch.dtype = torch.float32) -> dict:
        family = families.get(self.arch)
        hf = {
            "architectures": [family.architecture], "model_type": self.arch,
            "vocab_size": self.vocab_size, "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size, "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads, "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim, "rope_theta": self.rope_theta, "rms_norm_eps": self.rms_eps,
            "tie_word_embeddings": self.tie_embeddings, "hidden_act": "silu",
            "max_position_embeddings": self.max_position_embeddings,
            "torch_dtype": str(dtype).removeprefix("torch."), "dtype": str(dtype).removeprefix("torch."),
            "bos_token_id": self.bos_token_id, "eos_token_id": self.eos_token_id,
        }
        if self.rope_llama3 is not None:
            factor, low, high, original = self.rope_llama3
            hf["rope_parameters"] = {"rope_type": "llama3", "rope_theta": self.rope_theta, "factor": factor,
                                     "low_freq_factor": low, "high_freq_factor": high,
                                     "original_max_position_embeddings": original}
        return {**hf, **family.hf_keys(self)}

    def replace(self, **kw) -> "ModelConfig":
        return ModelConfig(**{**asdict(self), **kw})


def rope_llama3(scaling: dict, hf: dict) -> tuple | None:
    """An HF config's rope scaling -> ModelConfig.rope_llama3 (None: plain RoPE); other kinds are refused."""
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind in ("default", None):
        return None
    if kind != "llama3":
        raise ValueError(f"unsupported rope scaling {scaling!r} (plain RoPE and rope_type llama3 are implemented)")
    keys = ("factor", "low_freq_factor", "high_freq_factor")
    missing = [k for k in keys if not isinstance(scaling.get(k), (int, float))]
    if missing:
        raise ValueError(f"rope scaling llama3 needs a number for {', '.join(missing)}, got {scaling!r:.120}")
    original = scaling.get("original_max_position_embeddings", hf.get("max_position_embeddings", 8192))
    return (*(float(scaling[k]) for k in keys), int(original))


def tiny_config(arch: str = "llama", tie: bool = True, vocab_size: int = 256, **kw) -> ModelConfig:
    """A few-layer random model of a family (r1/families) for CPU tests and the smoke config."""
    base = dict(arch=arch, vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_layers=2,
                num_heads=4, num_kv_heads=2, head_dim=16, tie_embeddings=tie, rms_eps=1e-6, rope_theta=10000.0)
    base.update(families.get(arch).tiny(kw.get("num_layers", base["num_layers"])))
    base.update(kw)
    return ModelConfig(**base)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return OPS.rms_norm(x, self.weight, self.eps)


def rms_norm(x, weight, eps: float):
    """HF's RMSNorm: normalise in fp32, round to x's dtype, then scale. A float64 model normalises in float64:
    HF's cast to fp32 there rounds every row to float32, which made float64 comparisons of two ways to compute
    the same gradient (a shared prompt's rows summed before the norm's backward, or after) differ by 1e-7."""
    dtype = x.dtype
    x = x if dtype == torch.float64 else x.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(dtype)


def rope_cos_sin(position_ids, head_dim: int, theta: float, dtype, llama3: tuple | None = None):
    """position_ids [N] -> cos, sin [N, head_dim] (HF layout: halves duplicated), fp32 math."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device=position_ids.device).float() / head_dim))
    if llama3 is not None:
        inv_freq = llama3_inv_freq(inv_freq, *llama3)
    freqs = position_ids.float()[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def llama3_inv_freq(inv_freq, factor: float, low: float, high: float, original: int):
    """Llama 3.1's rope scaling, as transformers computes it: frequencies whose wavelength exceeds
    original / low are divided by `factor`, those under original / high kept, the band between blended."""
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > original / low, inv_freq / factor, inv_freq)
    smooth = (original / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < original / high) * ~(wavelen > original / low)
    return torch.where(medium, smoothed, scaled)


def apply_rope(x, cos, sin):
    """x [N, H, D]; cos/sin [N, D]."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


def add_rms_norm(x, delta, weight, eps: float):
    """The residual add and the next RMSNorm: (x + delta, rms_norm(x + delta)), one kernel when compiled."""
    x = x + delta
    return x, rms_norm(x, weight, eps)


def rope_qk(q, k, cos, sin, dtype):
    """RoPE on queries and keys, cast to the attention dtype (under autocast they follow the fp32 tables)."""
    return apply_rope(q, cos, sin).to(dtype), apply_rope(k, cos, sin).to(dtype)


def rope_write(q, k, v, cos, sin, dtype, k_cache, v_cache, slots, positions):
    """rope_qk, then write the new keys and values into the cache at (slot, position) of each token.

    One op so that, compiled, the cache writes fuse with the rotation: eager, they are two index_put
    launches per layer; compiled, one kernel per layer writes both (docs/decisions.md, "Compiled elementwise ops and fused projections").
    """
    q, k = rope_qk(q, k, cos, sin, dtype)
    k_cache[slots, positions] = k.to(k_cache.dtype)
    v_cache[slots, positions] = v.to(v_cache.dtype)
    return q, k


def swiglu(gate, up):
    return F.silu(gate) * up


# The elementwise ops of a layer, looked up at call time so `compile_ops()` can swap in fused versions
# for the whole process: the generator and the trainer then run the same kernels, as before.
OPS = SimpleNamespace(rms_norm=rms_norm, add_rms_norm=add_rms_norm, rope_qk=rope_qk, rope_write=rope_write,
                      swiglu=swiglu, fuse_train=False, compile="auto")  # fuse_train: concat_linear; use_ops


def compile_ops(on: bool | str = True):
    """Fuse each elementwise op (RMSNorm, add + RMSNorm, RoPE [+ cache write], SwiGLU) with torch.compile.

    Eager, a layer launches ~35 kernels, most of them tiny elementwise ones;
    inside a captured decode graph each still costs a few microseconds of GPU
    time, so a decode step spends milliseconds on them (docs/decisions.md). on=True
    compiles them for every device, on="cuda" for CUDA tensors only (the
    default: kernels.compile=auto; the CPU keeps eager ops, with no compiler and no
    compile time), on=False restores eager (kernels.compile=false). Compiled ops can round differently from eager
    ones by an ulp, sampler and trainer alike: both call the same OPS.
    """
    def cuda_only(fn):
        compiled = None

        def op(*args):
            nonlocal compiled
            if not args[0].is_cuda:
                return fn(*args)
            if compiled is None:  # torch.compile (and dynamo's import) only once a CUDA tensor comes
                compiled = _compile(fn)
            return compiled(*args)
        return op

    wrap = {True: _compile, "cuda": cuda_only}.get(on, lambda f: f)
    OPS.rms_norm, OPS.add_rms_norm = wrap(rms_norm), wrap(add_rms_norm)
    OPS.rope_qk, OPS.rope_write, OPS.swiglu = wrap(rope_qk), wrap(rope_write), wrap(swiglu)


_fallbacks = 0  # compiled-op calls that ran eager because some thread was FX-tracing (see _compile)


def eager_fallbacks() -> int:
    """How many compiled-op calls so far ran eager because another thread was FX-tracing (see _compile)."""
    return _fallbacks


def tracing() -> bool:
    """Whether some thread of this process is FX-tracing now (torch compiling, say): the flag is global."""
    return torch.fx._symbolic_trace.is_fx_symbolic_tracing()


def _compile(fn):
    import torch._dynamo

    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    # FX tracing is process-wide (a global flag, a patched Module.__call__): while one thread compiles (the
    # update's backward graphs, say), the overlapped rollout thread (r1/overlap.py) can call a compiled op, and
    # by default dynamo raises there (it did, on an H200, 2026-12-02). Off, the op runs eager for that call
    # (rounding-level differences), counted: a CUDA graph captured meanwhile would keep the eager kernels, so
    # chunk_graphs.capture recaptures when the count moved. (Two threads never trace at once: dynamo's
    # compile_lock; r1 itself never calls make_fx.)
    torch._dynamo.config.error_on_nested_fx_trace = False
    compiled = torch.compile(fn)

    def op(*args):
        global _fallbacks
        if tracing():
            _fallbacks += 1
        return compiled(*args)
    return op


def use_ops(compile: str = "auto", fuse_train: bool = False):
    """The process's OPS, as the config's kernels.compile and kernels.fuse_train ask: compile auto = compiled
    for CUDA tensors only, true = everywhere, false = eager (compile_ops); fuse_train: concat_linear."""
    compile_ops({"auto": "cuda", "true": True, "false": False}[compile])
    OPS.compile, OPS.fuse_train = compile, fuse_train


def paths_in_use(cuda: bool, fuse: bool | None = None) -> dict:
    """The paths in use, for benchmarks to record: compiled ops (OPS), fused projections (a generator's `fuse`:
    None = its default, on CUDA), fused trained projections (OPS)."""
    return {"compiled_ops": OPS.compile == "true" or (OPS.compile == "auto" and cuda),
            "fused_projections": cuda if fuse is None else fuse,
            "fused_train_projections": OPS.fuse_train}


def default_ops():
    """The default OPS (kernels.compile=auto, kernels.fuse_train=false)."""
    use_ops()


@dataclass
class KVCache:
    """Preallocated keys/values: k, v [layers, slots, max_len, kv_heads, head_dim]."""
    k: torch.Tensor
    v: torch.Tensor

    @classmethod
    def empty(cls, cfg: ModelConfig, slots: int, max_len: int, dtype, device) -> "KVCache":
        shape = (cfg.num_layers, slots, max_len, cfg.num_kv_heads, cfg.head_dim)
        return cls(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))


@dataclass
class CacheStep:
    """Where a packed batch of new tokens goes in the cache.

    rows [B] long: slot of each row; token_rows [Nq] long: row index (0..B-1)
    of each token; cu_q [B+1] int32; max_q: longest row (Python int);
    kv_lens [B] int32: valid cache length per row after this step.
    The write position of a token is its position id. `fresh` (every row's
    tokens start at position 0) lets a first prefill attend within the packed
    new tokens, with the training kernel, instead of reading the cache.
    `by_row` (chunks that extend live rows: continuations, and the mixed step
    of r1/generate.py, where decode rows bring one token each): attention
    dispatches on the device per row (kernels/attention.py by_row_attention),
    through a block map made once per forward, so a graph needs no max_q.
    """
    rows: torch.Tensor
    token_rows: torch.Tensor
    cu_q: torch.Tensor
    max_q: int
    kv_lens: torch.Tensor
    fresh: bool = False  # every row starts at position 0: attend within the new tokens (packed flash path)
    max_kv: int = 0  # max of kv_lens as a host int (0 = unknown): bounds the keys a chunk reads
    token_slots: torch.Tensor | None = None  # rows[token_rows], the slot of each token: set once per forward
    by_row: bool = False  # rows of any length (one token: decode kernel; more: chunk kernel)
    blocks: tuple | None = None  # by_row on CUDA: kernels.attention.block_map(cu_q): set once per forward


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        h, d = cfg.hidden_size, cfg.head_dim
        self.q_proj = nn.Linear(h, cfg.num_heads * d, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(h, cfg.num_kv_heads * d, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(h, cfg.num_kv_heads * d, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(cfg.num_heads * d, h, bias=False)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(d, cfg.rms_eps)
            self.k_norm = RMSNorm(d, cfg.rms_eps)
        self.fused = None  # (weight, bias, ...) holding q/k/v_proj as views: see fuse_projections

    def forward(self, x, cos, sin, packed, cache_kv=None, step: CacheStep | None = None, positions=None):
        n, cfg = x.shape[0], self.cfg
        nq, nkv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        if _fused_live(self.fused):
            q, k, v = F.linear(x, self.fused[0], self.fused[1]).split([nq, nkv, nkv], dim=-1)
        elif OPS.fuse_train and _plain(self.q_proj, self.k_proj, self.v_proj):
            q, k, v = concat_linear(x, self.q_proj, self.k_proj, self.v_proj).split([nq, nkv, nkv], dim=-1)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q = q.view(n, cfg.num_heads, cfg.head_dim)
        k = k.view(n, cfg.num_kv_heads, cfg.head_dim)
        v = v.view(n, cfg.num_kv_heads, cfg.head_dim)
        if cfg.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        # Under autocast the projections are bf16 but RoPE tables follow the fp32 residual stream;
        # bring q, k back to v's dtype so the attention kernel sees one dtype (flash needs bf16).
        if cache_kv is None:
            q, k = OPS.rope_qk(q, k, cos, sin, v.dtype)
            cu, max_len, kv_rows = packed
            out = varlen_attention(q, k, v, cu, max_len, kv=kv_rows)
        else:
            k_cache, v_cache = cache_kv
            q, k = OPS.rope_write(q, k, v, cos, sin, v.dtype, k_cache, v_cache, step.token_slots, positions)
            if step.fresh:
                out = varlen_attention(q, k, v, step.cu_q, step.max_q)
            else:
                out = cache_attention(q, k_cache, v_cache, step.cu_q, step.max_q, step.rows, step.kv_lens,
                                      max_kv=step.max_kv, blocks=step.blocks)
        return self.o_proj(out.reshape(n, cfg.num_heads * cfg.head_dim))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.fused = None  # (weight, None, ...) holding gate/up_proj as views: see fuse_projections

    def forward(self, x):
        if _fused_live(self.fused):
            gate, up = F.linear(x, self.fused[0]).chunk(2, dim=-1)
        elif OPS.fuse_train and _plain(self.gate_proj, self.up_proj):
            gate, up = concat_linear(x, self.gate_proj, self.up_proj).chunk(2, dim=-1)
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)
        return self.down_proj(OPS.swiglu(gate, up))


def fuse_projections(model: "Transformer"):
    """One matmul for q/k/v and one for gate/up in every layer, for a model that only generates.

    Decode at batch 256 runs k_proj and v_proj (256 x 2048 x 256 for the 3B
    shape) far below the GPU's matmul rate; one [q; k; v] matmul and one
    [gate; up] matmul read the same weights in fewer, fuller kernels. Nothing
    is copied: the projections' weights become views of the fused tensors, so
    state_dict() keys, checkpoints and the trainer's weight sync (copy_ into
    the state_dict) are unchanged. Replacing a parameter (`.to()`,
    load_state_dict(assign=True)) detaches it from the fused tensor; the
    forward then checks that and takes the separate matmuls, so results
    never go stale; so does a forward that wants gradients. Only for models
    that no optimizer holds: fusing replaces the Parameter objects. The
    generator calls this for CUDA models whose parameters need no gradient
    unless kernels.fuse=false (it pays with compiled ops only; docs/decisions.md, "Compiled elementwise ops and fused projections").
    """
    if any("lora_A" in mod._parameters for mod in model.modules()):
        # LoRA (r1/lora.py): a fused matmul would skip an adapted projection's adapters, and fusing the others
        # would copy the base the generator shares with the policy, which no memory plan counts
        return model
    for layer in model.model.layers:
        a, m = layer.self_attn, layer.mlp
        if not _views_intact(a.fused):  # fusing again would free tensors a live generator's graphs read
            a.fused = _fuse_linears(a.q_proj, a.k_proj, a.v_proj)
        if not _views_intact(m.fused):
            m.fused = _fuse_linears(m.gate_proj, m.up_proj)
    return model


def concat_linear(x, *linears):
    """One matmul for several linears of the same input, their weights concatenated in this forward
    (kernels.fuse_train=true: the trainer's q/k/v and gate/up, which fuse_projections leaves apart because they
    want gradients). torch.cat is differentiable, so each parameter gets its slice of the gradient; under
    FSDP2 the forward sees the gathered parameters. What it saves: under autocast the fp32 input is cast
    to bf16 once instead of once per linear (three times for q/k/v), and two or three launches become one,
    forward and backward. The concatenation costs a copy of the layer's projection weights each forward.
    Exact in float64 (tests/test_model.py); in bf16 it rounds differently: one matmul's sum over the outputs
    where the separate casts summed three rounded input gradients."""
    w = torch.cat([l.weight for l in linears])
    b = torch.cat([l.bias for l in linears]) if linears[0].bias is not None else None
    return F.linear(x, w, b)


def _plain(*linears) -> bool:
    """Whether the linears are plain (no LoRA adapters, r1/lora.py), so concat_linear computes them."""
    return all(isinstance(l, nn.Linear) and "lora_A" not in l._parameters for l in linears)


def _fuse_linears(*linears):
    """Concatenate the linears' weights (and biases) into new tensors; each linear's become views of them.

    Returns (weight, bias, params, pointers): the linears' parameters and the addresses they had,
    for _fused_live to check that every one of them is still a view of the fused tensors.
    """
    w = torch.cat([l.weight.detach() for l in linears])
    b = torch.cat([l.bias.detach() for l in linears]) if linears[0].bias is not None else None
    start = 0
    for l in linears:
        n = l.weight.shape[0]
        l.weight = nn.Parameter(w[start:start + n], requires_grad=l.weight.requires_grad)
        if b is not None:
            l.bias = nn.Parameter(b[start:start + n], requires_grad=l.bias.requires_grad)
        start += n
    owners = [(l, name) for l in linears for name in ("weight", "bias") if getattr(l, name) is not None]
    return w, b, owners, [getattr(l, name).data_ptr() for l, name in owners]


def _views_intact(fused) -> bool:
    """Whether every projection is still the view fuse_projections made (no .to(), no assign, for any)."""
    return fused is not None and [getattr(l, name).data_ptr() for l, name in fused[2]] == fused[3]


def _fused_live(fused) -> bool:
    """Whether the forward may take the fused matmul: the views are intact and no gradient is wanted
    (the fused tensors are plain tensors: a backward through them would not reach the parameters)."""
    return _views_intact(fused) and not (torch.is_grad_enabled()
                                         and any(getattr(l, name).requires_grad for l, name in fused[2]))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, packed, cache_kv=None, step=None, positions=None):
        h = self.self_attn(self.input_layernorm(x), cos, sin, packed, cache_kv, step, positions)
        norm = self.post_attention_layernorm
        x, h = OPS.add_rms_norm(x, h, norm.weight, norm.eps)
        return x + self.mlp(h)


class Body(nn.Module):
    """`model.*` in HF names: embeddings, blocks, final norm."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_eps)


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig, value_head: bool = False):
        super().__init__()
        self.cfg = cfg
        self.value_head = value_head
        self.model = Body(cfg)
        if value_head:
            self.score = nn.Linear(cfg.hidden_size, 1, bias=True)
        elif not cfg.tie_embeddings:
            self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    # -- weights -----------------------------------------------------------
    @property
    def head_weight(self) -> torch.Tensor:
        """The [vocab, hidden] output projection (tied: the embedding)."""
        return self.model.embed_tokens.weight if self.cfg.tie_embeddings else self.lm_head.weight

    @classmethod
    def from_pretrained(cls, path_or_name, dtype=torch.float32, device="cpu", value_head: bool = False):
        """HF directory, .gguf file or short name -> model in `dtype` on `device`.

        Built on the meta device, then each tensor is loaded straight into
        place (no random init, no second copy). A value model takes the
        policy's body and a zero-initialised scalar head.
        """
        from r1.weights import check_state_dict, load_checkpoint

        hf_config, state = load_checkpoint(path_or_name, dtype=dtype, device=device)
        cfg = ModelConfig.from_hf(hf_config)
        with torch.device("meta"):
            model = cls(cfg, value_head=value_head)
        expected = {k: v.shape for k, v in model.state_dict().items()}
        if value_head:
            state = {k: v for k, v in state.items() if k.startswith("model.")}
            state.setdefault("score.weight", torch.zeros(1, cfg.hidden_size, dtype=dtype, device=device))
            state.setdefault("score.bias", torch.zeros(1, dtype=dtype, device=device))
        elif cfg.tie_embeddings:
            state.pop("lm_head.weight", None)
        try:
            check_state_dict(expected, state)
        except ValueError as e:
            raise ValueError(f"{path_or_name}: {e}") from None
        model.load_state_dict(state, assign=True)
        return model.to(device=device, dtype=dtype)

    def save_pretrained(self, out_dir, tokenizer=None):
        """Write HF format (safetensors + config.json + tokenizer files)."""
        from r1.weights import save_hf

        if self.value_head:
            raise ValueError("save_pretrained exports policies; a value model has no LM head")
        dtype = self.model.embed_tokens.weight.dtype
        hf = self.cfg.to_hf(dtype)
        tok = getattr(tokenizer, "hf", tokenizer)
        if tok is not None:
            hf["bos_token_id"] = hf["bos_token_id"] if hf["bos_token_id"] is not None else tok.bos_token_id
            hf["eos_token_id"] = hf["eos_token_id"] if hf["eos_token_id"] is not None else tok.eos_token_id
        state = {k: v.detach() for k, v in self.state_dict().items()}
        save_hf(state, hf, out_dir, tokenizer=tok)

    # -- forward -----------------------------------------------------------
    def hidden(self, input_ids, position_ids, cu_seqlens=None, max_seqlen=None, cache: KVCache | None = None,
               step: CacheStep | None = None, kv_rows=None):
        """Packed forward to final normed hidden states: ids [N], positions [N] -> [N, hidden].
        kv_rows: the rows each sequence attends to when they are not its own alone (a shared prompt):
        kernels.attention.varlen_attention's `kv`."""
        x = self.model.embed_tokens(input_ids)
        cos, sin = rope_cos_sin(position_ids, self.cfg.head_dim, self.cfg.rope_theta, x.dtype, self.cfg.rope_llama3)
        rope = self.cfg.rope_layers
        if rope is not None and not all(rope):  # a NoPE layer rotates by angle 0: x * 1 + rotated * 0 is x exactly
            nope = (torch.ones_like(cos), torch.zeros_like(sin))
        if step is not None and step.token_slots is None:  # every layer writes its keys to the same slots
            step = replace(step, token_slots=step.rows[step.token_rows])
        if step is not None and step.by_row and step.blocks is None and step.cu_q.is_cuda:  # one map, every layer
            step = replace(step, blocks=block_map(step.cu_q, input_ids.shape[0] // 16 + step.rows.shape[0]))
        packed = (cu_seqlens, max_seqlen, kv_rows)
        for i, layer in enumerate(self.model.layers):
            kv = None if cache is None else (cache.k[i], cache.v[i])
            c, s = (cos, sin) if rope is None or rope[i] else nope
            x = layer(x, c, s, packed, kv, step, position_ids)
        return self.model.norm(x)

    def head(self, h):
        """Hidden [..., hidden] -> logits [..., vocab] (or values [...] for a value model)."""
        if self.value_head:  # a copy, not a view: FSDP2 warns that a view output can drop its backward hook
            return self.score(h).squeeze(-1).clone()
        return F.linear(h, self.head_weight)

    def forward(self, input_ids, position_ids=None, cu_seqlens=None, max_seqlen=None, cache=None, step=None,
                sel=None, targets=None, temperature: float = 1.0, kv_rows=None):
        """[B, T] ids -> [B, T, vocab] logits; or packed ids [N] (with position_ids,
        cu_seqlens, max_seqlen, or a cache step) -> [N, vocab] logits ([N] values).

        Training form: `sel` [M] picks the positions to score; with `targets`
        [M] the policy returns (logp [M], entropy [M]) of softmax(logits / T)
        through the fused kernel, never materialising [M, vocab] float32
        logits; `sel` may name a position twice (a shared prompt's last token
        predicts each sample's first token). `kv_rows`: a shared prompt's keys
        (r1/packing.py `MicroBatch.kv_rows`). Everything goes through forward
        so FSDP's hooks see it.
        """
        if input_ids.dim() == 2:
            B, T = input_ids.shape
            dev = input_ids.device
            pos = torch.arange(T, device=dev).repeat(B)
            cu = torch.arange(0, (B + 1) * T, T, device=dev, dtype=torch.int32)
            return self.head(self.hidden(input_ids.reshape(-1), pos, cu, T)).view(B, T, -1).squeeze(-1)
        h = self.hidden(input_ids, position_ids, cu_seqlens, max_seqlen, cache, step, kv_rows)
        if sel is not None:
            h = h[sel]
        if targets is not None:
            w = self.head_weight
            if torch.is_autocast_enabled(h.device.type):  # fp32 master weights: score in the autocast dtype,
                dt = torch.get_autocast_dtype(h.device.type)  # forward and backward alike (as bench/train_step.py)
                h, w = h.to(dt), w.to(dt)
            return logprob_entropy(h, w, targets, temperature=temperature)
        return self.head(h)


def pack(seqs: list[list[int]], device="cpu"):
    """Token-id lists -> (ids [N], position_ids [N], cu_seqlens [S+1] int32, max_seqlen)."""
    lens = [len(s) for s in seqs]
    ids = torch.tensor([t for s in seqs for t in s], dtype=torch.long, device=device)
    pos = torch.tensor([p for n in lens for p in range(n)], dtype=torch.long, device=device)
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0).tolist()), dtype=torch.int32, device=device)
    return ids, pos, cu, max(lens) if lens else 0


def _refuse_moved_switches():
    """An R1_* variable that once switched these paths (now config keys: r1/environment.py), still set, stops
    any script that loads the model, not only train.py and eval.py: never silently ignored."""
    moved = moved_switch()
    if moved:
        raise RuntimeError(moved)


_refuse_moved_switches()
default_ops()
