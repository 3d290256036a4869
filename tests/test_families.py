"""The family registry, and parity with transformers for the families beyond llama/qwen2/qwen3.

Each new family (Llama 3.x's rope scaling, Mistral, SmolLM3's NoPE layers) is checked on a random
shrunken config built in code: logits (batched and packed), a greedy continuation through r1's
generator (prefill, then decode through the KV cache) against transformers' generate, and a training
forward (token logprobs through the fused kernel) with the gradient of every parameter.
"""
import pytest
import torch
import transformers

from r1 import families
from r1.generate import Generator, Sampling
from r1.model import ModelConfig, Transformer, pack, tiny_config

# (family, tiny_config overrides): original context 32 puts the head's 8 frequencies in all three of
# llama3's bands (kept, blended, divided), so every branch of the scaling is exercised
CASES = {
    "llama3": ("llama", {"rope_llama3": (8.0, 1.0, 4.0, 32)}),
    "mistral": ("mistral", {}),
    "smollm3": ("smollm3", {"num_layers": 3}),
}


def twin(arch, seed=0, **kw):
    """A random transformers model of tiny_config(arch) and ours with the same weights (untied: a tied
    random model mostly repeats its input)."""
    cfg = tiny_config(arch, tie=False, **kw)
    torch.manual_seed(seed)
    hf_cfg = transformers.AutoConfig.for_model(**cfg.to_hf(), pad_token_id=None)  # SmolLM3's default is past 256
    hf = transformers.AutoModelForCausalLM.from_config(hf_cfg, attn_implementation="eager").float().eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    ours = Transformer(cfg)
    ours.load_state_dict(hf.state_dict(), strict=True)
    return hf, ours.eval()


@pytest.mark.parametrize("case", CASES)
def test_config_round_trips_through_transformers(case):
    arch, kw = CASES[case]
    cfg = tiny_config(arch, tie=False, **kw)
    hf_cfg = transformers.AutoConfig.for_model(**cfg.to_hf())
    assert type(hf_cfg).__name__ == cfg.to_hf()["architectures"][0].replace("ForCausalLM", "Config")
    assert ModelConfig.from_hf(hf_cfg.to_dict()) == cfg


@pytest.mark.parametrize("case", CASES)
def test_logits_match_transformers(case):
    arch, kw = CASES[case]
    hf, ours = twin(arch, **kw)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 256, (2, 40), generator=g)
    seqs = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (5, 40, 1, 17)]
    p_ids, pos, cu, mx = pack(seqs)
    with torch.no_grad():
        assert (ours(ids) - hf(ids).logits).abs().max() < 1e-4
        got = ours(p_ids, pos, cu, mx)
        for i, s in enumerate(seqs):
            assert (got[cu[i]:cu[i + 1]] - hf(torch.tensor([s])).logits[0]).abs().max() < 1e-4


@pytest.mark.parametrize("case", ["llama3", "smollm3"])
def test_the_family_switch_changes_the_logits(case):
    """Without its switch (plain RoPE for llama3, RoPE on every layer for smollm3) the model differs:
    the parity above would fail if r1 ignored it."""
    arch, kw = CASES[case]
    _, ours = twin(arch, **kw)
    plain = Transformer(ours.cfg.replace(rope_llama3=None, rope_layers=None)).eval()
    plain.load_state_dict(ours.state_dict())
    ids = torch.randint(0, 256, (1, 40), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert (ours(ids) - plain(ids)).abs().max() > 1e-3


@pytest.mark.parametrize("case", CASES)
def test_greedy_continuation_matches_transformers(case):
    arch, kw = CASES[case]
    hf, ours = twin(arch, **kw)
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (6, 19, 3)]
    outs = Generator(ours, slots=2, max_len=64).generate(prompts, 16, Sampling(temperature=0))
    for p, o in zip(prompts, outs):
        with torch.no_grad():
            x = torch.tensor([p])  # an explicit mask: without one, generate masks every id equal to the pad id
            want = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=16, do_sample=False,
                               eos_token_id=None, pad_token_id=0)[0, len(p):].tolist()
        assert o.token_ids == want


