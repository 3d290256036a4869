"""Qwen3 (dense): Llama's blocks with an RMSNorm on each head's queries and keys before RoPE.

q/k/v biases follow `attention_bias` (off in every released Qwen3). Its thinking switch is a chat
template variable (r1/tokenizer.py), not a model change. llama.cpp keeps the HF row order of q/k.
"""
from r1.families.base import GGUF_BLOCK_NAMES, Family

FAMILY = Family(
    name="qwen3", architecture="Qwen3ForCausalLM",
    switches=lambda hf: {"qk_norm": True, "qkv_bias": bool(hf.get("attention_bias", False))},
    hf_keys=lambda cfg: {"attention_bias": cfg.qkv_bias},
    tiny=lambda layers: {"qk_norm": True},
    gguf_names=GGUF_BLOCK_NAMES,
)
