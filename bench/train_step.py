"""PPO update step throughput and memory: ours (packed, fused logprob) vs Hugging Face, same run.

Qwen2.5-3B-shaped random-weight model, bf16 parameters for both (pure bf16
AdamW, fused), one GPU. The batch is RL-like: 64 sequences with
heavy-tailed lengths (log-normal, clipped to 200..2000 tokens, seeded).
One step = policy loss (PPO clipped surrogate on per-token logprobs and an
entropy bonus) forward and backward over all tokens, then AdamW.

- ours: sequences packed into micro-batches of <= --micro-tokens tokens, no
  padding, varlen flash attention, fused chunked logprob/entropy
  (kernels/logprob.py), gradient accumulation.
- peer: transformers' model (SDPA), micro-batches of --peer-micro sequences
  padded to the longest in the micro-batch (as it must), logits ->
  float32 log_softmax -> gather and entropy.

--autocast: fp32 parameters under bf16 autocast instead, as the trainer runs on one GPU (fp32 AdamW
master weights), for ours only. --fuse-train: ours again with q/k/v and gate/up as one matmul each
(kernels.fuse_train's path, r1/model.py concat_linear), in the same run: ours_fused_s and fuse_train_speedup.

MFU counts useful tokens only: 6 N per token plus causal attention
(6 * s^2 * heads * head_dim per layer per sequence), against the measured
bf16 matmul rate. Prints JSON; --save writes bench/results/train_step.json.
"""
import argparse
import datetime
import json
import math
import os
import random
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench import kernels_flag  # noqa: E402
from bench.rollout import SHAPES, measure_ceilings  # noqa: E402
from r1.algos.losses import ppo_policy_loss  # noqa: E402
from r1.model import OPS, Transformer  # noqa: E402
from r1.packing import split_by_tokens  # noqa: E402


def lengths(n=64, lo=200, hi=2000, seed=0):
    rng = random.Random(seed)
    return [int(min(hi, max(lo, rng.lognormvariate(math.log(500), 0.7)))) for _ in range(n)]


def flops(cfg, nparams, lens):
    attn = sum(6 * s * s * cfg.num_heads * cfg.head_dim * cfg.num_layers for s in lens)
    return 6 * nparams * sum(lens) + attn


