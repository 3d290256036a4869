"""Llama: SmolLM2, Llama 3.1-3.3; the family the other Llama-shaped ones start from.

Optional q/k/v biases (`attention_bias`). Llama 3.x's rope scaling (rope_type llama3) is read by
the shared config reader in r1/model.py, as every family's RoPE is. llama.cpp's converter
interleaves the q/k rows of each head, which the GGUF reader undoes (gguf_permute_qk); a Llama 3.x
GGUF file carries its rope scaling as a `rope_freqs` tensor, which the reader refuses by name.
"""
from r1.families.base import GGUF_BLOCK_NAMES, Family

FAMILY = Family(
    name="llama", architecture="LlamaForCausalLM",
    switches=lambda hf: {"qkv_bias": bool(hf.get("attention_bias", False))},
    hf_keys=lambda cfg: {"attention_bias": cfg.qkv_bias, "mlp_bias": False},
    gguf_names=GGUF_BLOCK_NAMES, gguf_permute_qk=True,
)
