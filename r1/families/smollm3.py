"""SmolLM3: Llama's blocks, some layers without rotary embeddings (NoPE).

`no_rope_layers[i]` is 1 where layer i applies RoPE and 0 where it does not (by default every
fourth layer skips it: `no_rope_layer_interval`); ModelConfig.rope_layers holds the list. Its
optional sliding window (`use_sliding_window`) is refused (full_attention). No GGUF reader.
"""
from r1.families.base import Family, full_attention


def switches(hf: dict) -> dict:
    full_attention({"use_sliding_window": False, **hf})  # transformers' default: off
    layers, every = hf["num_hidden_layers"], hf.get("no_rope_layer_interval", 4)
    rope = hf.get("no_rope_layers") or [int((i + 1) % every != 0) for i in range(layers)]
    if len(rope) != layers or any(r not in (0, 1) for r in rope):
        raise ValueError(f"smollm3: no_rope_layers must hold {layers} values of 0 or 1, got {rope!r:.80}")
    return {"rope_layers": tuple(int(r) for r in rope), "qkv_bias": bool(hf.get("attention_bias", False))}


FAMILY = Family(
    name="smollm3", architecture="SmolLM3ForCausalLM",
    switches=switches,
    hf_keys=lambda cfg: {"no_rope_layers": list(cfg.rope_layers or [1] * cfg.num_layers),
                         "attention_bias": cfg.qkv_bias, "mlp_bias": False, "use_sliding_window": False},
    tiny=lambda layers: {"rope_layers": tuple(int(i % 2 == 0) for i in range(layers))},  # every other layer NoPE
)
