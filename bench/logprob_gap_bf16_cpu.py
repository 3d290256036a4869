"""Where the bf16 sampler-trainer logprob gap comes from, on the CPU with the real SmolLM2-135M.

The generator samples with a bf16 model (KV cache, decode path); a pure-bf16
trainer (what FSDP's MixedPrecisionPolicy computes) rescores the same tokens
with the packed path. Two variants: logits from the bf16 head matmul (what
both sides do today), and logits computed in fp32 from the same bf16 hidden
states, on both sides. Prints mean/max |gap| for each, and each against an
fp32 model, so one can see how much of the gap is logit rounding and how much
is the bf16 residual stream through two different kernels.

    python bench/logprob_gap_bf16_cpu.py
"""
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from r1.generate import Generator, Sampling  # noqa: E402
from r1.model import Transformer, pack  # noqa: E402
from r1.tokenizer import load_tokenizer  # noqa: E402

TEXTS = ["Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
         "How many clips did Natalia sell altogether?", "Write a short poem about the sea.",
         "What is 17 times 23? Explain step by step.", "List three uses of a calculator."]


def gap(a, b):
    d = (a - b).abs()
    return round(d.mean().item(), 4), round(d.max().item(), 4)


def run(m16, m32, prompts, fp32_logits: bool) -> dict:
    if fp32_logits:
        m16.head = lambda h: F.linear(h.float(), m16.head_weight.float())
    else:
        m16.head = lambda h: F.linear(h, m16.head_weight)
    outs = Generator(m16, len(prompts), 256).generate(prompts, 48, Sampling(temperature=1.0, seed=1))
    ids, pos, cu, mx = pack([c.prompt_ids + c.token_ids for c in outs])
    sel, samp = [], []
    for s0, c in zip(cu[:-1].tolist(), outs):
        start = s0 + len(c.prompt_ids)
        sel += range(start - 1, start - 1 + len(c.token_ids))
        samp += c.logprobs
    sel, samp = torch.tensor(sel), torch.tensor(samp)
    tgt = ids[sel + 1]

    def logp(logits):
        return torch.log_softmax(logits.float(), -1).gather(-1, tgt[:, None])[:, 0]

    with torch.no_grad():
        h16, h32 = m16.hidden(ids, pos, cu, mx)[sel], m32.hidden(ids, pos, cu, mx)[sel]
        trainer_bf16 = logp(F.linear(h16, m16.head_weight))
        trainer_fp32_logits = logp(F.linear(h16.float(), m16.head_weight.float()))
        fp32_model = logp(F.linear(h32, m32.head_weight))
    return {"sampler_logits": "fp32" if fp32_logits else "bf16", "tokens": len(samp),
            "vs_trainer_bf16_logits": gap(samp, trainer_bf16), "vs_trainer_fp32_logits": gap(samp, trainer_fp32_logits),
            "vs_fp32_model": gap(samp, fp32_model)}


def main():
    torch.manual_seed(0)
    m32 = Transformer.from_pretrained("smollm2-135m-instruct", dtype=torch.float32)
    m16 = Transformer.from_pretrained("smollm2-135m-instruct", dtype=torch.bfloat16).eval()
    tok = load_tokenizer("smollm2-135m-instruct")
    prompts = [tok.render([{"role": "user", "content": t}], add_generation_prompt=True) for t in TEXTS] * 4
    for fp32_logits in (False, True):
        print(run(m16, m32, prompts, fp32_logits), flush=True)


if __name__ == "__main__":
    main()
