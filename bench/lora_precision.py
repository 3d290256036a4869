"""Issue 30's open question: does a LoRA generator that runs merged bf16 weights sample the policy that trains?

    python bench/lora_precision.py [--model smollm2-135m-instruct] [--seqs 16] [--out PATH]

A LoRA run on CUDA keeps the frozen base in bf16; the trainer computes
x W^T + scale * (x A^T) B^T (r1/lora.py, bf16 autocast), so a small adapter
update keeps its own precision. The generator runs merged weights,
bf16(W + scale * B @ A) (r1/actor.py refresh): where scale * B @ A is below
half a bf16 step of W, the merge rounds it away and the sampler keeps
sampling the base. This measures how much of the policy's change each path
keeps, on SmolLM2-135M-Instruct's real weights, GSM8K solutions as text,
all on the CPU (bf16 matmuls there are what they are on a GPU up to the
summation order):

  exact     float32, weights bf16(W) + scale * B @ A: the policy itself
  trainer   bf16 base + float32 adapters, bf16 autocast: what the update scores
  merged    bf16 weights bf16(W) + scale * B @ A rounded once: today's generator
  adapters  bf16 base + bf16 adapters, unmerged, no autocast: a generator that keeps them apart
  merged_weights  the merged bf16 weights in float32 arithmetic: the merge's rounding alone, without
            bf16's rounding of every activation (which moves any bf16 path by a few hundredths)
  base      bf16 base, adapters dropped: what a generator that lost every update samples

Adapters: rank 16, alpha 16 (scale 1) on every projection, A drawn as PEFT
draws it, B ~ N(0, sigma^2) for each --sigmas value, standing in for what
training has made of B (Adam moves each entry by about lr a step: lr 1e-4 for
100 steps in one direction gives 1e-2; a random walk much less). For each
path: the mean |logp - exact| over every token of the sequences (bf16's own
rounding sets a floor there that every bf16 path shares), beside the size of
the update (mean |exact - exact base|); `tracks`: the slope of the path's
change from the bf16 base against the policy's change, token by token (1: it
moves with the policy, 0: it stays the base); `gap_to_trainer`: mean
|logp - trainer's|, the sampler-trainer gap a run logs, kernels aside. One
JSON object per sigma, printed; --out writes them as a list.
"""
import argparse
import datetime
import json
import math
import os
import platform
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from r1 import lora  # noqa: E402
from r1.model import Transformer, pack  # noqa: E402
from r1.tasks.gsm8k import load_split  # noqa: E402
from r1.tokenizer import load_tokenizer  # noqa: E402


def token_logprobs(model, seqs, autocast=False):
    """log p of every next token of each sequence (float32, [N - S])."""
    ids, pos, cu, mx = pack(seqs)
    sel = torch.cat([torch.arange(int(a), int(b) - 1) for a, b in zip(cu[:-1], cu[1:])])
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        logits = model(ids, pos, cu, mx)[sel].float()
    return torch.log_softmax(logits, -1).gather(-1, ids[sel + 1, None])[:, 0]


def adapted(base_bf16, rank, alpha, sigma, seed, dtype):
    """A copy of the bf16 base with adapters on every projection: A as PEFT draws it, B ~ N(0, sigma^2)."""
    m = Transformer(base_bf16.cfg).to(torch.bfloat16)
    m.load_state_dict(base_bf16.state_dict())
    torch.manual_seed(seed)
    lora.add_adapters(m, rank, alpha, lora.TARGETS)
    g = torch.Generator().manual_seed(seed + 1)
    for mod in m.modules():
        if isinstance(mod, lora.LoRALinear):
            mod.lora_B.data = torch.randn(mod.lora_B.shape, generator=g) * sigma
            mod.lora_A.data, mod.lora_B.data = mod.lora_A.data.to(dtype), mod.lora_B.data.to(dtype)
    return m.eval()


