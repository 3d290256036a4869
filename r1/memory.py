"""The memory plan: what a run will hold per device, estimated from shapes before it allocates.

A run that dies of out-of-memory after minutes of rollout is the worst way to learn that
`train.micro_tokens` was too large. So at start-up `plan()` adds up, in bytes per process, the training
state (16 bytes a trained parameter, sharded under FSDP), the reference, the frozen LoRA base, the
generator's copy, the KV cache, the update's and the rollout's transients (the larger of the two: they
never run at once, but under train.overlap), a runtime allowance and a safety margin. Then it picks what
the user left on auto (micro-batch tokens, activation checkpointing, KV-cache slots) and refuses an
explicit setting that cannot fit with one line naming the key. docs/memory.md lists every item.

The saved-activation count is checked byte for byte against autograd's saved-tensor hooks
(tests/test_memory.py). Everything here is arithmetic on dataclasses, no torch allocation, so the plan of
a 70B model can be checked on a laptop; `device_capacity()` is the one function that asks the machine.
"""
import os
from dataclasses import dataclass, field

from r1.config import Config, ConfigError

GiB = 2 ** 30
MAX_MICRO_TOKENS = 16384
# Up to this many tokens per micro-batch where they cost nothing: on CUDA, when every slot the iteration
# wants fits beside them without activation checkpointing. A small model's update is bound by the host
# launching its ops, and fewer, longer micro-batches launch fewer ops (docs/decisions.md, "Micro-batch size"). Half of it where only
# that fits: the fast recipe on an 80-GB H100 took 16384 and its update ran 2.94 s against 1.57 s on an
# H200 at 65536.
BIG_MICRO_TOKENS = 65536
MAX_SLOTS = 512  # slots on auto: a batch of 512 episodes at once (64 prompts x 8), the recipes' largest
SLOT_STEPS = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 640, 768, 1024)  # r1/generate.py BUCKETS
# (CUDA-graph buckets: past the largest, a graph would be captured per batch size)
CARRY_HEADROOM = 4  # rollout.carry_tokens: paused episodes resume first, so auto gives a quarter more slots than
# the new episodes need (22% of the fast recipe's episodes spanned two rollouts at 200 tokens, docs/results/ablation4)
MIN_AUTO_SLOTS = 64  # auto slots kept free while picking the update's settings (if the iteration needs that many)
LOGPROB_CHUNK = 4096  # kernels/logprob.py default chunk_size
PREFILL_TOKENS = 8192  # r1/generate.py Generator default prefill_tokens
CPU_RUNTIME = GiB  # Python, torch, tokenizer, data rows: a CPU process's RSS beside its tensors
CUDA_CONTEXT = GiB // 2  # a second process's CUDA context and its kernels' modules (train.overlap 2)
MARGIN_FRACTION, MARGIN_BYTES = 0.10, GiB


@dataclass
class Precision:
    """Bytes of the tensors a training forward saves, by how the trainer computes on this device.

    residual: the residual stream (fp32 master weights under autocast keep it fp32; FSDP's bf16
    parameters make it bf16); matmul: outputs of the projections; casts: autocast's bf16 copies of
    each linear's input (one per consuming linear); flash: attention saves q, k, v, out and the
    log-sum-exp (FlashAttention) instead of the CPU math path's fp32 probabilities [heads, L, L].
    """
    residual: int
    matmul: int
    casts: bool
    flash: bool


def precision(device_type: str, world: int, bf16: bool = False) -> Precision:
    """bf16: train.precision=bf16 on one device, a bf16 copy of the weights computes (r1/precision.py)."""
    if device_type == "cuda":
        return Precision(2, 2, False, True) if world > 1 or bf16 else Precision(4, 2, True, True)
    return Precision(2, 2, False, False) if bf16 else Precision(4, 4, False, False)


def dtype_bytes(name: str) -> int:
    return {"float32": 4, "bfloat16": 2, "float16": 2}[name]


def rollout_dtype_bytes(cfg: Config, device_type: str) -> int:
    """r1/run.py resolve_dtype: auto = bfloat16 on CUDA, float32 on the CPU."""
    if cfg.rollout.dtype == "auto":
        return 2 if device_type == "cuda" else 4
    return dtype_bytes(cfg.rollout.dtype)


