"""Qwen2 / Qwen2.5: Llama's blocks with q/k/v biases always on (its config has no switch for them).

Its sliding window applies only with `use_sliding_window` set; r1 refuses that where the window is
shorter than the context (full_attention). llama.cpp keeps the HF row order of q/k for this family.
"""
from r1.families.base import GGUF_BLOCK_NAMES, Family, full_attention

FAMILY = Family(
    name="qwen2", architecture="Qwen2ForCausalLM",
    switches=lambda hf: {**full_attention({"use_sliding_window": False, **hf}), "qkv_bias": True},
    tiny=lambda layers: {"qkv_bias": True},
    gguf_names=GGUF_BLOCK_NAMES,
)
