"""Host seconds of an iteration's scoring step outside the model forwards, at configs/gsm8k_tool.yaml's batch.

    python bench/host_score.py [--episodes 512] [--repeats 5] [--config configs/gsm8k_tool.yaml]

Step 2 + 3 (r1/trainer.py's time_score) is the learner's forwards plus host
work: packing the episodes into micro-batches (r1/packing.plan), the credit
inputs, the estimator, the sampler's logprobs in token order, the gap
metrics. The host part runs while the GPU waits (synchronous loop) or
competes with the rollout thread for the interpreter (train.overlap), so it
is measured alone here, on the CPU, without a model: synthetic episodes
shaped like a trained GSM8K-tool agent's (a 300-token prompt, 2 to 6 turns
of 30 to 80 sampled tokens, 12-token tool results: about 600 tokens an
episode, as recipe1's 310k trained tokens over 512 episodes), random critic
values and logprobs in place of the forwards. Prints each part's best of
`repeats` (the least disturbed by other work on the machine) and one JSON line.

Also timed: check_episodes, the trainer's guard on every rollout (on the
main thread, also under train.overlap). Two lanes in the same run: r1's
code, and the code it replaced on 2026-12-02: `list_collate`, the
micro-batch built token by token from Python lists (tests/test_packing.py
holds both to the same tensors; the benchmark exits if they differ here),
and check_episodes' step-by-step loop alone (trajectory._finish_bad,
without the whole-batch check in front of it).
"""
import argparse
import json
import os
import random
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from r1 import packing  # noqa: E402
from r1.config import load_config  # noqa: E402
from r1.exits import USER_ERRORS, run_main  # noqa: E402
from r1.credit import compute, credit_inputs, sampler_logprobs, score_metrics, step_rewards  # noqa: E402
from r1.distributed import Dist  # noqa: E402
from r1.learner import Scores  # noqa: E402
from r1.packing import MicroBatch  # noqa: E402
from r1.trajectory import Step, Trajectory, _finish_bad, check_episodes  # noqa: E402


VOCAB = 49152  # SmolLM2's


def list_collate(seqs: list, trajs, order: dict, device, share: bool = False) -> MicroBatch:
    """packing.collate's micro-batch, built token by token from Python lists (the reference lane; whole
    sequences only: train.share_prefix's packing is tested against the whole one in tests/test_share_prefix.py)."""
    if share:
        raise ValueError("list_collate packs every sequence whole (share=False)")
    ids, pos, cu, sel, targets, mask, tok_step, tok_traj, step_pos, step_index = [], [], [0], [], [], [], [], [], [], []
    for s in seqs:
        base = len(ids)
        ids += s.ids
        pos += range(len(s.ids))
        cu.append(len(ids))
        for key, start, n in s.spans:
            g = order[key]
            sel += range(base + start - 1, base + start - 1 + n)
            targets += s.ids[start:start + n]
            mask += trajs[key[0]].steps[key[1]].mask
            tok_step += [g] * n
            tok_traj += [key[0]] * n
            step_pos.append(base + start - 1)
            step_index.append(g)
    t = lambda x, dt=torch.long: torch.tensor(x, dtype=dt, device=device)  # noqa: E731
    return MicroBatch(t(ids), t(pos), t(cu, torch.int32), max(len(s.ids) for s in seqs), t(sel), t(targets),
                      t(mask, torch.float32), t(tok_step), t(tok_traj), t(step_pos), t(step_index), len(ids))