# ------------------------------------------------------------------ shapes


def layer_params(mc) -> int:
    """Parameters of one Block of r1/model.py."""
    h, q, kv = mc.hidden_size, mc.num_heads * mc.head_dim, mc.num_kv_heads * mc.head_dim
    n = h * q + 2 * h * kv + q * h + 3 * h * mc.intermediate_size + 2 * h
    if mc.qkv_bias:
        n += q + 2 * kv
    if mc.qk_norm:
        n += 2 * mc.head_dim
    return n


def param_count(mc, value_head: bool = False) -> int:
    """Parameters of a Transformer (r1/model.py): embeddings, blocks, final norm, and the LM head
    when untied, or the critic's scalar head (hidden + 1) instead of any LM head."""
    body = mc.vocab_size * mc.hidden_size + mc.num_layers * layer_params(mc) + mc.hidden_size
    if value_head:
        return body + mc.hidden_size + 1
    return body + (0 if mc.tie_embeddings else mc.vocab_size * mc.hidden_size)


def lora_shapes(mc, targets) -> list:
    """(in, out) of every adapted projection of one Block (r1/lora.py TARGETS)."""
    h, q, kv, i = mc.hidden_size, mc.num_heads * mc.head_dim, mc.num_kv_heads * mc.head_dim, mc.intermediate_size
    shapes = {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h), "gate_proj": (h, i),
              "up_proj": (h, i), "down_proj": (i, h)}
    return [shapes[t] for t in shapes if t in targets]


def lora_param_count(mc, rank: int, targets) -> int:
    """Adapter parameters of one model: A [r, in] and B [out, r] per adapted projection and block."""
    return mc.num_layers * sum(rank * (n_in + n_out) for n_in, n_out in lora_shapes(mc, targets))


def kv_cache_bytes(mc, slots: int, cache_len: int, dtype_size: int) -> int:
    """KVCache.empty(cfg, slots + 1, cache_len): k and v [layers, slots + 1, cache_len, kv_heads, head_dim]."""
    return 2 * mc.num_layers * (slots + 1) * cache_len * mc.num_kv_heads * mc.head_dim * dtype_size


def layer_activation_bytes(mc, p: Precision, seq_len: int) -> int:
    """Bytes autograd saves per token in one Block's forward (r1/model.py), op by op.

    RMSNorm (fp32 math): its fp32 input, x * rsqrt in the residual dtype, the rsqrt [N, 1], and the
    normed output that the next linears save (under autocast each linear saves its own bf16 cast
    instead: 3 for q/k/v, 2 for gate/up). RoPE saves only cos/sin (shared by all layers). Attention:
    FlashAttention keeps q, k, v, the output (which o_proj saves too) and the fp32 log-sum-exp per
    query head; the CPU math path keeps fp32 q and k, v repeated to every query head, the fp32
    probabilities [heads, L, L] (so `seq_len` matters there) and the output. SwiGLU: gate, silu(gate),
    up and their product (saved by down_proj). Qwen3's q/k norms: fp32 input and scaled output.
    """
    h, i = mc.hidden_size, mc.intermediate_size
    qd, kd = mc.num_heads * mc.head_dim, mc.num_kv_heads * mc.head_dim
    r, a = p.residual, p.matmul

    def norm(consumers):
        saved_out = 2 * h * consumers if p.casts else r * h
        return 4 * h + r * h + saved_out + 4

    n = norm(3) + norm(2)
    if mc.qk_norm:
        n += (4 + a) * (qd + kd) + 4 * (mc.num_heads + mc.num_kv_heads)
    if p.flash:
        n += a * qd + 2 * a * kd + a * qd + 4 * mc.num_heads
    else:
        n += 3 * 4 * qd + 4 * mc.num_heads * seq_len + a * qd
    return n + 4 * a * i


