"""LoRA over one frozen base (r1/lora.py): the maths, the sharing, the generator, checkpoints and exports.

Unit tests build tiny random models directly; the end-to-end ones run the
smoke config shrunk as tests/test_trainer.py does, with model.lora_rank=4.
"""
import json
import os
import re
import shutil
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

import train
from kernels.logprob import logprob_entropy
from r1 import disk, lora, memory
from r1.config import ConfigError, load_config
from r1.learner import lora_models
from r1.model import ModelConfig, pack, tiny_config
from r1.run import build_model
from test_trainer import one_and_two_processes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMOKE = os.path.join(ROOT, "configs", "smoke.yaml")
TINY = ["rollout.prompts=2", "rollout.n=2", "rollout.max_new_tokens=8", "data.train_size=16", "data.test_size=4"]
LORA = ["model.lora_rank=4", "model.lora_alpha=8"]
FAKE_TOK = SimpleNamespace(hf=[0] * 256, eos_id=1)  # what build_model reads of a tokenizer for model.path=tiny


def read_metrics(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def comparable(line):
    return {k: v for k, v in line.items() if not k.startswith(("time_", "peak_mem")) and not k.endswith("_tok_s")}


def tiny_models(extra=(), arch="llama"):
    cfg = load_config(SMOKE, [*LORA, f"model.arch={arch}", *extra])
    torch.manual_seed(0)
    policy, critic, ref = lora_models(cfg, FAKE_TOK, torch.device("cpu"))
    return cfg, policy, critic, ref


def randomize_adapters(model, seed=1):
    """B is zero at init: give it values, as training would, so the adapters change the output."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("lora_B"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)


def test_config_keys_are_checked():
    with pytest.raises(ConfigError, match="model.lora_targets.*unknown projection 'qkv'"):
        load_config(SMOKE, ["model.lora_targets=[q_proj,qkv]"])
    with pytest.raises(ConfigError, match="model.lora_rank"):
        load_config(SMOKE, ["model.lora_rank=-2"])
    with pytest.raises(ConfigError, match="model.lora_dropout"):
        load_config(SMOKE, ["model.lora_dropout=1.5"])
    with pytest.raises(ConfigError, match="model.ref_path.*share the policy's frozen base"):
        load_config(SMOKE, [*LORA, "model.ref_path=smollm2-135m-instruct"])
    with pytest.raises(ConfigError, match="model.lora_targets"):
        load_config(SMOKE, [*LORA, "model.lora_targets=[]"])
    with pytest.raises(ConfigError, match="model.lora_rank.*RL stage only"):
        load_config(SMOKE, [*LORA, "train.stage=sft"])
    assert load_config(SMOKE).model.lora_rank == 0  # full fine-tuning by default


def test_forward_is_base_plus_scaled_low_rank_float64():
    torch.manual_seed(0)
    base = torch.nn.Linear(12, 7, bias=True).double()
    layer = lora.LoRALinear(base, rank=3, alpha=6.0, dropout=0.0).double()
    x = torch.randn(5, 12, dtype=torch.float64)
    assert torch.equal(layer(x), base(x))  # B = 0: step 0 is the base exactly
    with torch.no_grad():
        layer.lora_B.copy_(torch.randn(7, 3, dtype=torch.float64))
    want = x @ base.weight.T + base.bias + 2.0 * x @ (layer.lora_B @ layer.lora_A).T
    torch.testing.assert_close(layer(x), want, rtol=1e-12, atol=1e-12)
    assert layer.weight is base.weight  # the base Parameter itself, not a copy
    bound = 1 / 12 ** 0.5  # kaiming_uniform(a=sqrt(5)) as PEFT draws lora_A: U(-1/sqrt(in), 1/sqrt(in))
    assert layer.lora_A.abs().max() <= bound and layer.lora_A.abs().max() > bound / 2
    with lora.adapters_off(layer):
        assert torch.equal(layer(x), base(x))


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_one_base_shared_by_policy_critic_and_reference(arch):
    cfg, policy, critic, ref = tiny_models(["model.lora_targets=[q_proj,v_proj,down_proj]"], arch=arch)
    assert ref is None  # no reference model: the Learner runs the policy with adapters off
    body_p, body_c = dict(policy.model.named_parameters()), dict(critic.model.named_parameters())
    base_keys = [k for k in body_p if "lora_" not in k]
    assert base_keys and all(body_p[k].data_ptr() == body_c[k].data_ptr() for k in base_keys)
    assert all(body_p[k] is body_c[k] for k in base_keys)
    adapters = [k for k in body_p if "lora_" in k]
    assert len(adapters) == 2 * 3 * cfg.model.tiny_layers
    assert all(body_p[k].data_ptr() != body_c[k].data_ptr() for k in adapters)  # each model its own adapters
    adapters = {"model." + k for k in adapters}
    assert {k for k, p in policy.named_parameters() if p.requires_grad} == adapters
    assert {k for k, p in critic.named_parameters() if p.requires_grad} == adapters | {"score.weight", "score.bias"}
    # the base is the seeded tiny model: the reference (adapters off) computes exactly its logits
    torch.manual_seed(0)
    plain = build_model("tiny", cfg, FAKE_TOK, torch.device("cpu"), seed=cfg.run.seed)
    ids = torch.randint(0, 256, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(policy(ids), plain(ids))  # B = 0 at step 0
        randomize_adapters(policy)
        assert not torch.allclose(policy(ids), plain(ids))
        assert torch.equal(lora.Reference(policy)(ids), plain(ids))
        assert not torch.allclose(policy(ids), plain(ids))  # the adapters come back on


def test_gradients_reach_only_adapters_and_value_head():
    cfg, policy, critic, _ = tiny_models(["model.lora_dropout=0.1"])
    randomize_adapters(policy)
    ids, pos, cu, mx = pack([[3, 5, 7, 9, 11], [2, 4, 6]])
    sel = torch.arange(ids.numel() - 1)
    logp, ent = policy(ids, pos, cu, mx, sel=sel, targets=ids[1:])
    (logp.sum() + ent.sum()).backward()
    critic(ids, pos, cu, mx).sum().backward()
    for model in (policy, critic):
        for name, p in model.named_parameters():
            trains = "lora_" in name or name.startswith("score.")
            assert (p.grad is not None) == trains, name
            if trains and not (model is critic and "lora_A" in name):  # critic B = 0: A's gradient is 0
                assert p.grad.abs().sum() > 0, name


def test_merged_generator_matches_adapter_path():
    """The sampler-trainer gap: the generator's merged weights score tokens as the adapter path does."""
    cfg, policy, _, _ = tiny_models(["model.lora_dropout=0.2"])
    randomize_adapters(policy)
    gen = build_model("tiny", cfg, FAKE_TOK, torch.device("cpu"), seed=cfg.run.seed).eval()
    merged = lora.merge(policy.state_dict(), cfg.model.lora_alpha / cfg.model.lora_rank)
    assert merged.keys() == gen.state_dict().keys()
    gen.load_state_dict(merged)
    seqs = [[3, 5, 7, 9, 11, 13, 2], [2, 4, 6, 8]]
    ids, pos, cu, mx = pack(seqs)
    sel = torch.arange(ids.numel() - 1)
    with torch.no_grad():  # dropout only under a graph: scoring is deterministic
        a, _ = policy(ids, pos, cu, mx, sel=sel, targets=ids[1:])
        b, _ = gen(ids, pos, cu, mx, sel=sel, targets=ids[1:])
        base = build_model("tiny", cfg, FAKE_TOK, torch.device("cpu"), seed=cfg.run.seed)
        c, _ = base(ids, pos, cu, mx, sel=sel, targets=ids[1:])
    assert (a - b).abs().max() < 2e-5
    assert (a - c).abs().max() > 1e-3  # the adapters matter: the check above is not the base against itself
    with torch.no_grad():
        h = policy.hidden(ids, pos, cu, mx)[sel]
        torch.testing.assert_close(logprob_entropy(h, policy.head_weight, ids[1:])[0], a)
    h = policy.hidden(ids, pos, cu, mx)[sel]  # building a graph (the update): dropout on the adapters' input
    assert (logprob_entropy(h, policy.head_weight, ids[1:])[0].detach() - a).abs().max() > 1e-4


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_untied_model_exports_merged_and_peft_to_the_same_logits(tmp_path, arch):
    """The 7B and 14B shapes have their own LM head (untied), which stays frozen and out of the adapters."""
    from transformers import AutoModelForCausalLM

    peft = pytest.importorskip("peft", reason="peft is a test-only dependency (requirements-dev.txt)")
    torch.manual_seed(0)
    mc = tiny_config(arch, tie=False, vocab_size=128, num_layers=2)
    from r1.model import Transformer

    policy = Transformer(mc)
    for name, p in policy.named_parameters():
        if p.dim() == 2:
            torch.nn.init.normal_(p, std=0.05)
    base_dir, adapter = str(tmp_path / "base"), str(tmp_path / "adapter")
    policy.save_pretrained(base_dir)
    lora.freeze_base(lora.add_adapters(policy, 4, 8.0, ["q_proj", "o_proj", "up_proj", "down_proj"]))
    randomize_adapters(policy)
    assert not policy.lm_head.weight.requires_grad
    state = policy.state_dict()
    lora.save_peft(state, adapter, 4, 8.0, 0.0, ["q_proj", "o_proj", "up_proj", "down_proj"], base_dir)
    merged_dir = str(tmp_path / "merged")
    plain = Transformer(mc)
    plain.load_state_dict(lora.merge(state, 2.0))
    plain.save_pretrained(merged_dir)
    ids = torch.randint(0, 128, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = policy(ids)
        merged = AutoModelForCausalLM.from_pretrained(merged_dir, dtype=torch.float32).eval()(ids).logits
        hf_base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32).eval()
        before = hf_base(ids).logits.clone()
        theirs = peft.PeftModel.from_pretrained(hf_base, adapter).eval()(ids).logits
    assert (ours - merged).abs().max() < 1e-4 and (ours - theirs).abs().max() < 1e-4
    assert (before - theirs).abs().max() > 1e-3


def test_run_checkpoints_adapters_only_exports_merged_and_peft(tmp_path):
    from transformers import AutoModelForCausalLM

    from r1.trainer import Trainer

    run = str(tmp_path / "run")
    # the merged generator (the default, adapters, is the policy itself on one float32 process)
    cfg = load_config(SMOKE, [f"run.dir={run}", *TINY, *LORA, "model.lora_generator=merged", "log.tensorboard=false"])
    trainer = Trainer(cfg)
    trainer.fit()
    lines = read_metrics(run)
    assert [m["iter"] for m in lines] == [1, 2]
    assert all(m["grad_norm"] > 0 and m["skipped_updates"] == 0 for m in lines)
    assert all(m["logprob_gap_max"] < 1e-4 for m in lines)  # merged generator vs adapter trainer, float32
    assert lines[-1]["kl_ref"] != 0  # the reference is the base: adapters that moved make a KL
    policy = trainer.learner.policy
    assert any(p.abs().sum() > 0 for n, p in policy.named_parameters() if n.endswith("lora_B"))
    # the generator is a copy holding the merged weights, which the refresh before every rollout rewrites
    gen = trainer.actor.model
    assert gen is not policy and not any(isinstance(m, lora.LoRALinear) for m in gen.modules())
    merged = lora.merge(policy.state_dict(), cfg.model.lora_alpha / cfg.model.lora_rank)
    stale = [k for k, v in gen.state_dict().items() if not torch.equal(v, merged[k])]
    assert stale  # the last update came after the last rollout
    trainer.actor.refresh(policy)
    assert all(torch.equal(v, merged[k]) for k, v in gen.state_dict().items())
    # the checkpoint holds what trains: adapters, value head, their optimizers; no base weight
    from torch.distributed.checkpoint import FileSystemReader

    ckpt = os.path.join(run, "checkpoints", "iter_000002")
    keys = FileSystemReader(ckpt).read_metadata().state_dict_metadata.keys()
    models = [k for k in keys if k.startswith("model.")]
    assert models and all(("lora_" in k) or k.startswith("model.critic.score.") for k in models), models[:5]
    full_size = sum(p.numel() for p in policy.parameters())
    written = sum(os.path.getsize(os.path.join(ckpt, f)) for f in os.listdir(ckpt))
    assert written < 4 * full_size  # not even the float32 base once, let alone 12 bytes a parameter
    # the disk plan knows: an upper bound, within 15% here where the per-tensor headers (ENTRY_BYTES, an upper
    # bound) are most of the bytes; at 7B rank 16 the adapters' 12 bytes a parameter are 99% of them
    mc = trainer.model_cfg
    est = disk.checkpoint_bytes(cfg, mc, world=1)
    assert written <= est < 1.15 * written, (est, written)
    assert est < disk.model_checkpoint_bytes(mc, 1) / 10
    adapter_written = sum(os.path.getsize(os.path.join(run, "adapter", f)) for f in os.listdir(
        os.path.join(run, "adapter")))
    assert adapter_written <= disk.adapter_bytes(mc, 4, cfg.model.lora_targets) < adapter_written + 2 * disk.FILE_BYTES
    # hf/: the merged policy, which transformers loads to the same logits
    hf = AutoModelForCausalLM.from_pretrained(os.path.join(run, "hf"), dtype=torch.float32).eval()
    ids = torch.randint(0, trainer.model_cfg.vocab_size, (2, 11), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours, theirs = policy(ids), hf(ids).logits
    assert (ours - theirs).abs().max() < 1e-4
    # adapter/: PEFT loads it over the base to the same logits
    adapter = os.path.join(run, "adapter")
    assert sorted(os.listdir(adapter)) == ["adapter_config.json", "adapter_model.safetensors"]
    peft = pytest.importorskip("peft", reason="peft is a test-only dependency (requirements-dev.txt)")
    base_dir = str(tmp_path / "base")
    torch.manual_seed(cfg.run.seed)
    base = build_model("tiny", cfg, trainer.tok, torch.device("cpu"), seed=cfg.run.seed)
    base.save_pretrained(base_dir, tokenizer=trainer.tok)
    hf_base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        before = hf_base(ids).logits.clone()
    peft_model = peft.PeftModel.from_pretrained(hf_base, adapter).eval()
    with torch.no_grad():
        theirs = peft_model(ids).logits
    assert (ours - theirs).abs().max() < 1e-4
    assert (before - theirs).abs().max() > 1e-5  # the adapters were read, not left at zero


LOAD_ADAPTER = """
import sys, torch
from peft import AutoPeftModelForCausalLM
model = AutoPeftModelForCausalLM.from_pretrained(sys.argv[1], torch_dtype=torch.float32).eval()
ids = torch.arange(22).reshape(2, 11) % model.config.vocab_size
with torch.no_grad():
    torch.save(model(ids).logits, sys.argv[2])
"""


def test_adapter_loads_over_the_base_it_names_from_another_process(tmp_path):
    """docs/lora.md's lines, in a fresh process in another folder, offline: adapter/ names a base transformers
    loads (the tiny model's, written to run.dir/base), and base + adapter give the merged hf/'s logits."""
    import subprocess
    import sys

    from transformers import AutoModelForCausalLM

    from r1.trainer import Trainer

    pytest.importorskip("peft", reason="peft is a test-only dependency (requirements-dev.txt)")
    run = str(tmp_path / "run")
    cfg = load_config(SMOKE, [f"run.dir={run}", *TINY, *LORA, "train.steps=1", "log.tensorboard=false"])
    Trainer(cfg).fit()
    with open(os.path.join(run, "adapter", "adapter_config.json")) as f:
        assert json.load(f)["base_model_name_or_path"] == os.path.join(run, "base")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = str(tmp_path / "logits.pt")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    p = subprocess.run([sys.executable, "-c", LOAD_ADAPTER, os.path.join(run, "adapter"), out], cwd=elsewhere,
                       env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    hf = AutoModelForCausalLM.from_pretrained(os.path.join(run, "hf"), dtype=torch.float32).eval()
    base = AutoModelForCausalLM.from_pretrained(os.path.join(run, "base"), dtype=torch.float32).eval()
    ids = torch.arange(22).reshape(2, 11) % hf.config.vocab_size
    with torch.no_grad():
        merged, plain = hf(ids).logits, base(ids).logits
    theirs = torch.load(out)
    assert (merged - theirs).abs().max() < 1e-4
    assert (plain - theirs).abs().max() > 1e-5  # the adapters were applied, once


def test_resume_reproduces_uninterrupted_lora_run(tmp_path, capsys):
    straight, split = str(tmp_path / "straight"), str(tmp_path / "split")
    base = ["--config", SMOKE, *TINY, *LORA, "model.lora_dropout=0.1", "log.tensorboard=false"]
    train.main(base + [f"run.dir={straight}", "train.steps=4"])
    train.main(base + [f"run.dir={split}", "train.steps=2"])
    train.main(base + [f"run.dir={split}", "train.steps=4", "run.resume=true"])
    assert f"LoRA adapters in {os.path.join(split, 'adapter')}" in capsys.readouterr().out
    a, b = read_metrics(straight), read_metrics(split)
    assert [m["iter"] for m in b] == [1, 2, 3, 4]
    assert [comparable(m) for m in a] == [comparable(m) for m in b]
    for name in ("hf/model.safetensors", "adapter/adapter_model.safetensors"):
        wa, wb = load_file(os.path.join(straight, name)), load_file(os.path.join(split, name))
        assert wa.keys() == wb.keys()
        assert all(torch.equal(wa[k], wb[k]) for k in wa), name


@pytest.mark.parametrize("generator", ["merged", "adapters"])
def test_two_processes_match_one(tmp_path, tok_dir, generator):
    """torchrun with 2 CPU ranks (gloo, FSDP2 sharding the adapters; the frozen base left whole on each rank,
    still one set of tensors for policy and critic) vs 1 process on the same global batch, as
    tests/test_trainer.py checks full fine-tuning: losses and gradient norms catch a gradient summed
    instead of averaged; the exports match. With lora_generator=adapters each rank's generator shares the
    unsharded base and refreshes its adapters from the gathered ones (one process: the policy itself)."""
    common = ["--config", SMOKE, f"model.tokenizer={tok_dir}", *LORA, f"model.lora_generator={generator}",
              "rollout.prompts=3", "rollout.n=2",
              "rollout.max_new_tokens=8", "data.train_size=16", "rollout.temperature=1.0", "train.steps=2",
              "algo.minibatches=1", "train.micro_tokens=1", "log.tensorboard=false", "log.trajectories=false"]
    one, two = one_and_two_processes(common, tmp_path, ("pg_loss", "value_loss", "grad_norm", "critic_grad_norm",
                                                         "entropy", "reward_mean", "kl_ref"), timeout=300)
    for name in ("hf/model.safetensors", "adapter/adapter_model.safetensors"):
        wa, wb = load_file(os.path.join(one, name)), load_file(os.path.join(two, name))
        assert wa.keys() == wb.keys()
        for k in wa:
            assert (wa[k] - wb[k]).abs().max() < 1e-5, (name, k)
    adapters = load_file(os.path.join(two, "adapter", "adapter_model.safetensors"))
    assert any(v.abs().sum() > 0 for k, v in adapters.items() if "lora_B" in k)  # trained, not the zero init
    from torch.distributed.checkpoint import FileSystemReader

    folder = os.path.join(two, "checkpoints", "iter_000002")
    keys = [k for k in FileSystemReader(folder).read_metadata().state_dict_metadata if k.startswith("model.")]
    assert keys and all("lora_" in k or k.startswith("model.critic.score.") for k in keys), keys[:5]
    written = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))
    with open(os.path.join(two, "hf", "config.json")) as f:
        mc = ModelConfig.from_hf(json.load(f))
    est = disk.checkpoint_bytes(load_config(os.path.join(two, "config.yaml")), mc, world=2)
    assert written <= est < 1.3 * written, (est, written)  # headers are most of it at this size (see above)


def test_full_fine_tuning_is_untouched():
    """lora_rank=0: build_models gives today's models, every parameter trains, no adapter anywhere."""
    from r1.learner import build_models

    cfg = load_config(SMOKE)
    torch.manual_seed(0)
    policy, critic, ref = build_models(cfg, FAKE_TOK, torch.device("cpu"))
    for m in (policy, critic):
        assert not any(isinstance(x, lora.LoRALinear) for x in m.modules())
        assert lora.trainable(m) == list(m.parameters())
    assert ref is not None
    assert policy.model.embed_tokens.weight.data_ptr() != critic.model.embed_tokens.weight.data_ptr()


QWEN7B = dict(arch="qwen2", vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_layers=28, num_heads=28,
              num_kv_heads=4, head_dim=128, qkv_bias=True, tie_embeddings=False)


def test_memory_plan_counts_one_frozen_base_and_suggests_lora():
    """Qwen2.5-7B's shape on one H200 (139.8 GiB usable), configs/gsm8k_tool.yaml's batch: full fine-tuning
    cannot fit (16 bytes a parameter); the refusal names model.lora_rank, whose plan fits."""
    mc, cap = ModelConfig(**QWEN7B), int(139.8 * memory.GiB)
    tool = [os.path.join(ROOT, "configs", f) for f in ("gsm8k_tool.yaml", "ablations/synchronous.yaml")]
    with pytest.raises(ConfigError, match=r"set model.lora_rank=16 train.sft_steps=0 \(peak 1[0-3]\d\.\d GiB\)"):
        memory.plan(load_config(tool), mc, 1, "cuda", cap)
    cfg = load_config(tool, ["model.lora_rank=16", "train.sft_steps=0"])
    plan = memory.plan(cfg, mc, 1, "cuda", cap)
    assert plan.fits
    P, A = memory.param_count(mc), memory.lora_param_count(mc, 16, cfg.model.lora_targets)
    assert A == 28 * 16 * (2 * (3584 + 3584) + 2 * (3584 + 512) + 3 * (3584 + 18944))
    assert plan.items["base"] == 2 * P and plan.items["generator"] == 2 * A  # bf16 base once; bf16 adapter copies
    merged = memory.plan(load_config(tool, ["model.lora_rank=16", "train.sft_steps=0", "model.lora_generator=merged"]),
                         mc, 1, "cuda", cap)
    assert merged.items["generator"] == 2 * P  # a merged bf16 copy of the whole model
    assert plan.items["policy"] == 16 * A and plan.items["critic"] == 16 * (A + 3584 + 1)
    assert "ref" not in plan.items  # the reference is the base with adapters off
    # where the SFT warm-up fits as it is (the 3B shape on 60 GiB: policy alone), the hint keeps it
    from test_memory import QWEN3B_SMOL
    with pytest.raises(ConfigError, match=r"set model.lora_rank=16 \(peak \d+\.\d GiB\)$"):
        memory.plan(load_config(tool), QWEN3B_SMOL, 1, "cuda", 60 * memory.GiB)
    # no hint where LoRA is set already
    with pytest.raises(ConfigError) as e:
        memory.plan(load_config(tool, ["model.lora_rank=8", "train.sft_steps=0"]), mc, 1, "cuda", 20 * memory.GiB)
    assert "set model.lora_rank" not in str(e.value)
    # the CPU: the float32 base, no autocast copies; the generator is the policy itself, or a merged copy
    small = tiny_config("llama", vocab_size=256)
    p_cpu = memory.plan(load_config(SMOKE, LORA), small, 1, "cpu", 64 * memory.GiB)
    assert p_cpu.items["base"] == 4 * memory.param_count(small) and p_cpu.items["generator"] == 0
    p_cpu = memory.plan(load_config(SMOKE, [*LORA, "model.lora_generator=merged"]), small, 1, "cpu", 64 * memory.GiB)
    assert p_cpu.items["base"] == 4 * memory.param_count(small) == p_cpu.items["generator"]


def test_adapters_generator_shares_the_base_and_scores_as_the_update():
    """model.lora_generator=adapters: the generator holds the policy's base Parameter objects (nothing copied)
    and copies of the adapters that refresh moves; in float32 it scores exactly as the policy, and in bf16 (the
    CUDA set-up: bf16 base, float32 adapters under autocast) exactly as the update does, where the merged bf16
    weights do not. A fused projection would skip the adapters: the generator does not fuse them."""
    from r1.actor import copy_weights
    from r1.model import fuse_projections

    cfg, policy, _, _ = tiny_models(["model.lora_generator=adapters"])
    randomize_adapters(policy)
    gen = lora.generator_copy(policy, torch.float32)
    own = dict(gen.named_parameters())
    for name, p in policy.named_parameters():
        if name.endswith(("lora_A", "lora_B")):
            assert own[name] is not p and torch.equal(own[name], p) and not own[name].requires_grad
        else:
            assert own[name] is p  # the shared base
    seqs = [[3, 5, 7, 9, 11, 13, 2], [2, 4, 6, 8]]
    ids, pos, cu, mx = pack(seqs)
    sel = torch.arange(ids.numel() - 1)

    def score(m, autocast=False):
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            return m(ids, pos, cu, mx, sel=sel, targets=ids[1:])[0].float()

    assert torch.equal(score(gen), score(policy))
    randomize_adapters(policy, seed=7)  # an update: the generator is stale until refresh copies the adapters
    assert not torch.equal(score(gen), score(policy))
    copy_weights(cfg, gen, policy)
    assert torch.equal(score(gen), score(policy))
    assert fuse_projections(gen) is gen and all(layer.self_attn.fused is None and layer.mlp.fused is None
                                                for layer in gen.model.layers)
    assert torch.equal(score(gen), score(policy))

    # adapters on q and v only: gate/up could fuse, but that would copy the shared base: nothing is fused
    cfg2, policy2, _, _ = tiny_models(["model.lora_targets=[q_proj,v_proj]"])
    gen2 = fuse_projections(lora.generator_copy(policy2, torch.float32))
    layer, layer2 = gen2.model.layers[0], policy2.model.layers[0]
    assert layer.mlp.fused is None and layer.mlp.gate_proj.weight is layer2.mlp.gate_proj.weight

    # bf16, as on CUDA: small adapters (B ~ 1e-3), the update's arithmetic against the two generators
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if name.endswith("lora_B"):
                p.mul_(0.02)
    policy.to(torch.bfloat16)
    for m in policy.modules():
        if isinstance(m, lora.LoRALinear):  # the adapters stay float32, as lora_models leaves them
            m.lora_A.data, m.lora_B.data = m.lora_A.data.float(), m.lora_B.data.float()
    update = score(policy, autocast=True)
    adapters = score(lora.generator_copy(policy, torch.bfloat16))
    merged_model = build_model("tiny", cfg, FAKE_TOK, torch.device("cpu"), seed=cfg.run.seed).to(torch.bfloat16)
    merged_model.load_state_dict(lora.merge(policy.state_dict(), cfg.model.lora_alpha / cfg.model.lora_rank))
    merged = score(merged_model.eval())
    assert torch.equal(adapters, update)
    assert (merged - update).abs().max() > 0  # the merge rounded part of the update away


def test_adapters_generator_in_a_run_and_its_memory_plan(tmp_path):
    """A run with train.overlap=1 (a generator of its own on the CPU) and lora_generator=adapters: the
    generator shares the policy's base, learns through refresh, and the plan counts only its adapters."""
    from r1.trainer import Trainer

    cfg = load_config(SMOKE, [f"run.dir={tmp_path / 'run'}", *TINY, *LORA, "model.lora_generator=adapters",
                              "train.overlap=1", "algo.advantage=grpo", "algo.kl_coef=0",
                              "algo.policy_loss=decoupled_ppo", "algo.tis_cap=2", "train.steps=3", "train.lr=3e-3",
                              "log.tensorboard=false"])
    trainer = Trainer(cfg)
    gen, policy = trainer.actor.model, trainer.learner.policy
    assert gen is not policy
    assert gen.model.embed_tokens.weight is policy.model.embed_tokens.weight
    assert gen.model.layers[0].self_attn.q_proj.weight is policy.model.layers[0].self_attn.q_proj.weight
    trainer.fit()
    # B starts at zero: the generator's copy moved with a trained policy (one update behind it: overlap; the
    # refresh before iteration 3's play, the last iteration refreshing nothing no play would use)
    assert gen.model.layers[0].self_attn.q_proj.lora_B.abs().sum() > 0
    assert not gen.model.layers[0].self_attn.q_proj.lora_B.requires_grad
    small = tiny_config("llama", vocab_size=256)
    A = memory.lora_param_count(small, 4, cfg.model.lora_targets)
    plan = memory.plan(cfg, small, 1, "cpu", 64 * memory.GiB)
    assert plan.items["generator"] == 4 * A  # fp32 adapters over the shared fp32 base
    cuda = memory.plan(load_config(SMOKE, [*LORA, "model.lora_generator=adapters"]), small, 1, "cuda",
                       64 * memory.GiB)
    assert cuda.items["generator"] == 2 * A  # bf16 adapters over the shared bf16 base
    with pytest.raises(ConfigError, match="model.lora_generator"):
        load_config(SMOKE, [*LORA, "model.lora_generator=unmerged"])


def test_a_policy_that_generates_keeps_its_dropout_for_the_update(tmp_path):
    """One float32 process: the adapters generator is the policy itself. Sampling runs it in eval mode; the
    update after it must find it in training mode again, or model.lora_dropout would silently never apply."""
    from r1.trainer import Trainer

    cfg = load_config(SMOKE, [f"run.dir={tmp_path / 'run'}", *TINY, *LORA, "model.lora_dropout=0.3",
                              "train.steps=1", "log.tensorboard=false"])
    trainer = Trainer(cfg)
    policy = trainer.learner.policy
    assert trainer.actor.model is policy
    modes = []
    update = trainer.learner.update

    def recording(*a, **k):
        modes.append(all(m.training for m in policy.modules() if isinstance(m, lora.LoRALinear)))
        return update(*a, **k)

    trainer.learner.update = recording
    trainer.fit()
    assert modes == [True]


def test_an_sft_warm_up_trains_every_weight_then_rl_adapts_its_policy(tmp_path, tok_dir):
    """train.sft_steps with model.lora_rank: the warm-up is full fine-tuning (its config says rank 0), and the
    RL phase's frozen base is the SFT policy it exported, to the bit."""
    run = tmp_path / "run"
    train.main(["--config", SMOKE, *TINY, *LORA, f"run.dir={run}", f"model.tokenizer={tok_dir}", "train.sft_steps=2",
                "train.steps=1", "log.tensorboard=false"])
    with open(run / "sft" / "config.yaml") as f:
        assert "lora_rank: 0" in f.read()
    sft = load_file(str(run / "sft" / "hf" / "model.safetensors"))
    adapters = load_file(str(run / "adapter" / "adapter_model.safetensors"))
    assert adapters and all("lora_" in k for k in adapters)
    merged = load_file(str(run / "hf" / "model.safetensors"))
    base_a = sft["model.layers.0.self_attn.q_proj.weight"]
    assert not torch.equal(merged["model.layers.0.self_attn.q_proj.weight"], base_a)  # the adapters trained...
    assert torch.equal(merged["model.embed_tokens.weight"], sft["model.embed_tokens.weight"])  # ...over SFT's base


@pytest.mark.gpu
def test_cuda_sampler_trainer_gap_of_lora_is_no_larger_than_full_fine_tuning(tmp_path):
    """On CUDA the generator samples in bf16 with the decode kernels while the update scores in bf16 autocast
    over float32 masters: the gap that leaves must not grow with LoRA. Both generators run beside full
    fine-tuning in one process, over iterations whose updates move the adapters (lr 3e-3)."""
    from r1.trainer import Trainer

    tok = [f"model.tokenizer={os.environ['R1_TEST_TOKENIZER']}"] if os.environ.get("R1_TEST_TOKENIZER") else []
    gaps = {}
    for name, extra in (("full", []), ("adapters", [*LORA, "model.lora_generator=adapters"]),
                        ("merged", [*LORA, "model.lora_generator=merged"])):
        run = tmp_path / name
        cfg = load_config(SMOKE, [f"run.dir={run}", *TINY, *extra, *tok, "run.device=cuda", "train.steps=4",
                                  "train.lr=3e-3", "rollout.prompts=8", "rollout.n=4", "rollout.max_new_tokens=32",
                                  "log.tensorboard=false"])
        trainer = Trainer(cfg)
        trainer.fit()
        gaps[name] = [m["logprob_gap_mean"] for m in read_metrics(run)]
        if name != "full":
            assert trainer.actor.model is not trainer.learner.policy  # a bf16 generator beside the trainer
            assert any(p.abs().sum() > 0 for n, p in trainer.learner.policy.named_parameters()
                       if n.endswith("lora_B"))
    print("mean sampler-trainer gap per iteration:", gaps)
    full = sum(gaps["full"]) / len(gaps["full"])
    assert full > 0  # bf16 sampling against the update's arithmetic: the measure sees something
    for name in ("adapters", "merged"):
        assert sum(gaps[name]) / len(gaps[name]) <= 2 * full + 1e-4, (name, gaps)


def test_load_peft_puts_a_runs_adapters_back_unmerged_as_its_generator_ran_them(tmp_path):
    """eval.py's path for a LoRA run (eval.adapter): the base plus adapter/ loaded by `load_peft`, cast to the
    rollout dtype, scores exactly as the run's adapters generator (lora.generator_copy) in float32 and in bf16,
    where the merged bf16 weights (hf/ on a GPU) do not; a folder that does not fit is one ValueError naming it."""
    cfg, policy, _, _ = tiny_models(["model.lora_generator=adapters", "model.lora_targets=[q_proj,v_proj,down_proj]"])
    randomize_adapters(policy)
    with torch.no_grad():  # small adapters, as after a few hundred AdamW steps at lr 1e-4
        for name, p in policy.named_parameters():
            if name.endswith("lora_B"):
                p.mul_(0.02)
    folder = str(tmp_path / "adapter")
    lora.save_peft(policy.state_dict(), folder, 4, 8.0, 0.0, cfg.model.lora_targets, "tiny")
    seqs = [[3, 5, 7, 9, 11, 13, 2], [2, 4, 6, 8]]
    ids, pos, cu, mx = pack(seqs)
    sel = torch.arange(ids.numel() - 1)

    def score(m):
        with torch.no_grad():
            return m(ids, pos, cu, mx, sel=sel, targets=ids[1:])[0].float()

    def base():
        return build_model("tiny", cfg, FAKE_TOK, torch.device("cpu"), seed=cfg.run.seed)

    for dtype in (torch.float32, torch.bfloat16):
        loaded = lora.load_peft(base(), folder).to(dtype).eval()
        if dtype == torch.bfloat16:
            policy.to(torch.bfloat16)  # the CUDA set-up: a bf16 base, float32 adapters
            for m in policy.modules():
                if isinstance(m, lora.LoRALinear):
                    m.lora_A.data, m.lora_B.data = m.lora_A.data.float(), m.lora_B.data.float()
        assert torch.equal(score(loaded), score(lora.generator_copy(policy, dtype))), dtype
    merged = base().to(torch.bfloat16)
    merged.load_state_dict(lora.merge(policy.state_dict(), cfg.model.lora_alpha / cfg.model.lora_rank))
    assert (score(merged.eval()) - score(loaded)).abs().max() > 0  # what evaluating hf/ would have scored
    # folders that do not fit: one line naming the folder
    with pytest.raises(ValueError, match=f"LoRA adapter folder {tmp_path / 'nope'}: no such folder"):
        lora.load_peft(base(), str(tmp_path / "nope"))
    (tmp_path / "not_adapter").mkdir()  # a folder that exists but is not an adapter: name what it lacks
    with pytest.raises(ValueError, match="is not a PEFT adapter: it has no adapter_config.json and no "
                                         "adapter_model.safetensors"):
        lora.load_peft(base(), str(tmp_path / "not_adapter"))
    small = tiny_config("llama", vocab_size=256, hidden_size=32, intermediate_size=64)
    with pytest.raises(ValueError, match="does not fit the model: .*down_proj.lora_A.weight is \\[4, 128\\], the model's \\[4, 64\\]"):
        lora.load_peft(__import__("r1.model", fromlist=["Transformer"]).Transformer(small), folder)
    conf = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    (tmp_path / "adapter" / "adapter_config.json").write_text(json.dumps({**conf, "use_rslora": True}))
    with pytest.raises(ValueError, match="asks for rsLoRA, DoRA or per-module"):
        lora.load_peft(base(), folder)
    (tmp_path / "adapter" / "adapter_config.json").write_text(json.dumps({**conf, "target_modules": ["q_proj"]}))
    with pytest.raises(ValueError, match="does not fit the model: an unknown tensor .*down_proj.lora_A.weight"):
        lora.load_peft(base(), folder)


def test_eval_py_on_a_lora_run_runs_its_base_with_the_adapters_unmerged(tmp_path, capsys):
    """eval.py model.path=RUN of a LoRA run: the base (the run's model.path) with RUN/adapter unmerged (its
    config.yaml records eval.adapter), a notice line saying so; the same greedy episodes as the run's own
    float32 hf/ here (on a GPU the bf16 merge would differ); where the base is gone, hf/ with a warning."""
    import eval as eval_py

    run = str(tmp_path / "run")
    train.main(["--config", SMOKE, *TINY, *LORA, "model.lora_generator=adapters", "log.tensorboard=false",
                f"run.dir={run}", "train.steps=2", "train.lr=3e-3"])
    capsys.readouterr()
    ev = ["--config", SMOKE, *LORA, "eval.limit=4", "rollout.max_new_tokens=8"]
    eval_py.main(ev + [f"model.path={run}", f"eval.out={tmp_path / 'e1'}"])
    out = capsys.readouterr()
    assert f"evaluating {run} as its generator ran: its base tiny with {os.path.join(run, 'adapter')} unmerged" in out.err
    assert f"adapter: {os.path.join(run, 'adapter')}" in (tmp_path / "e1" / "config.yaml").read_text()
    eval_py.main(ev + [f"model.path={os.path.join(run, 'hf')}", f"eval.out={tmp_path / 'e2'}"])
    capsys.readouterr()
    a, b = (json.loads((tmp_path / e / "eval.json").read_text()) for e in ("e1", "e2"))
    assert {k: v for k, v in a.items() if k != "model"} == {k: v for k, v in b.items() if k != "model"}
    # eval settings that would build another random tiny base: its merged hf/, with a warning
    eval_py.main(ev + [f"model.path={run}", "run.seed=7", f"eval.out={tmp_path / 'e5'}"])
    assert "would build another one than the run's" in capsys.readouterr().err
    assert "adapter: null" in (tmp_path / "e5" / "config.yaml").read_text()
    # the base is gone (a run folder copied to another machine): its merged hf/, with a warning
    conf = os.path.join(run, "config.yaml")
    with open(conf) as f:
        text = f.read()
    with open(conf, "w") as f:
        f.write(text.replace("path: tiny", f"path: {tmp_path / 'gone'}"))
    eval_py.main(ev + [f"model.path={run}", f"eval.out={tmp_path / 'e3'}"])
    err = capsys.readouterr().err
    assert f"warning: {run}'s base {tmp_path / 'gone'} is not here: evaluating its merged hf/" in err
    assert "hf/ export (float32) instead, which matches the adapters up to float rounding" in err  # a CPU run's hf/
    assert "adapter: null" in (tmp_path / "e3" / "config.yaml").read_text()
    # adapters named by hand over a run folder would go on twice: refused in one line
    with pytest.raises(SystemExit, match=f"^error: eval.adapter=.* goes over a base model, and model.path={run} is a run"):
        eval_py.main(ev + [f"model.path={run}", f"eval.adapter={os.path.join(run, 'adapter')}",
                           f"eval.out={tmp_path / 'e4'}"])
    assert not (tmp_path / "e4").exists()
    # eval.adapter naming a folder that is not an adapter: refused before any model loads, naming what it lacks
    with pytest.raises(SystemExit, match="is not a PEFT adapter: it has no adapter_config.json and no adapter_model"):
        eval_py.main(ev + ["model.path=tiny", f"eval.adapter={tmp_path / 'e1'}", f"eval.out={tmp_path / 'e6'}"])
    # the base gone and hf/ too: one error line, not a warning followed by another run's diagnosis
    shutil.move(os.path.join(run, "hf"), str(tmp_path / "hf_away"))
    capsys.readouterr()
    with pytest.raises(SystemExit, match=re.escape(f"error: model.path={run} is a LoRA run whose base "
                                                   f"{tmp_path / 'gone'} is not here, and it has no hf/ export")):
        eval_py.main(ev + [f"model.path={run}", f"eval.out={tmp_path / 'e7'}"])
    assert capsys.readouterr().err == "" and not (tmp_path / "e6").exists() and not (tmp_path / "e7").exists()


@pytest.mark.parametrize("key,says", [("model.lora_targets", "expects a list of str, got None"),
                                      ("model.lora_rank", "expects int, got None")])
def test_a_null_lora_key_on_the_command_line_is_one_config_error(key, says):
    """`model.lora_targets=null` was an AttributeError traceback from the text parser; YAML's null already said it."""
    with pytest.raises(ConfigError, match=f"config key '{key}' \\(command line\\) {says}"):
        load_config(SMOKE, [f"{key}=null"])


def test_a_resume_that_cannot_load_leaves_the_run_folder_as_it_was(tmp_path, capsys):
    """A resume with another model.lora_rank (allowed by run.allow_config_change) cannot load the checkpoint: it
    used to rewrite config.yaml and identity.json first, so that the right resume was then refused as a change."""
    run = tmp_path / "run"
    base = ["--config", SMOKE, *TINY, *LORA, "log.tensorboard=false", f"run.dir={run}"]
    train.main(base + ["train.steps=1"])
    before = {f: (run / f).read_bytes() for f in ("config.yaml", "identity.json")}
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        train.main(base + ["train.steps=2", "run.resume=true", "model.lora_rank=8", "run.allow_config_change=true"])
    assert e.value.code == 2
    assert "no checkpoint in" in capsys.readouterr().err
    assert {f: (run / f).read_bytes() for f in before} == before and not (run / "config.1.yaml").exists()
    train.main(base + ["train.steps=2", "run.resume=true"])  # the right resume still goes
    assert [m["iter"] for m in read_metrics(str(run))] == [1, 2]
