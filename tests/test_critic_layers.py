"""model.critic_layers: a critic of the first k blocks of its model (r1/learner.first_layers).

Checked: its values are those of a k-block model holding the same weights
(the cut keeps the embedding, the first k blocks, the final norm and the
value head, nothing else); the built critic starts from the policy's first k
blocks, with or without LoRA (shared Parameter objects there); the memory and
disk plans count k blocks and the disk plan's estimate bounds a real
checkpoint sharded over 2 ranks (torchrun, FSDP2), whose run matches 1 process;
a run with it resumes to the uninterrupted run's weights; a depth the model has
not, a negative one, or one set for an estimator without a critic is a
one-line config error.
"""
import os

from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

import train
from r1 import disk, memory
from r1.config import ConfigError, load_config
from r1.learner import build_models, first_layers
from r1.model import ModelConfig, Transformer, tiny_config
from test_trainer import SMOKE, TINY, check_disk_estimate, one_and_two_processes, read_metrics

TOK = SimpleNamespace(hf=[0] * 256, eos_id=1)  # what build_model reads of a tokenizer for model.path=tiny


def tiny_critic(layers=4):
    torch.manual_seed(0)
    mc = tiny_config("llama", tie=True, vocab_size=97, num_layers=layers, hidden_size=32, intermediate_size=64)
    critic = Transformer(mc, value_head=True).double()
    for p in critic.parameters():
        torch.nn.init.normal_(p, std=0.1)
    return critic


def packed(n=11, vocab=97):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (n,), generator=g)
    pos = torch.cat([torch.arange(6), torch.arange(n - 6)])
    cu = torch.tensor([0, 6, n], dtype=torch.int32)
    return ids, pos, cu, 6


@pytest.mark.parametrize("k", [1, 2, 3])
def test_values_are_those_of_a_k_block_model(k):
    full = tiny_critic(4)
    state = {name: t.clone() for name, t in full.state_dict().items()}
    cut = first_layers(full, k, "tiny")
    assert len(cut.model.layers) == cut.cfg.num_layers == k
    ref = Transformer(full.cfg.replace(num_layers=k), value_head=True).double()
    kept = {n: t for n, t in state.items() if not n.startswith("model.layers.") or int(n.split(".")[2]) < k}
    ref.load_state_dict(kept)  # strict: the cut model holds exactly these tensors
    assert set(cut.state_dict()) == set(kept)
    ids, pos, cu, mx = packed()
    with torch.no_grad():
        got, want = cut(ids, pos, cu, mx), ref(ids, pos, cu, mx)
        whole = tiny_critic(4)(ids, pos, cu, mx)
    assert got.shape == (ids.shape[0],)
    assert torch.equal(got, want)
    assert not torch.allclose(got, whole)  # the cut changes the values: the test can tell a no-op


def test_all_layers_or_zero_is_the_model_itself():
    critic = tiny_critic(3)
    layers = critic.model.layers
    assert first_layers(critic, 0, "tiny").model.layers is layers
    assert first_layers(critic, 3, "tiny").model.layers is layers
    with pytest.raises(ConfigError, match=r"model.critic_layers'=4: the critic's model \(tiny\) has 3 layers"):
        first_layers(critic, 4, "tiny")


def test_built_critic_starts_from_the_policys_first_blocks():
    cfg = load_config(SMOKE, ["model.tiny_layers=3", "model.critic_layers=2"])
    policy, critic, _ = build_models(cfg, TOK, torch.device("cpu"))
    assert len(policy.model.layers) == 3 and len(critic.model.layers) == 2
    for i in range(2):
        for (n, a), (_, b) in zip(policy.model.layers[i].named_parameters(), critic.model.layers[i].named_parameters()):
            assert torch.equal(a, b) and a is not b, n
    assert sum(p.numel() for p in critic.parameters()) == memory.param_count(
        memory.critic_config(cfg, policy.cfg), value_head=True)