def token_extra_bytes(mc, p: Precision) -> int:
    """Per token, once per forward: ids, cos/sin, the final norm, the scored hidden state and the
    logprob head's per-token tensors (targets, selection, lse, entropy)."""
    h = mc.hidden_size
    return 8 + 2 * mc.head_dim * p.residual + (4 * h + p.residual * h + 4) + p.matmul * h + 24


def backward_bytes(mc, p: Precision, tokens: int, seq_len: int, triton: bool) -> int:
    """The backward's temporaries beside what the forward saved: gradients of the residual stream,
    of one block's MLP intermediates (and of the math path's attention probabilities), and the fused
    logprob head's chunk of logits and its weight-gradient accumulator (kernels/logprob.py)."""
    h, i, V = mc.hidden_size, mc.intermediate_size, mc.vocab_size
    n = tokens * (2 * h * p.residual + 3 * i * p.matmul)
    if not p.flash:
        n += tokens * 2 * 4 * mc.num_heads * seq_len
    chunk = min(LOGPROB_CHUNK, tokens)
    n += chunk * V * (2 * p.matmul if triton else 2 * p.matmul + 8)  # logits + dlogits (+ fp32 z, p)
    n += V * h * (4 + (p.matmul if p.matmul != 4 else 0))  # fp32 accumulator (+ its cast)
    n += tokens * h * p.matmul  # grad of the scored hidden states
    return n


# ------------------------------------------------------------------ the plan


@dataclass
class Plan:
    device: str
    capacity: int  # bytes this process may use
    world: int
    slots: int
    cache_len: int
    micro_tokens: int
    checkpointing: bool
    training: bool
    items: dict = field(default_factory=dict)  # name -> bytes (persistent parts)
    update: int = 0  # the update's transient
    rollout: int = 0  # the rollout's transient
    build: int = 0  # start-up: every model built whole in float32 before FSDP shards it
    notes: dict = field(default_factory=dict)  # name -> short description
    auto: tuple = ()  # keys chosen by the plan
    concurrent: bool = False  # train.overlap: the rollout runs during the update, so both transients at once

    @property
    def persistent(self) -> int:
        return sum(self.items.values())

    @property
    def peak(self) -> int:
        """The estimate before the margin: start-up, or the persistent part with the larger phase (with both
        phases under train.overlap)."""
        phases = self.update + self.rollout if self.concurrent else max(self.update, self.rollout)
        return max(self.build, self.persistent + phases)

    @property
    def margin(self) -> int:
        return int(MARGIN_FRACTION * self.peak) + MARGIN_BYTES

    @property
    def total(self) -> int:
        return self.peak + self.margin

    @property
    def fits(self) -> bool:
        return self.total <= self.capacity

    def line(self) -> str:
        """The plan in one line, for the console."""
        parts = []
        for name, b in self.items.items():
            if b or name in ("kv cache",):
                note = self.notes.get(name)
                parts.append(f"{name} {_gib(b)}" + (f" ({note})" if note else ""))
        if self.training:
            ck = "on" if self.checkpointing else "off"
            parts.append(f"update {_gib(self.update)} ({self.micro_tokens} tok/micro-batch, checkpointing {ck})")
        if self.rollout:
            during = ", during the update: train.overlap" if self.concurrent else ""
            parts.append(f"rollout {_gib(self.rollout)} ({self.notes.get('rollout', '')}{during})")
        parts.append(f"margin {_gib(self.margin)}")
        auto = f"; auto: {', '.join(self.auto)}" if self.auto else ""
        return (f"memory plan ({self.device}, {_gib(self.capacity)}): {', '.join(parts)}; "
                f"total {_gib(self.total)} of {_gib(self.capacity)} ({'fits' if self.fits else 'does not fit'}){auto}")


def _gib(b: int) -> str:
    return f"{b / GiB:.1f} GiB"


def roles(cfg: Config) -> dict:
    """Which models a run builds (r1/learner.py, r1/actor.py): critic for GAE, reference for a KL term,
    generator for RL; with train.steps=0 (evaluation, r1/actor.py standalone) the generator alone."""
    from r1.algos.estimators import ESTIMATORS

    rl = cfg.train.stage == "rl"
    trains = rl and cfg.train.steps > 0
    return {"critic": trains and ESTIMATORS[cfg.algo.advantage].needs_critic,
            "ref": trains and cfg.algo.kl_coef > 0, "generator": rl}


