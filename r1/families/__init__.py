"""Model families: what sets one architecture apart from the shared Transformer of r1/model.py.

A family is one small file here holding a `Family`: its Hugging Face model_type and class name,
the ModelConfig switches its HF config turns on (and the keys an export writes back), and how
llama.cpp names its tensors. The blocks themselves are r1/model.py's, so every family runs the
same ops in the generator and the trainer. Adding one is a file and a `register` line below
(docs/models.md walks through it); an unknown model_type is a one-line error naming the known ones.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

# llama.cpp's per-block tensor names (after `blk.N.`) -> HF names, shared by the Llama-shaped families.
GGUF_BLOCK_NAMES = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}


@dataclass(frozen=True)
class Family:
    name: str
    """HF config's model_type (and GGUF's general.architecture)."""
    architecture: str
    """HF config's architectures[0], written on export."""
    switches: Callable[[dict], dict] = lambda hf: {}
    """HF config -> the ModelConfig fields this family sets beyond the shared ones (r1/model.py from_hf)."""
    hf_keys: Callable[[object], dict] = lambda cfg: {}
    """ModelConfig -> this family's own HF config keys, for export."""
    tiny: Callable[[int], dict] = lambda layers: {}
    """Layer count -> the switches of a tiny random model of this family (tests, the smoke config)."""
    gguf_names: dict | None = None
    """GGUF block tensor names -> HF names; None: this family's GGUF files are refused (no reader)."""
    gguf_permute_qk: bool = False
    """llama.cpp's converter interleaved the q/k rows of each head (its Llama permutation): undo it."""


FAMILIES: dict[str, Family] = {}


def register(family: Family, replace: bool = False) -> Family:
    """Add a family under its name; a second family of the same name is an error unless replace=True."""
    if family.name in FAMILIES and not replace:
        raise ValueError(f"model family {family.name!r} is already registered (register(..., replace=True) "
                         f"replaces it)")
    FAMILIES[family.name] = family
    return family


def get(name, where: str = "") -> Family:
    """The family of a model_type; ValueError naming `where` and the supported ones otherwise."""
    if name not in FAMILIES:
        at = f" in {where}" if where else ""
        raise ValueError(f"unsupported architecture {name!r}{at}; supported: {', '.join(FAMILIES)}")
    return FAMILIES[name]


def names() -> list[str]:
    return list(FAMILIES)


def full_attention(hf: dict) -> dict:
    """Refuse a sliding window that binds: windowed attention is not in r1's kernels, and ignoring it would
    change the model's math past the window. A window of at least max_position_embeddings is full attention."""
    window, longest = hf.get("sliding_window"), hf.get("max_position_embeddings", 8192)
    if hf.get("use_sliding_window", True) and window is not None and window < longest:
        raise ValueError(f"{hf.get('model_type')}: sliding_window {window} < max_position_embeddings {longest}: "
                         f"sliding-window attention is not implemented for this family (set sliding_window null)")
    return {}


from r1.families import llama, mistral, qwen2, qwen3, smollm3  # noqa: E402  (each file defines FAMILY)

register(llama.FAMILY)
register(qwen2.FAMILY)
register(qwen3.FAMILY)
register(mistral.FAMILY)
register(smollm3.FAMILY)