def plain(cfg, state, dtype):
    m = Transformer(cfg)
    m.load_state_dict(state)
    return m.to(dtype).eval()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--seqs", type=int, default=16)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--alpha", type=float, default=16.0)
    p.add_argument("--sigmas", default="1e-5,1e-4,1e-3,1e-2")
    p.add_argument("--out", default=None)
    a = p.parse_args()
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    tok = load_tokenizer(a.model)
    rows = load_split(os.path.join(ROOT, "data", "gsm8k"), "train")[: a.seqs]
    seqs = [tok.hf.encode(r["question"] + "\n" + r["solution"]) for r in rows]
    base = Transformer.from_pretrained(a.model, dtype=torch.float32).to(torch.bfloat16).eval()  # bf16(W)
    scale = a.alpha / a.rank
    base_exact = token_logprobs(plain(base.cfg, base.state_dict(), torch.float32), seqs)
    base_bf16 = token_logprobs(base, seqs)
    out = []
    for sigma in [float(s) for s in a.sigmas.split(",")]:
        trainer = adapted(base, a.rank, a.alpha, sigma, 0, torch.float32)  # adapters float32, as LoRA trains them
        full = trainer.state_dict()
        merged32 = {k: v.float() for k, v in lora.merge({k: v.float() for k, v in full.items()}, scale).items()}
        exact = token_logprobs(plain(base.cfg, merged32, torch.float32), seqs)
        merged = token_logprobs(plain(base.cfg, lora.merge(full, scale), torch.bfloat16), seqs)
        merged_w = token_logprobs(plain(base.cfg, {k: v.float() for k, v in lora.merge(full, scale).items()},
                                        torch.float32), seqs)  # the merged bf16 weights, float32 arithmetic
        got = {"trainer": token_logprobs(trainer, seqs, autocast=True), "merged": merged,
               "adapters": token_logprobs(adapted(base, a.rank, a.alpha, sigma, 0, torch.bfloat16), seqs),
               "base": base_bf16}
        err = {k: (v - exact).abs().mean().item() for k, v in got.items()}
        d = exact - base_exact  # the policy's change, token by token
        tracks = {k: ((v - base_bf16) * d).sum().item() / (d * d).sum().item() for k, v in got.items() if k != "base"}
        tracks["merged_weights"] = ((merged_w - base_exact) * d).sum().item() / (d * d).sum().item()
        err["merged_weights"] = (merged_w - exact).abs().mean().item()
        gap = {k: (got[k] - got["trainer"]).abs().mean().item() for k in ("merged", "adapters", "base")}
        mstate, bstate = lora.merge(full, scale), base.state_dict()
        adapted_keys = [k[:-len(".lora_A")] + ".weight" for k in full if k.endswith(".lora_A")]
        changed = sum((mstate[k] != bstate[k]).sum().item() for k in adapted_keys)
        changed /= sum(bstate[k].numel() for k in adapted_keys)
        r = {"name": "lora_precision", "model": a.model, "tokens": int(exact.numel()), "rank": a.rank,
             "alpha": a.alpha, "sigma_B": sigma,
             "delta_rms": math.sqrt(sum(((scale * m.lora_B.float() @ m.lora_A.float()) ** 2).sum().item()
                                        for m in trainer.modules() if isinstance(m, lora.LoRALinear))
                                    / sum(m.weight.numel() for m in trainer.modules()
                                          if isinstance(m, lora.LoRALinear))),
             "update_mean_abs": (exact - base_exact).abs().mean().item(),
             "adapted_weights_changed_by_merge": changed,
             **{f"err_{k}": v for k, v in err.items()},
             **{f"tracks_{k}": v for k, v in tracks.items()},
             **{f"gap_to_trainer_{k}": v for k, v in gap.items()},
             "device": "cpu", "cpu": platform.processor() or platform.machine(), "torch": torch.__version__,
             "date": datetime.date.today().isoformat()}
        print(json.dumps({k: (round(v, 6) if isinstance(v, float) else v) for k, v in r.items()}), flush=True)
        out.append(r)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
