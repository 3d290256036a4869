"""Scoring and one PPO update step on GSM8K-tool-shaped groups, each group's prompt packed whole or once
(train.share_prefix), against Hugging Face transformers on the same sequences, in one run.

The batch is what configs/gsm8k_tool.yaml trains on: --prompts prompts x --n samples, each sample its group's
prompt (--prompt-len tokens: the system prompt, the tool schema, the question) then its own tokens (log-normal
around --own-mean, clipped: the responses and the tool observations), scored on its own tokens. It goes through
the trainer's own packing (r1.packing.plan, one mini-batch) and the trainer's forward (autocast, fp32 master
weights, as on one GPU):

- ours, whole: every sample packed with its prompt (train.share_prefix=false, the default);
- ours, shared: each group's prompt once per micro-batch (train.share_prefix=true);
- peer: transformers' model (SDPA, bf16 parameters), micro-batches of --peer-micro samples padded to the
  longest, logits -> float32 log_softmax -> gather and entropy over the own tokens (bench/train_step.py's
  step_peer, which scores every token).

Each is timed for scoring (a forward without gradients, the old logprobs) and for the step (forward and backward
of every micro-batch, then AdamW). Prints one JSON line: the tokens each packing computes, seconds, peak memory,
and the ratios (share_speedup: whole / shared; vs_peer: peer / shared). `--cpu` runs a tiny model on the CPU (the
harness's test); its seconds say nothing about a GPU. --save writes bench/results/share_prefix_<model>.json.
"""
import argparse
import datetime
import json
import math
import os
import random
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.train_step import timed  # noqa: E402
from r1.algos.losses import ppo_policy_loss  # noqa: E402
from r1.model import Transformer, tiny_config  # noqa: E402
from r1.packing import plan  # noqa: E402
from r1.trajectory import Step, Trajectory  # noqa: E402


def episodes(prompts: int, n: int, prompt_len: int, own_mean: float, vocab: int, seed: int = 0) -> list:
    """prompts x n one-step trajectories: a group's prompt, then each sample's own tokens (all scored)."""
    rng = random.Random(seed)
    out = []
    for g in range(prompts):
        prompt = [rng.randrange(100, vocab - 100) for _ in range(prompt_len)]
        for k in range(n):
            m = int(min(4 * own_mean, max(16, rng.lognormvariate(math.log(own_mean), 0.5))))
            own = [rng.randrange(100, vocab - 100) for _ in range(m)]
            out.append(Trajectory(f"{g}-{k}", g, str(g), [Step(prompt, own, [0.0] * m)]))
    return out


def forward(model, mb, autocast: bool):
    with torch.autocast(mb.input_ids.device.type, dtype=torch.bfloat16, enabled=autocast):
        return model(mb.input_ids, mb.position_ids, mb.cu_seqlens, mb.max_seqlen, sel=mb.sel, targets=mb.targets,
                     kv_rows=mb.kv_rows)


def score_ours(model, micro_batches, autocast: bool):
    with torch.no_grad():
        for mb in micro_batches:
            forward(model, mb, autocast)


def step_ours(model, opt, micro_batches, autocast: bool):
    total = sum(mb.sel.numel() for mb in micro_batches)
    for mb in micro_batches:
        logp, ent = forward(model, mb, autocast)
        logp, ent = logp.float(), ent.float()
        adv = torch.randn_like(logp)
        mask = torch.ones_like(logp)
        loss, _ = ppo_policy_loss(logp, logp.detach(), adv, mask, norm=total)
        (loss - 0.001 * (ent * mask).sum() / total).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def peer_batches(trajs, micro: int, dev):
    """Padded [B, L] ids, attention masks and the masks of the scored (own) tokens, --peer-micro samples each."""
    out = []
    for i in range(0, len(trajs), micro):
        steps = [t.steps[0] for t in trajs[i:i + micro]]
        L = max(len(s.prompt_ids) + len(s.response_ids) for s in steps)
        ids = torch.zeros(len(steps), L, dtype=torch.long)
        att = torch.zeros(len(steps), L, dtype=torch.long)
        scored = torch.zeros(len(steps), L - 1)
        for j, s in enumerate(steps):
            seq = s.prompt_ids + s.response_ids
            ids[j, :len(seq)] = torch.tensor(seq)
            att[j, :len(seq)] = 1
            scored[j, len(s.prompt_ids) - 1:len(seq) - 1] = 1  # position p predicts token p + 1
        out.append((ids.to(dev), att.to(dev), scored.to(dev)))
    return out


def peer_logp(model, ids, att):
    logits = model(input_ids=ids, attention_mask=att).logits[:, :-1].float()
    logp_all = torch.log_softmax(logits, -1)
    return logp_all.gather(-1, ids[:, 1:, None])[..., 0], -(logp_all.exp() * logp_all).sum(-1)


def score_peer(model, batches):
    with torch.no_grad():
        for ids, att, _ in batches:
            peer_logp(model, ids, att)


