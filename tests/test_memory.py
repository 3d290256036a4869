"""r1/memory.py: the start-up memory plan.

The arithmetic is checked three ways: parameter and KV-cache bytes against
real modules and tensors (tiny shapes) and hand-computed integers (SmolLM2-135M,
Qwen2.5-3B); the activation bytes per token against what autograd really
saves (saved-tensor hooks, byte for byte, for llama/qwen2/qwen3 in each CPU
precision); the whole plan against peaks measured on the H200 (bench/train_step.py
in docs/results.md; train.py with the 3B shape, measured for this module; the 3B
runs on 2 x H200). Then the auto choices and the one-line refusals that name the key.
"""
import pytest
import torch

from r1 import memory
from r1.config import ConfigError, load_config
from r1.model import KVCache, ModelConfig, Transformer, tiny_config

GiB = 2 ** 30
SMOLLM2 = ModelConfig()  # SmolLM2-135M: the dataclass defaults are its shape
QWEN3B = ModelConfig(arch="qwen2", vocab_size=151936, hidden_size=2048, intermediate_size=11008, num_layers=36,
                     num_heads=16, num_kv_heads=2, head_dim=128, tie_embeddings=True, qkv_bias=True)
QWEN3B_SMOL = QWEN3B.replace(vocab_size=49152)  # the 2 x H200 run: the 3B shape with SmolLM2's vocabulary
H200 = int(139.8 * GiB)  # torch.cuda.mem_get_info total of an H200, as its OOM report puts it


def cfg_of(*overrides, path="configs/smoke.yaml"):
    return load_config(path, list(overrides))


def refusal(fn) -> str:
    with pytest.raises(ConfigError) as e:
        fn()
    msg = str(e.value)
    assert "\n" not in msg, msg
    return msg


# ------------------------------------------------------------------ shapes


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("tie", [True, False])
def test_param_count_is_the_modules(arch, tie):
    mc = tiny_config(arch, tie=tie, vocab_size=97, num_layers=3)
    for value_head in (False, True):
        model = Transformer(mc, value_head=value_head)
        assert memory.param_count(mc, value_head) == sum(p.numel() for p in model.parameters())
    assert memory.layer_params(mc) == sum(p.numel() for p in Transformer(mc).model.layers[0].parameters())


def test_param_count_of_known_shapes():
    # SmolLM2-135M: 49152 x 576 embeddings + 30 blocks + final norm, tied (its published count: 134,515,008)
    h, q, kv, i = 576, 576, 192, 1536
    block = h * q + 2 * h * kv + q * h + 3 * h * i + 2 * h
    assert memory.param_count(SMOLLM2) == 49152 * h + 30 * block + h == 134_515_008
    # Qwen2.5-3B shape: bench/train_step.py counted 3,085,938,688 on the real module (bench/results/train_step.json)
    assert memory.param_count(QWEN3B) == 3_085_938_688


def test_kv_cache_bytes_are_the_cache():
    mc = tiny_config("qwen2", num_layers=3, num_kv_heads=2, head_dim=16)
    for dtype in (torch.float32, torch.bfloat16):
        c = KVCache.empty(mc, 5 + 1, 40, dtype, "cpu")  # the generator adds one scratch slot
        size = torch.tensor([], dtype=dtype).element_size()
        assert memory.kv_cache_bytes(mc, 5, 40, size) == c.k.nbytes + c.v.nbytes
    # 512 slots x 2,048 positions of SmolLM2 in fp32 on the CPU (eval.py's cache): 45.1 GiB
    want = 2 * 30 * 513 * 2048 * 3 * 64 * 4
    assert memory.kv_cache_bytes(SMOLLM2, 512, 2048, 4) == want
    assert round(want / GiB, 1) == 45.1


# ------------------------------------------------------------------ activations, against autograd


