"""Write a random-weight HF folder of a named model shape, for runs of the real trainer at that size.

    python bench/random_model.py --shape 3b --tokenizer .stage/smol_tok --out /tmp/r1-3b

Speed and memory do not depend on weight values, so a Qwen2.5-3B-shaped model
with random weights (and SmolLM2's 49,152-token vocabulary, so the synthetic
task's tokenizer fits it) measures what the real one would. The weights are
written in bfloat16 (half the disk); train.py loads them into float32
master weights as it would the real checkpoint.
"""
import argparse
import dataclasses
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.rollout import SHAPES  # noqa: E402
from r1.model import Transformer  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=sorted(SHAPES), default="3b")
    p.add_argument("--tokenizer", required=True, help="an HF tokenizer folder (its vocabulary sizes the model)")
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(a.tokenizer)
    cfg = dataclasses.replace(SHAPES[a.shape], vocab_size=len(tok), eos_token_id=tok.eos_token_id)
    torch.manual_seed(a.seed)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = Transformer(cfg).to(torch.bfloat16)
    for name, w in model.named_parameters():  # HF-style init: small logits
        with torch.no_grad():
            w.normal_(0, 0.02) if w.dim() == 2 else (w.zero_() if name.endswith("bias") else w.fill_(1.0))
    model.save_pretrained(a.out, tokenizer=tok)
    n = sum(w.numel() for w in model.parameters())
    print(f"wrote {a.out}: {a.shape} shape, vocab {cfg.vocab_size}, {n / 1e9:.2f} B parameters")


if __name__ == "__main__":
    main()
