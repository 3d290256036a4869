"""Tests for r1/weights.py: HF folders, GGUF (real SmolLM2 file and tiny written ones), export.

References are always transformers itself (what it loads from the same files) or, for tiny
GGUFs, the HF weights they were written from through llama.cpp's own Q/K permutation.
"""

import json

import gguf
import numpy as np
import pytest
import torch
import transformers

from r1.weights import check_state_dict, load_checkpoint, resolve, save_hf

CONFIGS = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config, "qwen3": transformers.Qwen3Config}


def tiny_model(model_type, tied, seed=0):
    """A random transformers model of `model_type`, norms and biases randomised too."""
    extra = {"head_dim": 16} if model_type == "qwen3" else {}  # qwen3: head_dim != hidden/heads
    config = CONFIGS[model_type](
        vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5, rope_theta=5000.0,
        tie_word_embeddings=tied, bos_token_id=1, eos_token_id=2, **extra)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_()
    return model


def hf_state_dict(model):
    """The transformers state dict in our convention: no lm_head when tied."""
    sd = model.state_dict()
    if model.config.tie_word_embeddings:
        sd.pop("lm_head.weight")
    return sd


def assert_same(ours, ref):
    assert sorted(ours) == sorted(ref)
    for name in ref:
        assert ours[name].dtype == ref[name].dtype, name
        assert torch.equal(ours[name], ref[name]), name


# --- GGUF: the real SmolLM2 file -----------------------------------------------------------------

@pytest.fixture(scope="module")
def smollm2():
    return load_checkpoint("smollm2-135m-instruct")


def test_smollm2_gguf_config(smollm2):
    config, sd = smollm2
    assert resolve("smollm2-135m-instruct").name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert config["model_type"] == "llama" and config["architectures"] == ["LlamaForCausalLM"]
    assert (config["vocab_size"], config["num_hidden_layers"], config["hidden_size"]) == (49152, 30, 576)
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]) == (9, 3, 64)
    assert config["intermediate_size"] == 1536 and config["rope_theta"] == 100000.0
    assert config["tie_word_embeddings"] is True and "lm_head.weight" not in sd
    assert (config["bos_token_id"], config["eos_token_id"]) == (1, 2)
    assert sd["model.embed_tokens.weight"].shape == (49152, 576)
    assert sd["model.layers.0.self_attn.k_proj.weight"].shape == (192, 576)
    assert all(t.dtype == torch.float32 for t in sd.values())


def test_smollm2_gguf_equals_transformers(smollm2):
    """Every tensor equals transformers' own GGUF load of the same file (max abs diff 0).

    `from_pretrained(dir, gguf_file=...)` needs `accelerate`; without it we call the function it
    delegates to for llama in transformers 5.x, `load_gguf_checkpoint`, with a model skeleton
    built from the config transformers parsed from the GGUF. About 12 s on 2 CPU cores.
    """
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    path = resolve("smollm2-135m-instruct")
    try:
        import accelerate  # noqa: F401
        model = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name)
        ref = hf_state_dict(model)
        hf_config = model.config
    except ImportError:
        hf_config = transformers.AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
        with torch.device("meta"):  # only its parameter names are used
            skeleton = transformers.AutoModelForCausalLM.from_config(hf_config)
        ref = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=skeleton)["tensors"]
    config, ours = smollm2
    assert_same(ours, ref)
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "rms_norm_eps", "vocab_size", "max_position_embeddings",
                "tie_word_embeddings"):
        assert config[key] == getattr(hf_config, key), key
    assert config["rope_theta"] == hf_config.rope_parameters["rope_theta"]


# --- GGUF: tiny files written the way llama.cpp's converter writes them -------------------------

GGUF_NAMES = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
              "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
              "self_attn.k_norm": "attn_k_norm", "input_layernorm": "attn_norm",
              "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
              "mlp.down_proj": "ffn_down"}