def saved_bytes(model, n_seq, seq_len, dtype, autocast):
    """Bytes of the distinct tensors autograd saves in one training forward (parameters and their casts left out)."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    shapes = {tuple(p.shape) for p in model.parameters()} | {tuple(p.shape)[::-1] for p in model.parameters()}
    seen = {}

    def pack(t):
        if t.untyped_storage().data_ptr() not in params and not (t.dtype != dtype and tuple(t.shape) in shapes):
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    N = n_seq * seq_len
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.cfg.vocab_size, (N,), generator=g)
    pos = torch.arange(seq_len).repeat(n_seq)
    cu = torch.arange(0, N + 1, seq_len, dtype=torch.int32)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(ids, pos, cu, seq_len, sel=torch.arange(N), targets=torch.randint(0, model.cfg.vocab_size, (N,), generator=g))
    return sum(seen.values())


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("mode", ["fp32", "bf16", "autocast"])
def test_activation_bytes_are_what_autograd_saves(arch, mode):
    """Per token and layer, byte for byte: fp32 (the CPU trainer), bf16 parameters (FSDP's mixed
    precision, on the CPU's math attention) and bf16 autocast over fp32 weights (one GPU)."""
    prec = {"fp32": memory.Precision(4, 4, False, False), "bf16": memory.Precision(2, 2, False, False),
            "autocast": memory.Precision(4, 2, True, False)}[mode]
    dtype = torch.bfloat16 if mode == "bf16" else torch.float32
    torch.manual_seed(0)
    n_seq, L = 2, 24  # 48 tokens: no activation shares a shape with a weight
    got = {}
    for layers in (1, 3):
        mc = tiny_config(arch, vocab_size=211, num_layers=layers, hidden_size=64, intermediate_size=160,
                         num_heads=4, num_kv_heads=2, head_dim=16)
        got[layers] = saved_bytes(Transformer(mc).to(dtype), n_seq, L, dtype, mode == "autocast")
        want = n_seq * L * (layers * memory.layer_activation_bytes(mc, prec, L) + memory.token_extra_bytes(mc, prec))
        assert got[layers] == want, (layers, got[layers], want)
    # the CPU math path keeps the [heads, L, L] probabilities: longer sequences cost more per token
    longer = memory.layer_activation_bytes(mc, prec, 2 * L) - memory.layer_activation_bytes(mc, prec, L)
    assert longer == 4 * mc.num_heads * L


def test_checkpointing_saves_block_inputs_only():
    mc = tiny_config("llama", vocab_size=211, num_layers=3, hidden_size=64, intermediate_size=160)
    from r1.distributed import Dist, parallelize

    model = parallelize(Transformer(mc), Dist(0, 1, 0, torch.device("cpu")), activation_checkpointing=True)
    p = memory.Precision(4, 4, False, False)
    got = saved_bytes(model, 2, 24, torch.float32, False)
    # the forward saves each block's input (fp32 residual) and the position ids; the recomputed block shows up
    # in backward only
    assert got == 48 * (3 * 4 * mc.hidden_size + 8 + memory.token_extra_bytes(mc, p))


# ------------------------------------------------------------------ the plan against measured peaks


def test_plan_matches_the_h200_train_step_peak():
    """bench/train_step.py on one H200 (docs/results.md): Qwen2.5-3B shape, bf16 parameters, gradients and AdamW
    moments (8 bytes a parameter), 16k-token micro-batches of sequences up to 2,000 tokens, no checkpointing:
    peak 100.8 GiB. The estimate (the same parts as the plan, without its margin) must land within 5%."""
    p = memory.Precision(2, 2, False, True)
    N, L = 16384, 2000
    est = (8 * memory.param_count(QWEN3B) + N * QWEN3B.num_layers * memory.layer_activation_bytes(QWEN3B, p, L)
           + N * memory.token_extra_bytes(QWEN3B, p) + memory.backward_bytes(QWEN3B, p, N, L, triton=True))
    assert abs(est / GiB - 100.8) / 100.8 < 0.05, est / GiB


def two_h200_3b(*overrides):
    """The 3B run: the smoke config scaled to 64 x 4 episodes, critic and reference, 2 x H200."""
    cfg = cfg_of("rollout.prompts=64", "rollout.n=4", "rollout.slots=auto", *overrides)
    return memory.plan(cfg, QWEN3B_SMOL, 2, "cuda", H200, "cuda:0")


def test_two_h200_3b_run_needs_checkpointing():
    # measured: checkpointing off ran out of memory at 139.47 GiB; on, 74 GiB peak per GPU
    msg = refusal(lambda: two_h200_3b("train.micro_tokens=16384", "train.activation_checkpointing=false"))
    assert msg.startswith("config key 'train.activation_checkpointing'=false") and "set train.activation_checkpointing=true" in msg
    plan = two_h200_3b("train.micro_tokens=16384")  # auto
    assert plan.checkpointing and plan.fits and plan.micro_tokens == 16384
    assert 60 * GiB < plan.peak < 80 * GiB and plan.total <= H200
    assert plan.slots == 32 * 4  # the iteration's 64 prompts x 4 samples, dealt to 2 ranks
    assert plan.items["policy"] == 16 * memory.param_count(QWEN3B_SMOL) // 2  # fp32 params, grads, 2 moments, /2
    assert plan.items["ref"] == 4 * memory.param_count(QWEN3B_SMOL) // 2
    assert plan.items["generator"] == 2 * memory.param_count(QWEN3B_SMOL)  # bf16, whole on every rank
    assert "train.activation_checkpointing" in plan.auto and "rollout.slots" in plan.auto
    line = plan.line()
    assert "\n" not in line and line.startswith("memory plan (cuda:0, 139.8 GiB)") and "(fits)" in line
    assert "checkpointing on" in line and "sharded /2" in line and "128 slots x 512" in line


def test_defaults_on_2xh200_fit_and_prefer_no_checkpointing():
    plan = two_h200_3b("train.micro_tokens=auto")
    assert plan.fits and plan.micro_tokens in [16384 >> k for k in range(7)]
    assert not plan.checkpointing and plan.micro_tokens >= 4096  # big enough micro-batches without recompute


@pytest.mark.parametrize("algo, measured", [
    (("algo.advantage=step_gae",), 118.53),  # critic + reference: the plan takes checkpointing on, 16k tokens
    (("algo.advantage=grpo", "algo.kl_coef=0"), 101.45),  # policy alone: checkpointing off, 8k tokens
])
def test_plan_matches_the_h200_trainer_peaks(algo, measured):
    """train.py on one H200 (2026-11-30, this branch): the 3B shape with SmolLM2's vocabulary, the smoke config
    at 64 x 4 episodes, every memory key auto; peak_mem_gb of the second iteration. The plan's estimate
    (before its margin) must cover the measured peak and exceed it by less than 5%."""
    cfg = cfg_of("rollout.prompts=64", "rollout.n=4", "rollout.slots=auto", "train.micro_tokens=auto", *algo)
    plan = memory.plan(cfg, QWEN3B_SMOL, 1, "cuda", int(139.2 * GiB), "cuda:0")
    assert plan.fits
    assert measured <= plan.peak / GiB < 1.05 * measured, plan.line()


# ------------------------------------------------------------------ the CPU: eval.py with gsm8k_tool


def eval_cfg(*overrides):
    """What eval.py makes of configs/gsm8k_tool.yaml: no critic, no reference, nothing trained."""
    return cfg_of("data.path=data/gsm8k", "algo.advantage=grpo", "algo.kl_coef=0", "train.steps=0", *overrides,
                  path="configs/gsm8k_tool.yaml")


def test_eval_on_a_24gb_cpu_refuses_512_slots_in_one_line():
    msg = refusal(lambda: memory.plan(eval_cfg("rollout.slots=512"), SMOLLM2, 1, "cpu", 22 * GiB))
    assert msg.startswith("config key 'rollout.slots'=512 needs a 45.1 GiB KV cache (512 slots x 2048 positions)")
    most = int(msg.rsplit("at most ", 1)[1])
    assert memory.plan(eval_cfg(f"rollout.slots={most}"), SMOLLM2, 1, "cpu", 22 * GiB).fits


def test_eval_on_a_24gb_cpu_picks_slots_that_fit():
    plan = memory.plan(eval_cfg("rollout.slots=auto"), SMOLLM2, 1, "cpu", 22 * GiB)
    assert plan.fits and 64 <= plan.slots < 512 and plan.slots in memory.SLOT_STEPS
    assert plan.items["kv cache"] == memory.kv_cache_bytes(SMOLLM2, plan.slots, 2048, 4)
    assert plan.items["policy"] == 4 * memory.param_count(SMOLLM2)  # params only: nothing is trained
    assert plan.items["generator"] == 0 and plan.update == 0  # one fp32 process: the generator is the policy
    bigger = memory.estimate(eval_cfg(), SMOLLM2, 1, "cpu", 22 * GiB, slots=plan.slots * 2)
    assert not bigger.fits  # rounded down to a bucket, but not by more than half
    small = memory.plan(eval_cfg("rollout.slots=auto"), SMOLLM2, 1, "cpu", 6 * GiB)
    assert small.fits and small.slots < plan.slots


def test_slots_are_capped_by_what_an_iteration_runs():
    plan = memory.plan(cfg_of("rollout.slots=auto", "rollout.prompts=6", "rollout.n=3"), SMOLLM2, 1, "cpu", 22 * GiB)
    assert plan.slots == 18
    assert memory.slots_needed(cfg_of("rollout.prompts=7", "rollout.n=4"), 2) == 16  # ceil(7 / 2) x 4
    assert memory.slots_needed(eval_cfg("eval.limit=256"), 1) == 256
    assert memory.slots_needed(eval_cfg("eval.limit=0"), 1) == memory.MAX_SLOTS


# ------------------------------------------------------------------ auto and refusals


def test_micro_tokens_shrink_with_memory_and_checkpointing_comes_last():
    picks = []
    for gib in (60, 30, 20, 14, 8):
        cfg = cfg_of("model.path=smollm2-135m-instruct", "algo.advantage=grpo", "algo.kl_coef=0",
                     "train.micro_tokens=auto")
        plan = memory.plan(cfg, SMOLLM2, 1, "cpu", gib * GiB)
        assert plan.fits
        picks.append((plan.checkpointing, plan.micro_tokens))
    assert picks == sorted(picks, key=lambda p: (p[0], -p[1])), picks  # off before on, larger before smaller
    assert picks[0] == (False, 16384) and picks[-1][0]


def test_the_fast_recipe_takes_the_big_micro_batches_that_fit_every_slot():
    """configs/gsm8k_tool.yaml, every memory key auto: 65536-token micro-batches on an H200 (as
    docs/results/recipe3 ran), and on an 80-GB H100 half of that, not 16384 (docs/results/recipe4 ran 16384
    there: its update took 2.94 s against 1.57 s on the H200; docs/decisions.md, "Micro-batch size"); all 512 slots, no
    checkpointing, on both; a GPU too small for 32768 beside the slots falls back to 16384 or less."""
    cfg = load_config("configs/gsm8k_tool.yaml")
    for gib, micro in ((139.1, 65536), (78.4, 32768), (60, 16384)):
        plan = memory.plan(cfg, SMOLLM2, 1, "cuda", int(gib * GiB), "cuda:0")
        assert (plan.micro_tokens, plan.slots, plan.checkpointing) == (micro, 512, False), (gib, plan.line())
        assert plan.fits and "train.micro_tokens" in plan.auto


def test_explicit_micro_tokens_too_big_names_the_key():
    explicit = ("algo.advantage=grpo", "algo.kl_coef=0", "train.activation_checkpointing=true")
    cfg = cfg_of("train.micro_tokens=16384", *explicit)
    msg = refusal(lambda: memory.plan(cfg, SMOLLM2, 1, "cpu", 7 * GiB))
    assert msg.startswith("config key 'train.micro_tokens'=16384 needs") and "set train.micro_tokens=" in msg
    smaller = int(msg.rsplit("train.micro_tokens=", 1)[1].split()[0])
    assert memory.plan(cfg_of(f"train.micro_tokens={smaller}", *explicit), SMOLLM2, 1, "cpu", 7 * GiB).fits


def test_a_model_that_cannot_fit_names_model_path():
    msg = refusal(lambda: memory.plan(cfg_of("model.path=/models/big"), QWEN3B, 1, "cpu", 8 * GiB))
    assert msg.startswith("config key 'model.path'=/models/big: the model does not fit")


def test_explicit_values_are_kept():
    plan = memory.plan(cfg_of("rollout.slots=5", "train.micro_tokens=1000", "train.activation_checkpointing=true"),
                       SMOLLM2, 1, "cpu", 22 * GiB)
    assert (plan.slots, plan.micro_tokens, plan.checkpointing, plan.auto) == (5, 1000, True, ())


def test_config_accepts_auto_and_booleans():
    cfg = cfg_of("rollout.slots=auto", "train.micro_tokens=auto", "train.activation_checkpointing=true")
    assert (cfg.rollout.slots, cfg.train.micro_tokens, cfg.train.activation_checkpointing) == (0, 0, "true")
    assert cfg_of("train.activation_checkpointing=False").train.activation_checkpointing == "false"
    defaults = load_config(None, [])
    assert (defaults.rollout.slots, defaults.train.micro_tokens, defaults.train.activation_checkpointing) == (0, 0, "auto")
    with pytest.raises(ConfigError, match="train.activation_checkpointing"):
        cfg_of("train.activation_checkpointing=maybe")
    with pytest.raises(ConfigError, match="rollout.slots"):
        cfg_of("rollout.slots=-1")


def test_yaml_true_false_still_work(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("train:\n  activation_checkpointing: true\n  micro_tokens: auto\nrollout:\n  slots: auto\n")
    cfg = load_config(str(path))
    assert (cfg.train.activation_checkpointing, cfg.train.micro_tokens, cfg.rollout.slots) == ("true", 0, 0)


# ------------------------------------------------------------------ the trainer's real tensors


def test_trainer_tensors_match_the_plan(tmp_path, monkeypatch):
    """Build the smoke run (tiny model, critic, reference) and compare the plan with the bytes of its tensors.
    The capacity is passed in (a 24 GiB machine with 21 GiB free), so the auto picks are the host's no matter
    how loaded it is."""
    from r1.trainer import Trainer

    monkeypatch.setattr(memory, "device_capacity", lambda device, fraction=1.0: 21 * GiB)
    cfg = cfg_of(f"run.dir={tmp_path / 'run'}", "rollout.slots=auto", "train.micro_tokens=auto", "data.train_size=8",
                 "data.test_size=2")
    t = Trainer(cfg)
    plan = t.plan
    nbytes = lambda ts: sum(x.numel() * x.element_size() for x in ts)  # noqa: E731
    assert t.actor.gen.slots == plan.slots == 4 * 2  # 4 prompts x 2 samples, one rank
    assert t.actor.gen.cache.k.nbytes + t.actor.gen.cache.v.nbytes == plan.items["kv cache"]
    assert nbytes(t.learner.ref.parameters()) == plan.items["ref"]
    # after one optimizer step the policy and critic hold params, grads and two AdamW moments each
    for model, opt, name in ((t.learner.policy, t.learner.opt, "policy"), (t.learner.critic, t.learner.copt, "critic")):
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        opt.step()
        state = [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v) and v.dim() > 0]
        held = nbytes(model.parameters()) + nbytes(p.grad for p in model.parameters()) + nbytes(state)
        assert held == plan.items[name], name
    assert plan.micro_tokens == 16384 and not plan.checkpointing


def test_trainer_refuses_before_creating_the_run_dir(tmp_path, monkeypatch):
    from r1 import memory
    from r1.trainer import Trainer

    # a fixed machine (24 GiB, 21 free): what is free right now would decide which refusal comes first
    monkeypatch.setattr(memory, "_available_ram", lambda: 21 * memory.GiB)
    monkeypatch.setattr(memory, "_total_ram", lambda: 24 * memory.GiB)
    monkeypatch.setattr(memory, "_rss", lambda: 1 * memory.GiB)
    run = tmp_path / "run"
    # within the key's range (<= 65536), far beyond memory: 65536 slots x 16384 positions of the tiny model
    msg = refusal(lambda: Trainer(cfg_of(f"run.dir={run}", "rollout.slots=65536", "rollout.cache_len=16384")))
    assert msg.startswith("config key 'rollout.slots'=65536")
    assert not run.exists()


def test_cpu_capacity_honours_memory_fraction(monkeypatch):
    """run.memory_fraction caps a CPU plan at that share of the machine's RAM, as it does a GPU's."""
    import torch
    from r1 import memory

    monkeypatch.setattr(memory, "_available_ram", lambda: 20 * memory.GiB)
    monkeypatch.setattr(memory, "_total_ram", lambda: 24 * memory.GiB)
    monkeypatch.setattr(memory, "_rss", lambda: 1 * memory.GiB)
    cpu = torch.device("cpu")
    assert memory.device_capacity(cpu) == 21 * memory.GiB
    assert memory.device_capacity(cpu, 0.25) == 6 * memory.GiB
    assert memory.device_capacity(cpu, 0.99) == 21 * memory.GiB  # what is free stays the bound


@pytest.mark.parametrize("ckpt", ["false", "true"])
@pytest.mark.parametrize("n", [2, 8])
def test_share_prefix_counts_the_gathered_keys_and_values(ckpt, n):
    """train.share_prefix: the attention saves keys and values gathered for each sample, a shared prompt's row
    read by up to rollout.n - 1 more samples: that many more copies a token, 2 x kv heads x head_dim in the
    matmul dtype, per layer (one layer at a time under checkpointing)."""
    base = ("model.path=smollm2-135m-instruct", "train.micro_tokens=8192", f"train.activation_checkpointing={ckpt}",
            f"rollout.n={n}")
    plain = memory.plan(cfg_of(*base), SMOLLM2, 1, "cuda", H200)
    shared = memory.plan(cfg_of(*base, "train.share_prefix=true"), SMOLLM2, 1, "cuda", H200)
    layers = 1 if ckpt == "true" else SMOLLM2.num_layers
    per_token = 2 * 2 * SMOLLM2.num_kv_heads * SMOLLM2.head_dim  # bf16 under autocast
    assert shared.update - plain.update == 8192 * layers * (n - 1) * per_token