def step_peer(model, opt, batches):
    total = sum(float(m.sum()) for *_, m in batches)
    for ids, att, mask in batches:
        logp, ent = peer_logp(model, ids, att)
        adv = torch.randn_like(logp)
        ratio = torch.exp(logp - logp.detach())
        pg = torch.max(-adv * ratio, -adv * ratio.clamp(0.8, 1.2))
        (((pg - 0.001 * ent) * mask).sum() / total).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="135m", help="135m or 3b (random weights of that shape)")
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--n", type=int, default=8)
    # the means of a PPO run's 500 validation episodes (docs/results.md, "Sharing the prompt"):
    # first prompt 366 tokens, whole sequence 584
    p.add_argument("--prompt-len", type=int, default=366)
    p.add_argument("--own-mean", type=float, default=218.0)
    p.add_argument("--micro-tokens", type=int, default=65536)
    p.add_argument("--peer-micro", type=int, default=8)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--no-peer", action="store_true")
    p.add_argument("--cpu", action="store_true", help="a tiny model on the CPU: the harness, not a measurement")
    p.add_argument("--save", action="store_true")
    a = p.parse_args(argv)
    dev = torch.device("cpu" if a.cpu else "cuda")
    if a.cpu:
        cfg = tiny_config("llama", vocab_size=512)
    else:
        from bench.rollout import SHAPES
        cfg = SHAPES[a.model]
    autocast = cuda = dev.type == "cuda"
    trajs = episodes(a.prompts, a.n, a.prompt_len, a.own_mean, cfg.vocab_size)
    whole = plan(trajs, 1, a.micro_tokens, dev).micro_batches
    shared = plan(trajs, 1, a.micro_tokens, dev, share=True).micro_batches
    scored = sum(mb.sel.numel() for mb in whole)
    if scored != sum(mb.sel.numel() for mb in shared):
        raise SystemExit("share_prefix_step: the two packings score different tokens")
    res = {"name": "share_prefix_step", "model": "tiny (cpu)" if a.cpu else f"{a.model}-shape",
           "episodes": len(trajs), "prompt_len": a.prompt_len, "scored_tokens": scored,
           "tokens_whole": sum(mb.num_tokens for mb in whole), "tokens_shared": sum(mb.num_tokens for mb in shared),
           "micro_batches_whole": len(whole), "micro_batches_shared": len(shared), "micro_tokens": a.micro_tokens,
           "date": datetime.date.today().isoformat(), "torch": torch.__version__,
           "device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu"}
    torch.manual_seed(0)
    with dev:
        model = Transformer(cfg).float()  # fp32 master weights, bf16 autocast on CUDA: the trainer on one GPU
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, **({"fused": True} if dev.type == "cuda" else {}))
    for name, mbs in (("whole", whole), ("shared", shared)):
        s, _ = timed(lambda: score_ours(model, mbs, autocast), a.reps, cuda)
        t, mem = timed(lambda: step_ours(model, opt, mbs, autocast), a.reps, cuda)
        res.update({f"ours_{name}_score_s": round(s, 4), f"ours_{name}_step_s": round(t, 4),
                    f"ours_{name}_peak_gb": round(mem, 1)})
    res["share_speedup_score"] = round(res["ours_whole_score_s"] / res["ours_shared_score_s"], 3)
    res["share_speedup_step"] = round(res["ours_whole_step_s"] / res["ours_shared_step_s"], 3)
    del model, opt
    if not a.no_peer:
        import transformers
        res["transformers"] = transformers.__version__
        hf_cfg = transformers.AutoConfig.for_model(**cfg.to_hf())
        hf_cfg._attn_implementation = "sdpa"
        torch.manual_seed(0)
        peer = transformers.AutoModelForCausalLM.from_config(hf_cfg).to(dev, torch.bfloat16 if autocast else
                                                                         torch.float32)
        popt = torch.optim.AdamW(peer.parameters(), lr=1e-6, **({"fused": True} if dev.type == "cuda" else {}))
        batches = peer_batches(trajs, a.peer_micro, dev)
        try:
            s, _ = timed(lambda: score_peer(peer, batches), a.reps, cuda)
            t, mem = timed(lambda: step_peer(peer, popt, batches), a.reps, cuda)
            res.update(peer_score_s=round(s, 4), peer_step_s=round(t, 4), peer_peak_gb=round(mem, 1),
                       vs_peer_score=round(s / res["ours_shared_score_s"], 2),
                       vs_peer_step=round(t / res["ours_shared_step_s"], 2))
        except torch.OutOfMemoryError as e:
            res["peer_error"] = f"OOM: {str(e)[:120]}"
    print(json.dumps(res), flush=True)
    if a.save:
        os.makedirs("bench/results", exist_ok=True)
        with open(f"bench/results/share_prefix_{a.model}.json", "w") as f:
            json.dump(res, f, indent=1)
    return res


if __name__ == "__main__":
    main()
