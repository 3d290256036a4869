"""Logit parity of our Transformer vs transformers: tiny random configs of each family and the real SmolLM2.

Prints one JSON line per case (max abs logit diff, float32, CPU), and for
SmolLM2-135M-Instruct (GGUF) the greedy next-token agreement over 32 steps.
    python bench/parity.py
"""
import datetime
import json
import os
import sys
import time

import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from r1.model import Transformer, pack, tiny_config  # noqa: E402
from r1.weights import resolve  # noqa: E402


def tiny_cases():
    for arch in ("llama", "qwen2", "qwen3"):
        for tie in (True, False):
            torch.manual_seed(0)
            cfg = tiny_config(arch, tie=tie)
            hf = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**cfg.to_hf())).eval()
            ours = Transformer(cfg)
            ours.load_state_dict(hf.state_dict(), strict=False)
            ids = torch.randint(0, 256, (3, 17))
            seqs = [ids[0, :5].tolist(), ids[1].tolist(), ids[2, :9].tolist()]
            with torch.no_grad():
                d_batched = (ours(ids) - hf(ids).logits).abs().max().item()
                pi, pp, cu, mx = pack(seqs)
                got = ours(pi, pp, cu, mx)
                d_packed = max((got[cu[i]:cu[i + 1]] - hf(torch.tensor([s])).logits[0]).abs().max().item()
                               for i, s in enumerate(seqs))
            yield {"case": f"{arch}-{'tied' if tie else 'untied'}", "batched_max_abs": d_batched, "packed_max_abs": d_packed}


def smollm2():
    from r1.tokenizer import load_tokenizer

    path = resolve("smollm2-135m-instruct")
    t0 = time.time()
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, torch_dtype=torch.float32).eval()
    ours = Transformer.from_pretrained("smollm2-135m-instruct").eval()
    tok = load_tokenizer("smollm2-135m-instruct")
    ids = tok.render([{"role": "user", "content": "What is 17 times 23? Think step by step."}])
    x = torch.tensor([ids])
    with torch.no_grad():
        diff = (ours(x) - hf(x).logits).abs().max().item()
        seq, agree = list(ids), 0
        for _ in range(32):
            a = int(ours(torch.tensor([seq]))[0, -1].argmax())
            b = int(hf(torch.tensor([seq])).logits[0, -1].argmax())
            agree += a == b
            seq.append(b)
    return {"case": "smollm2-135m-instruct-gguf", "prompt_tokens": len(ids), "max_abs": diff,
            "greedy_agree_of_32": agree, "seconds": round(time.time() - t0, 1)}


if __name__ == "__main__":
    meta = {"date": datetime.date.today().isoformat(), "torch": torch.__version__, "transformers": transformers.__version__}
    for r in tiny_cases():
        print(json.dumps({**r, **meta}))
    print(json.dumps({**smollm2(), **meta}))