def episodes(n: int, group: int, seed: int = 0) -> list:
    """n append-only episodes, `group` per prompt, a reward of 1 at the last step one time in ten."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        prompt, steps = [rng.randrange(VOCAB) for _ in range(300)], []
        for _ in range(rng.choice([2, 3, 4, 4, 5, 6])):
            resp = [rng.randrange(VOCAB) for _ in range(rng.randrange(30, 81))]
            steps.append(Step(list(prompt), resp, [-rng.random() for _ in resp]))
            prompt = prompt + resp + [rng.randrange(VOCAB) for _ in range(12)]
        steps[-1].reward, steps[-1].done = float(rng.random() < 0.1), True
        out.append(Trajectory(str(i), i // group, str(i // group), steps))
    return out


def host_parts(trajs: list, cfg, check=check_episodes) -> tuple:
    """Seconds of each host part of the episodes' check and step 2 + 3 (the forwards replaced by random
    scores), and the plan."""
    algo, d, cpu = cfg.algo, Dist(rank=0, world=1, local_rank=0, device=torch.device("cpu")), torch.device("cpu")
    t, t0 = {}, time.perf_counter()
    if check(trajs, VOCAB):
        raise SystemExit("error: host_score: check_episodes found a bad step in the synthetic episodes")
    t["check_episodes"], t0 = time.perf_counter() - t0, time.perf_counter()
    plan = packing.plan(trajs, algo.minibatches, 65536, cpu)  # the micro_tokens `auto` picks for 135M on an H200
    t["plan"] = time.perf_counter() - t0
    scores = [Scores(torch.randn(mb.sel.numel()) - 1.0, None, torch.randn(mb.sel.numel()),
                     torch.randn(mb.step_pos.numel())) for mb in plan.micro_batches]
    t0 = time.perf_counter()
    batch = credit_inputs(trajs, plan, scores, step_rewards(trajs), algo, d)
    t["credit_inputs"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    credit = compute(batch, algo)
    t["estimator"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    sampler = sampler_logprobs(trajs, batch.tok_step)
    t["sampler_logprobs"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    score_metrics(batch, credit, sampler, d)
    t["metrics"] = time.perf_counter() - t0
    return t, plan


def lane(trajs: list, cfg, repeats: int, collate, check) -> tuple:
    """Best of `repeats` for each part, with packing.plan building its micro-batches with `collate` and the
    episodes checked by `check`."""
    kept, packing.collate = packing.collate, collate
    try:
        runs = [host_parts(trajs, cfg, check) for _ in range(repeats)]
    finally:
        packing.collate = kept
    return {k: min(r[0][k] for r in runs) for k in runs[0][0]}, runs[0][1]


def same_plans(a, b) -> bool:
    """Every micro-batch of the two plans has the same fields: tensors equal in value and dtype."""
    return len(a.micro_batches) == len(b.micro_batches) and all(
        all(torch.equal(x, y) and x.dtype == y.dtype if torch.is_tensor(x) else x == y
            for x, y in ((getattr(m, f), getattr(n, f)) for f in MicroBatch.__dataclass_fields__))
        for m, n in zip(a.micro_batches, b.micro_batches))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="configs/gsm8k_tool.yaml")
    p.add_argument("--episodes", type=int, default=0, help="default: the config's rollout.prompts x rollout.n")
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args(argv)
    if a.repeats < 1:
        raise SystemExit(f"error: --repeats must be at least 1, not {a.repeats}")
    if a.episodes < 0:
        raise SystemExit(f"error: --episodes must be at least 1 (0: the config's), not {a.episodes}")
    try:
        cfg = load_config(a.config)
    except USER_ERRORS as e:  # a wrong config path or key
        raise SystemExit(f"error: {e}") from None
    n = a.episodes or cfg.rollout.prompts * cfg.rollout.n
    trajs = episodes(n, cfg.rollout.n)
    r1_best, r1_plan = lane(trajs, cfg, a.repeats, packing.collate, check_episodes)
    ref_best, ref_plan = lane(trajs, cfg, a.repeats, list_collate, _finish_bad)
    if not same_plans(r1_plan, ref_plan):
        raise SystemExit("error: host_score: r1's packing and the list-built reference give different micro-batches")
    tokens = sum(mb.num_tokens for mb in r1_plan.micro_batches)
    print(f"{'':>17}  {'r1':>9}  {'lists':>9}   (ms, best of {a.repeats}; {n} episodes, {tokens:,} tokens)")
    for k in r1_best:
        print(f"{k:>17}  {r1_best[k] * 1000:9.1f}  {ref_best[k] * 1000:9.1f}")
    total, ref_total = sum(r1_best.values()), sum(ref_best.values())
    print(f"{'total':>17}  {total * 1000:9.1f}  {ref_total * 1000:9.1f}   lists / r1 = {ref_total / total:.2f}")
    out = {"name": "host_score", "config": a.config, "episodes": n, "tokens": tokens, "total_s": round(total, 4),
           "lists_total_s": round(ref_total, 4), "ratio": round(ref_total / total, 2),
           **{k + "_s": round(v, 4) for k, v in r1_best.items()}, "lists_plan_s": round(ref_best["plan"], 4),
           "torch": torch.__version__}
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    run_main(main)