def test_lora_critic_shares_the_first_blocks_and_adapts_only_them():
    cfg = load_config(SMOKE, ["model.tiny_layers=3", "model.critic_layers=1", "model.lora_rank=4"])
    policy, critic, _ = build_models(cfg, TOK, torch.device("cpu"))
    assert len(critic.model.layers) == 1
    assert critic.model.layers[0].self_attn.q_proj.weight is policy.model.layers[0].self_attn.q_proj.weight
    shared = {id(p) for p in policy.parameters()}
    body = [p for n, p in critic.named_parameters() if not p.requires_grad]
    assert body and all(id(p) in shared for p in body)
    trained = [n for n, p in critic.named_parameters() if p.requires_grad]
    assert trained and all(n.startswith(("model.layers.0.", "score.")) for n in trained), trained


def test_plans_count_k_blocks():
    mc = ModelConfig()  # SmolLM2-135M's shape
    full = load_config("configs/gsm8k_tool.yaml", [])
    half = load_config("configs/gsm8k_tool.yaml", ["model.critic_layers=15"])
    a = memory.estimate(full, mc, 1, "cuda", 139 * 2 ** 30, slots=512)
    b = memory.estimate(half, mc, 1, "cuda", 139 * 2 ** 30, slots=512)
    assert b.items["policy"] == a.items["policy"]
    per_block = 16 * memory.layer_params(mc)
    assert a.items["critic"] - b.items["critic"] == 15 * per_block
    assert "15 of 30 blocks" in b.notes["critic"]
    assert disk.checkpoint_bytes(full, mc, 1) - disk.checkpoint_bytes(half, mc, 1) > 12 * 15 * memory.layer_params(mc)
    with pytest.raises(ConfigError, match="critic_layers'=31: the model .* has 30 layers"):
        memory.estimate(load_config("configs/gsm8k_tool.yaml", ["model.critic_layers=31"]), mc, 1,
                        "cuda", 139 * 2 ** 30, slots=512)


@pytest.mark.parametrize("override, match", [
    ("model.critic_layers=-1", "must be >= 0"),
    ("model.critic_layers=abc", "critic_layers"),
])
def test_bad_values_are_config_errors(override, match):
    with pytest.raises(ConfigError, match=match) as e:
        load_config(SMOKE, [override])
    assert "\n" not in str(e.value)


def test_set_without_a_critic_is_refused_or_dormant(tmp_path):
    with pytest.raises(ConfigError, match=r"model.critic_layers.* does not apply to algo.advantage=grpo \(no critic\)"):
        load_config(SMOKE, ["algo.advantage=grpo", "algo.kl_coef=0", "model.critic_layers=1"])
    base = tmp_path / "base.yaml"  # set in a base file, switched off by a later choice: a warning, not an error
    base.write_text(open(SMOKE).read().replace("  tiny_hidden: 64\n", "  tiny_hidden: 64\n  critic_layers: 1\n"))
    with pytest.warns(UserWarning, match="critic_layers.*ignored"):
        load_config(str(base), ["algo.advantage=grpo"])


def test_run_with_a_cut_critic_resumes_exactly(tmp_path, tok_dir):
    straight, split = str(tmp_path / "straight"), str(tmp_path / "split")
    base = ["--config", SMOKE, *TINY, f"model.tokenizer={tok_dir}", "model.critic_layers=1", "log.tensorboard=false"]
    train.main(base + [f"run.dir={straight}", "train.steps=3"])
    train.main(base + [f"run.dir={split}", "train.steps=2"])
    train.main(base + [f"run.dir={split}", "train.steps=3", "run.resume=true"])
    a, b = read_metrics(straight), read_metrics(split)
    assert [m["iter"] for m in b] == [1, 2, 3]
    assert [m["value_loss"] for m in a] == [m["value_loss"] for m in b]
    wa = load_file(os.path.join(straight, "hf", "model.safetensors"))
    wb = load_file(os.path.join(split, "hf", "model.safetensors"))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_two_processes_match_one_with_a_cut_critic(tmp_path, tok_dir):
    common = ["--config", SMOKE, f"model.tokenizer={tok_dir}", "model.critic_layers=1", "rollout.prompts=3",
              "rollout.n=2", "rollout.max_new_tokens=8", "data.train_size=16", "rollout.temperature=1.0",
              "train.steps=2", "algo.minibatches=1", "log.tensorboard=false", "log.trajectories=false"]
    _, two = one_and_two_processes(common, tmp_path, ("pg_loss", "value_loss", "grad_norm", "critic_grad_norm"))
    check_disk_estimate(two, "iter_000002")  # the cut critic's checkpoint, sharded over 2 ranks
