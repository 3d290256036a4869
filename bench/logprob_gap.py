"""Sampler vs trainer logprob gap on the GPU, in the trainer's own precision set-up.

The generator samples with a bf16 copy of the policy (CUDA graphs, KV cache,
decode attention); the trainer scores the same tokens with float32
parameters under bf16 autocast, packed varlen attention and the fused
logprob kernel (one GPU), or bf16 parameters (`--trainer-dtype bfloat16`).
Prints the mean and max |sampler - trainer| over sampled tokens; the
trainer logs the same two numbers every iteration (logprob_gap_mean/max).

    python bench/logprob_gap.py [--model 135m|3b] [--batch 64] [--new 128] [--save] [--kernels KEY=VALUE ...]
"""
import argparse
import datetime
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench import kernels_flag  # noqa: E402
from bench.rollout import SHAPES  # noqa: E402
from r1.generate import Generator, Sampling  # noqa: E402
from r1.model import Transformer, pack  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="135m")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--new", type=int, default=128)
    p.add_argument("--trainer-dtype", default="float32")
    p.add_argument("--save", action="store_true")
    kernels_flag.add(p)
    a = p.parse_args()
    k = kernels_flag.use(a.kernels)
    cfg = SHAPES[a.model]
    torch.manual_seed(0)
    with torch.device("cuda"):
        trainer_model = Transformer(cfg).to(getattr(torch, a.trainer_dtype)).eval()
    for n, w in trainer_model.named_parameters():  # small init: a realistic, non-degenerate distribution
        if w.dim() == 2:
            torch.nn.init.normal_(w, std=0.02)
    rollout = Transformer(cfg).to("cuda", torch.bfloat16).eval().requires_grad_(False)  # as the trainer's copy
    rollout.load_state_dict(trainer_model.state_dict())
    prompts = torch.randint(100, cfg.vocab_size - 100, (a.batch, a.prompt)).tolist()
    gen = Generator(rollout, a.batch, a.prompt + a.new + 8, cuda_graphs=True, **kernels_flag.generator(k))
    outs = gen.generate(prompts, a.new, Sampling(temperature=1.0, seed=0))
    seqs = [c.prompt_ids + c.token_ids for c in outs]
    ids, pos, cu, mx = pack(seqs, device="cuda")
    sel, tgt, samp = [], [], []
    for s0, c in zip(cu[:-1].tolist(), outs):
        start = s0 + len(c.prompt_ids)
        sel += range(start - 1, start - 1 + len(c.token_ids))
        samp += c.logprobs
    sel = torch.tensor(sel, device="cuda")
    tgt = ids[sel + 1]
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        logp, _ = trainer_model(ids, pos, cu, mx, sel=sel, targets=tgt, temperature=1.0)
    gap = (logp.float() - torch.tensor(samp, device="cuda")).abs()
    res = {"name": "logprob_gap", "model": f"{a.model}-shape", "tokens": gap.numel(), "sampler": "bf16 params, KV cache",
           "trainer": f"{a.trainer_dtype} params, bf16 autocast, packed", "gap_mean": gap.mean().item(),
           "gap_max": gap.max().item(), "gap_p99": gap.quantile(0.99).item(),
           "device": torch.cuda.get_device_name(), "torch": torch.__version__, "date": datetime.date.today().isoformat(),
           "kernels": kernels_flag.words(k)}
    print(json.dumps(res), flush=True)
    if a.save:
        os.makedirs("bench/results", exist_ok=True)
        with open("bench/results/logprob_gap.json", "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