@pytest.mark.parametrize("case", CASES)
def test_training_forward_and_gradients_match_transformers(case):
    arch, kw = CASES[case]
    hf, ours = twin(arch, **kw)
    hf.train(), ours.train()
    g = torch.Generator().manual_seed(4)
    seqs = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (9, 30, 4)]
    ids, pos, cu, mx = pack(seqs)
    sel = torch.cat([torch.arange(int(cu[i]), int(cu[i + 1]) - 1) for i in range(len(seqs))])
    logp, _ = ours(ids, pos, cu, mx, sel=sel, targets=ids[sel + 1])
    (logp * torch.linspace(-1, 1, len(sel))).sum().backward()
    ref = torch.cat([hf(torch.tensor([s])).logits[0, :-1].log_softmax(-1).gather(1, torch.tensor(s[1:])[:, None])[:, 0]
                     for s in seqs])
    (ref * torch.linspace(-1, 1, len(sel))).sum().backward()
    assert (logp - ref).abs().max() < 1e-4
    theirs = dict(hf.named_parameters())
    for name, p in ours.named_parameters():
        assert p.grad is not None and (p.grad - theirs[name].grad).abs().max() < 1e-4, name


def test_register_refuses_a_duplicate_unless_replace():
    llama = families.get("llama")
    twin_family = families.Family(name="llama", architecture="LlamaForCausalLM")
    with pytest.raises(ValueError, match="model family 'llama' is already registered"):
        families.register(twin_family)
    assert families.register(llama) is llama  # the same family again: nothing to replace
    try:
        assert families.register(twin_family, replace=True) is families.get("llama")
    finally:
        families.register(llama, replace=True)
    assert families.get("llama") is llama


def test_refusals_are_one_line_errors():
    base = tiny_config("mistral").to_hf()
    with pytest.raises(ValueError, match="mistral: sliding_window 4096 < max_position_embeddings 8192"):
        ModelConfig.from_hf({**base, "sliding_window": 4096})
    assert ModelConfig.from_hf({**base, "sliding_window": 8192}).arch == "mistral"  # as long as the context: full
    without = {k: v for k, v in base.items() if k != "sliding_window"}  # transformers then uses 4096
    with pytest.raises(ValueError, match="mistral: sliding_window 4096 < max_position_embeddings 8192"):
        ModelConfig.from_hf(without)
    qwen2 = tiny_config("qwen2").to_hf()
    assert ModelConfig.from_hf({**qwen2, "sliding_window": 4096}).arch == "qwen2"  # use_sliding_window is off
    with pytest.raises(ValueError, match="qwen2: sliding_window 4096 < max_position_embeddings 8192"):
        ModelConfig.from_hf({**qwen2, "sliding_window": 4096, "use_sliding_window": True})
    with pytest.raises(ValueError, match="unsupported rope scaling .*yarn"):
        ModelConfig.from_hf({**base, "rope_parameters": {"rope_type": "yarn", "factor": 4.0}})
    with pytest.raises(ValueError, match="rope scaling llama3 needs a number for low_freq_factor"):
        ModelConfig.from_hf({**base, "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "high_freq_factor": 4.0}})
    smol = tiny_config("smollm3").to_hf()
    with pytest.raises(ValueError, match="smollm3: no_rope_layers must hold 2 values of 0 or 1"):
        ModelConfig.from_hf({**smol, "no_rope_layers": [1, 0, 1]})
    with pytest.raises(ValueError, match="unsupported architecture 'gemma9'; supported: llama, qwen2, qwen3"):
        tiny_config("gemma9")


@pytest.mark.parametrize("case", CASES)
def test_export_loads_in_transformers_and_back(case, tmp_path):
    """save_pretrained writes a folder transformers reads with the same logits, and r1 reads it back exactly."""
    arch, kw = CASES[case]
    _, ours = twin(arch, **kw)
    ours.save_pretrained(tmp_path / "hf")
    back = Transformer.from_pretrained(tmp_path / "hf").eval()
    assert back.cfg == ours.cfg
    theirs = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"), attn_implementation="eager",
                                                               pad_token_id=None).float().eval()
    ids = torch.randint(0, 256, (1, 40), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        assert torch.equal(back(ids), ours(ids))
        assert (theirs(ids).logits - ours(ids)).abs().max() < 1e-4