def critic_config(cfg: Config, mc):
    """The critic's shape: the policy's, cut to its first model.critic_layers blocks (r1/learner.first_layers).
    A depth the policy's model has not is refused here, at the plan, before any weight loads (a critic from
    model.critic_path has its own depth, which r1/learner.first_layers checks when it loads)."""
    k = cfg.model.critic_layers
    if k > mc.num_layers and not cfg.model.critic_path:
        raise ConfigError(f"config key 'model.critic_layers'={k}: the model ({cfg.model.path}) has {mc.num_layers} "
                          f"layers")
    return mc.replace(num_layers=min(k, mc.num_layers)) if k else mc


def slots_needed(cfg: Config, world: int) -> int:
    """Rows an iteration (or an evaluation) runs at once on one rank: more slots would never be used."""
    per_rank = lambda n: -(-n // world)  # noqa: E731  ceil
    need = per_rank(cfg.rollout.prompts) * cfg.rollout.n if cfg.train.steps > 0 else 0
    cap = MAX_SLOTS
    if need and cfg.rollout.carry_tokens:  # the resumed episodes beside a whole batch of new ones
        need += -(-need // CARRY_HEADROOM)
        cap += MAX_SLOTS // CARRY_HEADROOM
    if cfg.train.steps == 0 or cfg.eval.every:
        need = max(need, per_rank(cfg.eval.limit) * cfg.eval.n if cfg.eval.limit else MAX_SLOTS)
    return max(1, min(need, cap))


def estimate(cfg: Config, mc, world: int, device_type: str, capacity: int, device: str = "",
             slots: int = 1, micro_tokens: int = MAX_MICRO_TOKENS, checkpointing: bool = False) -> Plan:
    """The plan for given choices (no picking): every part in bytes per process."""
    r = roles(cfg)
    training = cfg.train.steps > 0
    copy16 = training and world == 1 and cfg.train.precision == "bf16" and not cfg.model.lora_rank
    p = precision(device_type, world, copy16)
    g = rollout_dtype_bytes(cfg, device_type)
    cache_len = cfg.rollout.cache_len or cfg.env.max_context
    P, Pc = param_count(mc), param_count(critic_config(cfg, mc), value_head=True)
    shard = f", sharded /{world}" if world > 1 else ""
    per_param = 16 if training else 4  # fp32 params (+ fp32 grads + AdamW's two fp32 moments)
    what = "params+grads+adam" if training else "params"
    items, notes = {}, {}
    rank = cfg.model.lora_rank if training else 0
    A = lora_param_count(mc, rank, cfg.model.lora_targets) if rank else 0
    if rank:  # r1/lora.py: one frozen base; adapters (and the value head) are what trains
        items["base"], notes["base"] = (2 if device_type == "cuda" else 4) * P, "frozen, shared, reference too"
        items["policy"], notes["policy"] = per_param * A, f"rank-{rank} adapters: params+grads+adam"
        if r["critic"]:
            Ac = lora_param_count(critic_config(cfg, mc), rank, cfg.model.lora_targets)
            items["critic"], notes["critic"] = per_param * (Ac + mc.hidden_size + 1), "adapters+value head"
    else:
        items["policy"], notes["policy"] = per_param * P // world, what + shard
        if r["critic"]:
            items["critic"], notes["critic"] = per_param * Pc // world, what + shard
            if 0 < cfg.model.critic_layers < mc.num_layers:
                notes["critic"] += f", {cfg.model.critic_layers} of {mc.num_layers} blocks"
        if r["ref"]:
            items["ref"], notes["ref"] = 4 * P // world, "params" + shard
    adapters = bool(rank) and cfg.model.lora_generator == "adapters"
    shared = world == 1 and g == 4 and (adapters or not rank) and not (training and cfg.train.overlap)  # overlap: own copy
    if r["generator"]:
        items["generator"] = 0 if shared else g * P
        notes["generator"] = "the policy itself" if shared else f"{'bf16' if g == 2 else 'fp32'} copy" + \
            (", merged" if rank else "")
        if adapters and not shared:  # the base shared where the rollout dtype is the base's (r1/lora.py)
            same = g == (2 if device_type == "cuda" else 4)
            items["generator"] = g * A + (0 if same else g * P)
            notes["generator"] = f"{'bf16' if g == 2 else 'fp32'} adapters" + \
                (" over the shared base" if same else " + a base copy")
        items["kv cache"] = kv_cache_bytes(mc, slots, cache_len, g)
        notes["kv cache"] = f"{slots} slots x {cache_len}"
        if training and cfg.train.overlap == 2:  # r1/rollout_process.py: its own generator copy and runtime
            items["rollout process"] = g * P + (CUDA_CONTEXT if device_type == "cuda" else CPU_RUNTIME)
            notes["rollout process"] = "its generator copy + " + ("a CUDA context" if device_type == "cuda"
                                                                   else "runtime")
    else:
        slots = 0
    if copy16:  # r1/precision.py: every trained (and reference) model's bf16 copy, and its bf16 gradients
        # between a backward and their sum into the master's
        items["bf16 copies"] = 2 * (2 * P + (2 * Pc if r["critic"] else 0) + (P if r["ref"] else 0))
    elif device_type == "cuda" and world == 1 and training:
        # autocast's bf16 copies of every float32 weight, kept for the backward of each micro-batch (LoRA's
        # base is bf16 already: only the adapters are copied)
        items["autocast copies"] = 2 * (2 * A if rank else max(P, Pc if r["critic"] else 0))
    if device_type != "cuda":
        items["runtime"] = CPU_RUNTIME
    update = 0
    longest = max(cfg.env.max_context, cache_len)
    if training:
        N = max(micro_tokens, longest)
        L = min(N, longest)
        layer = layer_activation_bytes(mc, p, L)
        if checkpointing:  # each block's input (and the position ids), then one block recomputed at a time
            saved = N * (mc.num_layers * p.residual * mc.hidden_size + 8) + N * layer
        else:
            saved = N * mc.num_layers * layer
        update = saved + N * token_extra_bytes(mc, p) + backward_bytes(mc, p, N, L, triton=device_type == "cuda")
        if cfg.train.share_prefix:  # the attention's keys and values gathered, saved for its backward: a shared
            # prompt's rows are read by at most rollout.n - 1 more samples, so at most that many more copies a
            # token (GSM8K-tool's validation episodes: 366 prompt tokens of 584, 8 samples, 1.2 more a token)
            copies = max(cfg.rollout.n - 1, 0)
            kv = 2 * p.matmul * mc.num_kv_heads * mc.head_dim
            update += N * (1 if checkpointing else mc.num_layers) * copies * kv
        if rank:  # per adapter: its [N, r] middle for B's backward; with dropout the mask and the dropped input
            per_tok = sum(rank * p.matmul + (n_in * (1 + p.matmul) if cfg.model.lora_dropout else 0)
                          for n_in, _ in lora_shapes(mc, cfg.model.lora_targets))
            update += N * per_tok * (1 if checkpointing else mc.num_layers)
        if world > 1:  # FSDP: two gathered blocks (+ prefetch) and one block's unsharded gradients, the root's
            blk = layer_params(mc)
            root = mc.vocab_size * mc.hidden_size
            update += 2 * blk * p.matmul + blk * (p.matmul + 4) + root * (2 * p.matmul + 4)
    rollout = 0
    if r["generator"]:
        V, h, i = mc.vocab_size, mc.hidden_size, mc.intermediate_size
        qd, kd = mc.num_heads * mc.head_dim, mc.num_kv_heads * mc.head_dim
        sync = 4 * P if world > 1 else 0  # full fp32 state dict gathered on every rank (sync_rollout_weights)
        if rank:  # merging one weight at a time: W and B @ A in float32, their sum
            sync = 12 * max(n_in * n_out for n_in, n_out in lora_shapes(mc, cfg.model.lora_targets))
        T = min(PREFILL_TOKENS, max(1, slots) * cache_len)
        prefill = T * (4 * h * 4 + 3 * (qd + 2 * kd) * g + 3 * i * g)
        if device_type != "cuda":  # math attention: scores + probabilities of the longest sequence
            prefill += 2 * mc.num_heads * min(T, cache_len) ** 2 * 4 + qd * 4 * 2 * min(T, cache_len)
        per_row = V * (g + (4 if device_type == "cuda" else 48))  # logits + sampling (torch path: fp32 + int64 noise)
        decode = slots * per_row
        if device_type != "cuda":  # one layer's keys/values gathered per decode step, and the scores
            decode += slots * cache_len * (2 * kd * g + 4 * mc.num_heads)
        graphs = 0
        if device_type == "cuda":  # a private pool per captured batch-size bucket
            # every bucket up to the one a full batch of `slots` rows pads to (r1/generate.py _decode_launch)
            rows = sum(b for b in SLOT_STEPS if b < slots) + next((b for b in SLOT_STEPS if b >= slots), slots)
            graphs = rows * (V * g + 4 * h * 4 + 3 * i * g)
            graphs += prefill + T * h * g  # prefill chunks in graphs (r1/chunk_graphs.py): one shared pool + output
        if graphs:  # graph pools stay reserved through the update too
            items["cuda graphs"], notes["cuda graphs"] = graphs, "decode and prefill-chunk pools"
        rollout = max(sync, prefill, decode)
        notes["rollout"] = "weight sync" if sync >= max(prefill, decode) else "prefill + sampling"
    build = 0
    if world > 1:  # r1/learner.py builds each model whole (fp32, and the generator's copy) before sharding
        # (the critic whole too: model.critic_layers cuts it after it is built, r1/learner.first_layers)
        build = 4 * P * (1 + r["ref"]) + (4 * param_count(mc, value_head=True) if r["critic"] else 0) + \
            (g * P if r["generator"] else 0)
    if rank and r["generator"]:  # the generator's copy is built in float32 beside the base, then cast
        build = items["base"] + 4 * P
    return Plan(device or device_type, capacity, world, slots, cache_len, micro_tokens, checkpointing, training,
                items, update, rollout, build, notes, concurrent=bool(training and cfg.train.overlap))


def plan(cfg: Config, mc, world: int, device_type: str, capacity: int, device: str = "") -> Plan:
    """Estimate, pick the `auto` settings, or raise ConfigError (one line naming the key) if nothing fits.

    cfg: the resolved Config; mc: the model's ModelConfig (r1/model.py); capacity: bytes this process
    may use (device_capacity()). Explicit values are kept as they are.
    """
    r = roles(cfg)
    training = cfg.train.steps > 0
    ac_key, mt_key, sl_key = "train.activation_checkpointing", "train.micro_tokens", "rollout.slots"
    ac_auto = cfg.train.activation_checkpointing == "auto"
    mt_auto = cfg.train.micro_tokens == 0
    sl_auto = cfg.rollout.slots == 0 and r["generator"]
    need = slots_needed(cfg, world)
    powers = [MAX_MICRO_TOKENS >> k for k in range(7)]  # 16384 .. 256
    if mt_auto and training and device_type == "cuda":  # a small model: see BIG_MICRO_TOKENS
        powers = [mt for mt in (BIG_MICRO_TOKENS >> k for k in range(2)) if
                  estimate(cfg, mc, world, device_type, capacity, device, slots=need, micro_tokens=mt).fits] + powers
    mts = powers if mt_auto else [cfg.train.micro_tokens]
    acs = [False, True] if ac_auto else [cfg.train.activation_checkpointing == "true"]
    if not training:  # nothing is trained: no gradients, optimizer moments or activations
        mts, acs = mts[:1], acs[:1]
    pairs = [(ac, mt) for ac in acs for mt in mts if not (ac_auto and mt_auto and not ac and mt < 4096)]
    sl_fixed = cfg.rollout.slots if not sl_auto else None

    def est(slots, mt, ac):
        return estimate(cfg, mc, world, device_type, capacity, device, slots=slots, micro_tokens=mt, checkpointing=ac)

    keep = sl_fixed if sl_fixed is not None else min(need, MIN_AUTO_SLOTS)
    for floor in ([keep, 1] if sl_fixed is None and keep > 1 else [keep]):
        choice = next(((ac, mt) for ac, mt in pairs if est(floor, mt, ac).fits), None)
        if choice is not None:
            break
    if choice is None:
        raise ConfigError(_refusal(cfg, est, acs, mts, sl_fixed, training) + _lora_hint(cfg, mc, world, device_type,
                                                                                          capacity, device))
    ac, mt = choice
    slots = sl_fixed if sl_fixed is not None else _most_slots(lambda s: est(s, mt, ac).fits, need)
    out = est(slots, mt, ac)
    out.auto = tuple(k for k, auto in ((sl_key, sl_auto), (mt_key, mt_auto and training),
                                       (ac_key, ac_auto and training)) if auto)
    return out


LORA_HINT_RANK = 16


def _lora_hint(cfg, mc, world, device_type, capacity, device) -> str:
    """When full fine-tuning is refused and LoRA would fit: say so, with its plan's peak."""
    import copy

    if cfg.model.lora_rank or cfg.train.steps == 0 or cfg.train.stage != "rl" or \
            cfg.model.critic_path or cfg.model.ref_path:
        return ""
    alt = copy.deepcopy(cfg)
    alt.model.lora_rank = LORA_HINT_RANK  # the RL phase; an SFT warm-up (train.sft_steps) trains every weight
    try:
        fit = plan(alt, mc, world, device_type, capacity, device)
    except ConfigError:
        return ""
    keys = f"model.lora_rank={LORA_HINT_RANK}"
    if cfg.train.sft_steps:  # the warm-up keeps going only where it fits as it is
        warm = copy.deepcopy(cfg)  # what the plan reads of r1/sft.py warmup_config: SFT of every weight
        warm.train.stage, warm.train.sft_steps, warm.model.lora_rank = "sft", 0, 0
        try:
            plan(warm, mc, world, device_type, capacity, device)
        except ConfigError:
            keys += " train.sft_steps=0"
    return f"; or train LoRA adapters over a frozen base: set {keys} (peak {_gib(fit.total)})"


def _most_slots(fits, cap: int) -> int:
    """The most slots (<= cap) that fit, rounded down to a CUDA-graph bucket below cap."""
    if fits(cap):
        return cap
    lo, hi = 1, cap  # fits(lo) is known, fits(hi) is not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return max(b for b in SLOT_STEPS if b <= lo) if lo >= 1 else 1


def _refusal(cfg, est, acs, mts, sl_fixed, training) -> str:
    """One line: which key to change, and the numbers. Tries relaxing one explicit key at a time."""
    least_mt = min(MAX_MICRO_TOKENS >> 6, *mts)
    floor = est(1, least_mt, training)  # one slot, the smallest micro-batch, checkpointing on
    where = f"{floor.device} ({_gib(floor.capacity)} usable per process, world {floor.world})"
    if not floor.fits:
        states = sum(v for k, v in floor.items.items() if k != "kv cache")
        return (f"config key 'model.path'={cfg.model.path}: the model does not fit: weights, gradients and "
                f"optimizer state take {_gib(states)}, and even 1 slot, {least_mt}-token micro-batches and activation "
                f"checkpointing peak at {_gib(floor.total)} on {where}; use more GPUs (torchrun --nproc_per_node) "
                f"or a smaller model")
    slots = sl_fixed if sl_fixed is not None else 1
    asked = est(slots, min(mts), any(acs))  # the user's explicit settings at their lightest

    def fitting(slots_, acs_, mts_):
        return next((e for ac in acs_ for mt in mts_ if (e := est(slots_, mt, ac)).fits), None)

    if sl_fixed is not None and fitting(1, acs, mts):
        most = _most_slots(lambda n: fitting(n, acs, mts) is not None, sl_fixed)
        return (f"config key 'rollout.slots'={sl_fixed} needs a {_gib(asked.items['kv cache'])} KV cache "
                f"({sl_fixed} slots x {asked.cache_len} positions), peak {_gib(asked.total)} on {where}; "
                f"set rollout.slots=auto or at most {most}")
    if training and acs == [False] and (fit := fitting(slots, [True], mts)):
        return (f"config key 'train.activation_checkpointing'=false: the update of {min(mts)} tokens per "
                f"micro-batch needs {_gib(asked.update)}, peak {_gib(asked.total)} on {where}; "
                f"set train.activation_checkpointing=true (peak {_gib(fit.total)}) or auto")
    if training and len(mts) == 1:
        for mt in (MAX_MICRO_TOKENS >> k for k in range(7)):
            if mt < mts[0] and (fit := fitting(slots, acs, [mt])):
                return (f"config key 'train.micro_tokens'={mts[0]} needs {_gib(asked.update)} for the update, "
                        f"peak {_gib(asked.total)} on {where}; set train.micro_tokens={mt} (peak {_gib(fit.total)}) "
                        f"or auto")
    keys = [k for k, explicit in (("rollout.slots", sl_fixed is not None), ("train.micro_tokens", len(mts) == 1),
                                  ("train.activation_checkpointing", len(acs) == 1)) if explicit]
    return (f"config keys {', '.join(keys)} together peak at {_gib(asked.total)} on {where}; set them to auto "
            f"(1 slot, {least_mt}-token micro-batches and checkpointing peak at {_gib(floor.total)})")


# ------------------------------------------------------------------ the machine


def plan_for(cfg: Config, model_cfg, d) -> Plan:
    """plan() for this process (d: r1.distributed.Dist), printed as one line on rank 0. Every rank plans
    with the smallest capacity of all ranks, so they pick the same settings and refuse together."""
    from r1 import distributed

    capacity = int(-distributed.all_max(-float(device_capacity(d.device, cfg.run.memory_fraction)), d))
    out = plan(cfg, model_cfg, d.world, d.device.type, capacity, device_label(d.device))
    if d.main:
        print(out.line(), flush=True)
    return out


def split_fraction(plan: Plan, fraction: float, total: int) -> tuple:
    """train.overlap 2 under run.memory_fraction < 1 (CUDA): (the trainer's cap, the rollout process's cap) as
    fractions of the card, `total` bytes. The process gets what the plan puts there (its generator copy and
    context, the KV cache, the graph pools, the rollout's transient) and a GiB of margin; the trainer the rest
    of `fraction`. A cap is per process: without the split each could take all of `fraction`."""
    child = sum(plan.items.get(k, 0) for k in ("rollout process", "kv cache", "cuda graphs")) + plan.rollout + GiB
    child = min(child / total, fraction / 2)  # a plan that fits leaves the trainer at least its half
    return fraction - child, child


def device_capacity(device, fraction: float = 1.0) -> int:
    """Bytes this process may use on `device` (a torch.device), asked now.

    CUDA: free memory plus what torch's allocator already holds (the models built so far), at most
    `fraction` (run.memory_fraction) of the card, which the allocator then enforces: runs that share
    one GPU each plan for their own share, however many started at the same moment.
    CPU: MemAvailable (shared by the local ranks of a torchrun) plus this process's resident set, at most
    `fraction` of the machine's RAM (planned for, not enforced: the OS has no per-process cap to set).
    """
    import torch

    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        if fraction < 1:
            torch.cuda.set_per_process_memory_fraction(fraction, device)
        return int(min(free + torch.cuda.memory_reserved(device), fraction * total))
    local = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    own = _available_ram() / local + _rss()
    return int(own if fraction >= 1 else min(own, fraction * _total_ram()))


def _meminfo() -> dict:
    out = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                k, _, v = line.partition(":")
                out[k] = int(v.split()[0]) * 1024
    except OSError:
        pass
    return out


def _ram(key: str) -> int:
    """/proc/meminfo's `key` in bytes; not Linux: the machine's total, as a ceiling."""
    info = _meminfo()
    if key in info:
        return info[key]
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 8 * GiB


def _available_ram() -> int:
    return _ram("MemAvailable")


def _total_ram() -> int:
    return _ram("MemTotal")


def _rss() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def device_label(device) -> str:
    return f"cuda:{device.index or 0}" if device.type == "cuda" else "cpu"


