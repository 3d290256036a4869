"""Model families: what sets one architecture apart from the shared Transformer of r1/model.py.

A family is one small file here holding a `Family`: its Hugging Face model_type and class name,
the ModelConfig switches its HF config turns on (and the keys an export writes back), and how
llama.cpp names its tensors. The blocks themselves are r1/model.py's, so every family runs the
same ops in the generator and the trainer. Adding one is a file and a `register` line below
(docs/models.md walks through it); an unknown model_type is a one-line error naming the known ones.
"""
from __future__ import annotations

from r1.registry import Registry
from r1.families.base import GGUF_BLOCK_NAMES, Family, full_attention  # noqa: F401  (the API, from one place)

FAMILIES = Registry("model family", kind=Family)


def register(family: Family, replace: bool = False) -> Family:
    """Add a family under its name; another family of that name is an error unless replace=True."""
    return FAMILIES.register(family.name, family, replace=replace)


def get(name, where: str = "") -> Family:
    """The family of a model_type; ValueError naming `where` and the supported ones otherwise."""
    if name not in FAMILIES:
        at = f" in {where}" if where else ""
        raise ValueError(f"unsupported architecture {name!r}{at}; supported: {', '.join(FAMILIES)}")
    return FAMILIES[name]


from r1.families import llama, mistral, qwen2, qwen3, smollm3  # noqa: E402  (each defines FAMILY)

register(llama.FAMILY)
register(qwen2.FAMILY)
register(qwen3.FAMILY)
register(mistral.FAMILY)
register(smollm3.FAMILY)
