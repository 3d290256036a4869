"""What a model family is (`Family`), and the pieces the Llama-shaped families share.

Kept apart from r1/families/__init__.py (the registry) so that family files import it without
importing the registry that imports them.
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


def full_attention(hf: dict) -> dict:
    """Refuse a sliding window that binds: windowed attention is not in r1's kernels, and ignoring it would
    change the model's math past the window. A window of at least max_position_embeddings is full attention."""
    window, longest = hf.get("sliding_window"), hf.get("max_position_embeddings", 8192)
    if hf.get("use_sliding_window", True) and window is not None and window < longest:  # no switch: the window is on
        raise ValueError(f"{hf.get('model_type')}: sliding_window {window} < max_position_embeddings {longest}: "
                         f"sliding-window attention is not implemented for this family (set sliding_window null)")
    return {}
