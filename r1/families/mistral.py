"""Mistral / Ministral: Llama's blocks, no biases, an explicit head_dim in the newer configs.

Mistral 7B v0.1 attends through a 4096-token sliding window (transformers' default where the key is
absent); later models set `sliding_window` null, or as long as the context, which is full attention.
A window shorter than the context is refused (full_attention): r1's attention kernels have no window.
llama.cpp converts Mistral checkpoints to its `llama` architecture, so a Mistral GGUF file loads as
the llama family.
"""
from r1.families.base import Family, full_attention

FAMILY = Family(
    name="mistral", architecture="MistralForCausalLM",
    switches=lambda hf: full_attention({"sliding_window": 4096, **hf}),  # transformers' default window
    hf_keys=lambda cfg: {"sliding_window": None},
)