def step_ours(model, opt, seqs, micro_tokens, dev, autocast=False):
    groups = split_by_tokens(seqs, micro_tokens, size=len)  # the trainer's packing rule
    total = sum(len(s) - 1 for s in seqs)
    for g in groups:
        ids = torch.tensor([t for s in g for t in s], device=dev)
        pos = torch.tensor([p for s in g for p in range(len(s))], device=dev)
        cu = torch.tensor([0] + list(torch.tensor([len(s) for s in g]).cumsum(0).tolist()), dtype=torch.int32, device=dev)
        sel = torch.tensor([b + j for b, s in zip(cu[:-1].tolist(), g) for j in range(len(s) - 1)], device=dev)
        tgt = ids[sel + 1]
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            logp, ent = model(ids, pos, cu, max(len(s) for s in g), sel=sel, targets=tgt)
        adv = torch.randn_like(logp)
        mask = torch.ones_like(logp)
        loss, _ = ppo_policy_loss(logp, logp.detach(), adv, mask, norm=total)
        loss = loss - 0.001 * (ent * mask).sum() / total
        loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def step_peer(model, opt, seqs, micro, dev):
    total = sum(len(s) - 1 for s in seqs)
    for i in range(0, len(seqs), micro):
        g = seqs[i:i + micro]
        L = max(len(s) for s in g)
        ids = torch.zeros(len(g), L, dtype=torch.long, device=dev)
        att = torch.zeros(len(g), L, dtype=torch.long, device=dev)
        for j, s in enumerate(g):
            ids[j, :len(s)] = torch.tensor(s, device=dev)
            att[j, :len(s)] = 1
        logits = model(input_ids=ids, attention_mask=att).logits[:, :-1].float()
        logp_all = torch.log_softmax(logits, -1)
        logp = logp_all.gather(-1, ids[:, 1:, None])[..., 0]
        ent = -(logp_all.exp() * logp_all).sum(-1)
        mask = att[:, 1:].float()
        adv = torch.randn_like(logp)
        ratio = torch.exp(logp - logp.detach())
        pg = torch.max(-adv * ratio, -adv * ratio.clamp(0.8, 1.2))
        loss = ((pg - 0.001 * ent) * mask).sum() / total
        loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def timed(fn, reps=3, cuda=True):
    """Seconds a call after one warm-up, and the peak GiB (0 with cuda=False: a CPU harness run)."""
    fn()  # warm-up
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    if cuda:
        torch.cuda.synchronize()
    return (time.perf_counter() - t) / reps, (torch.cuda.max_memory_allocated() / 2**30 if cuda else 0.0)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="3b")
    p.add_argument("--micro-tokens", type=int, default=16384)
    p.add_argument("--peer-micro", type=int, default=4)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--no-peer", action="store_true")
    p.add_argument("--save", action="store_true")
    p.add_argument("--autocast", action="store_true", help="ours: fp32 parameters under bf16 autocast")
    p.add_argument("--fuse-train", action="store_true", help="ours again with kernels.fuse_train's path, same run")
    kernels_flag.add(p)
    a = p.parse_args()
    k = kernels_flag.use(a.kernels)
    if k.fuse_train:  # the first timing is always the unfused one; --fuse-train adds the fused one, same run
        p.error("--kernels fuse_train=true: give --fuse-train (both timings in one run)")
    import transformers

    dev = torch.device("cuda")
    bw, peak = measure_ceilings()
    cfg = SHAPES[a.model]
    lens = lengths()
    rng = random.Random(1)
    seqs = [[rng.randrange(100, cfg.vocab_size - 100) for _ in range(n)] for n in lens]
    env = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "transformers": transformers.__version__,
           "date": datetime.date.today().isoformat(), "bf16_tflops_measured": round(peak / 1e12),
           "kernels": kernels_flag.words(k)}
    res = {"name": "train_step", "model": f"{a.model}-shape", "sequences": len(lens), "useful_tokens": sum(lens),
           "padded_tokens_peer": sum(max(lens[i:i + a.peer_micro]) * len(lens[i:i + a.peer_micro])
                                     for i in range(0, len(lens), a.peer_micro)), **env}
    torch.manual_seed(0)
    with dev:
        model = Transformer(cfg).to(torch.float32 if a.autocast else torch.bfloat16)
    nparams = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=True)
    OPS.fuse_train = False
    dt, mem = timed(lambda: step_ours(model, opt, seqs, a.micro_tokens, dev, a.autocast), a.reps)
    F = flops(cfg, nparams, lens)
    res.update(params=nparams, autocast=a.autocast, ours_s=round(dt, 3), ours_tok_s=round(sum(lens) / dt),
               ours_mfu=round(F / dt / peak, 3), ours_mfu_vs_790=round(F / dt / 790e12, 3), ours_peak_gb=round(mem, 1))
    if a.fuse_train:
        OPS.fuse_train = True
        dt, mem = timed(lambda: step_ours(model, opt, seqs, a.micro_tokens, dev, a.autocast), a.reps)
        OPS.fuse_train = False
        res.update(ours_fused_s=round(dt, 3), ours_fused_peak_gb=round(mem, 1),
                   fuse_train_speedup=round(res["ours_s"] / dt, 3))
    del model, opt
    torch.cuda.empty_cache()
    if not a.no_peer:
        hf_cfg = transformers.AutoConfig.for_model(**cfg.to_hf())
        hf_cfg._attn_implementation = "sdpa"
        torch.manual_seed(0)
        peer = transformers.AutoModelForCausalLM.from_config(hf_cfg).to(dev, torch.bfloat16)
        popt = torch.optim.AdamW(peer.parameters(), lr=1e-6, fused=True)
        try:
            dt, mem = timed(lambda: step_peer(peer, popt, seqs, a.peer_micro, dev), a.reps)
            res.update(peer_s=round(dt, 3), peer_tok_s=round(sum(lens) / dt), peer_mfu=round(F / dt / peak, 3),
                       peer_mfu_vs_790=round(F / dt / 790e12, 3), peer_peak_gb=round(mem, 1))
            res["speedup"] = round(res["ours_tok_s"] / res["peer_tok_s"], 2)
        except torch.OutOfMemoryError as e:
            res["peer_error"] = f"OOM: {str(e)[:120]}"
    print(json.dumps(res), flush=True)
    if a.save:
        os.makedirs("bench/results", exist_ok=True)
        with open("bench/results/train_step.json", "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