def llama_cpp_permute(w, n_head, n_head_kv):
    """Copied from llama.cpp convert_hf_to_gguf.py, LlamaModel.permute."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(path, model, arch=None, extra=None):
    c = model.config
    arch = arch or c.model_type
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(c.num_hidden_layers)
    writer.add_context_length(c.max_position_embeddings)
    writer.add_embedding_length(c.hidden_size)
    writer.add_feed_forward_length(c.intermediate_size)
    writer.add_head_count(c.num_attention_heads)
    writer.add_head_count_kv(c.num_key_value_heads)
    writer.add_rope_freq_base(c.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(c.rms_norm_eps)
    writer.add_vocab_size(c.vocab_size)
    if c.model_type == "qwen3":
        writer.add_key_length(c.head_dim)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    for name, t in hf_state_dict(model).items():
        w = t.numpy()
        if name == "model.embed_tokens.weight":
            gname = "token_embd.weight"
        elif name == "model.norm.weight":
            gname = "output_norm.weight"
        elif name == "lm_head.weight":
            gname = "output.weight"
        else:
            _, _, layer, *module, leaf = name.split(".")
            gname = f"blk.{layer}.{GGUF_NAMES['.'.join(module)]}.{leaf}"
            if arch == "llama" and gname.split(".")[2] == "attn_q":
                w = llama_cpp_permute(w, c.num_attention_heads, c.num_attention_heads)
            if arch == "llama" and gname.split(".")[2] == "attn_k":
                w = llama_cpp_permute(w, c.num_attention_heads, c.num_key_value_heads)
        writer.add_tensor(gname, np.ascontiguousarray(w))
    for gname, w in (extra or {}).items():
        writer.add_tensor(gname, w)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize("model_type,tied", [("llama", True), ("llama", False), ("qwen2", False), ("qwen3", True)])
def test_tiny_gguf_roundtrip(tmp_path, model_type, tied):
    model = tiny_model(model_type, tied)
    write_gguf(tmp_path / "m.gguf", model)
    config, sd = load_checkpoint(tmp_path / "m.gguf")
    assert_same(sd, hf_state_dict(model))  # llama: our un-permute inverts llama.cpp's permute
    c = model.config
    assert config["model_type"] == model_type and config["tie_word_embeddings"] is tied
    assert config["head_dim"] == (getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads)
    assert config["num_key_value_heads"] == 2
    assert config.get("attention_bias") is (None if model_type == "qwen2" else False)


# --- HF folders ----------------------------------------------------------------------------------

@pytest.mark.parametrize("model_type,tied,shard", [
    ("llama", True, None), ("llama", False, "20KB"), ("qwen2", False, None), ("qwen2", True, "20KB"),
    ("qwen3", False, None), ("qwen3", True, "20KB")])
def test_hf_dir_equals_transformers(tmp_path, model_type, tied, shard):
    tiny_model(model_type, tied).save_pretrained(tmp_path, **({"max_shard_size": shard} if shard else {}))
    assert (tmp_path / "model.safetensors.index.json").exists() == (shard is not None)
    ref = hf_state_dict(transformers.AutoModelForCausalLM.from_pretrained(tmp_path))
    config, sd = load_checkpoint(tmp_path)
    assert_same(sd, ref)
    assert config["rope_theta"] == 5000.0 and config["tie_word_embeddings"] is tied
    _, half = load_checkpoint(tmp_path, dtype=torch.bfloat16)
    assert_same(half, {k: v.to(torch.bfloat16) for k, v in ref.items()})


# --- errors ----------------------------------------------------------------------------------------

def test_missing_path(tmp_path):
    missing = tmp_path / "nope" / "model.gguf"
    with pytest.raises(FileNotFoundError, match="checkpoint not found: .*nope/model.gguf"):
        load_checkpoint(missing)
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_checkpoint(tmp_path)


def test_unsupported_architecture(tmp_path):
    model = tiny_model("llama", True)
    write_gguf(tmp_path / "m.gguf", model, arch="gpt2")
    with pytest.raises(ValueError, match=r"unsupported architecture 'gpt2' in .*m.gguf; supported: llama, qwen2, qwen3"):
        load_checkpoint(tmp_path / "m.gguf")
    model.save_pretrained(tmp_path / "hf")
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    (tmp_path / "hf" / "config.json").write_text(json.dumps({**cfg, "model_type": "mamba"}))
    with pytest.raises(ValueError, match=r"unsupported architecture 'mamba' in .*config.json"):
        load_checkpoint(tmp_path / "hf")
    write_gguf(tmp_path / "s.gguf", model, arch="smollm3")  # a family whose NoPE layers GGUF metadata would hide
    with pytest.raises(ValueError, match=r"s.gguf: no GGUF reader for architecture 'smollm3' \(readable: llama"):
        load_checkpoint(tmp_path / "s.gguf")


def test_llama3_rope_freqs_in_gguf_is_refused_by_name(tmp_path):
    """llama.cpp stores Llama 3's rope scaling as a rope_freqs tensor: dropping it would change the model's
    math past the original context, so the reader refuses it and points to the HF folder."""
    model = tiny_model("llama", True)
    write_gguf(tmp_path / "m.gguf", model, extra={"rope_freqs.weight": np.ones(8, dtype=np.float32)})
    with pytest.raises(ValueError, match=r"m.gguf holds rope_freqs.weight \(Llama 3's rope scaling\).*HF folder"):
        load_checkpoint(tmp_path / "m.gguf")


def test_check_state_dict():
    sd = {"a.weight": torch.zeros(2, 3), "b.weight": torch.zeros(4), "extra.bias": torch.zeros(1)}
    with pytest.raises(ValueError, match=r"missing \[c.weight\]; unexpected \[extra.bias\]"):
        check_state_dict(["a.weight", "b.weight", "c.weight"], sd)
    with pytest.raises(ValueError, match=r"wrong shape \[b.weight \(4,\) != \(5,\)\]"):
        check_state_dict({"a.weight": (2, 3), "b.weight": (5,), "extra.bias": (1,)}, sd)
    check_state_dict({"a.weight": (2, 3), "b.weight": (4,), "extra.bias": (1,)}, sd)
    check_state_dict(list(sd), sd)


# --- export ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("model_type,tied,dtype", [("llama", True, torch.float32), ("qwen3", False, torch.bfloat16)])
def test_save_hf_loads_in_transformers(tmp_path, model_type, tied, dtype):
    tiny_model(model_type, tied).save_pretrained(tmp_path / "src")
    config, sd = load_checkpoint(tmp_path / "src", dtype=dtype)
    out = save_hf(sd, config, tmp_path / "export")
    loaded = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=dtype)
    assert_same(sd, hf_state_dict(loaded))
    assert loaded.config.tie_word_embeddings is tied
    written = json.loads((out / "config.json").read_text())
    assert written["torch_dtype"] == str(dtype).removeprefix("torch.")
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == 2
    # A second export replaces the first and leaves no temporary folders behind.
    save_hf(sd, config, out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export", "src"]


def test_save_hf_from_gguf_config(tmp_path):
    """A GGUF-derived config is complete enough for transformers to rebuild the same model."""
    model = tiny_model("llama", True)
    write_gguf(tmp_path / "m.gguf", model)
    config, sd = load_checkpoint(tmp_path / "m.gguf")
    loaded = transformers.AutoModelForCausalLM.from_pretrained(save_hf(sd, config, tmp_path / "export"))
    assert_same(sd, hf_state_dict(loaded))
    ids = torch.tensor([[3, 17, 42, 5]])
    torch.testing.assert_close(loaded(ids).logits, model(ids).logits, rtol=0, atol=0)


def test_save_hf_crash_leaves_nothing(tmp_path):
    class BrokenTokenizer:
        def save_pretrained(self, path):
            raise RuntimeError("disk full")

    config, sd = load_checkpoint(_saved(tmp_path / "src"))
    with pytest.raises(RuntimeError, match="disk full"):
        save_hf(sd, config, tmp_path / "export", tokenizer=BrokenTokenizer())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def _saved(path):
    tiny_model("llama", False).save_pretrained(path)
    return path
