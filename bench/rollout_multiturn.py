"""Multi-turn rollout throughput: what turn boundaries cost, the batched chunk path vs the per-row loop.

The single-turn benchmark (bench/rollout.py) never appends an observation to a
live cache; an agent does at every step. Here a scripted environment plays
B episodes of T turns: each turn the model writes exactly `new` tokens (no
stop ids), the environment appends `obs` fixed observation tokens, and the
episode goes on with the same slot and cache (AgentEnvLoop, as in training).
Random weights of a real shape, bf16, CUDA graphs as in the trainer.
Sampling noise is keyed by (seed, episode, position), so both paths should
sample the same tokens up to bf16 kernel differences (counted in the last
line). Prints one JSON object per chunk path: `batched` (one padded SDPA call per
layer, kernels/attention.py::_sdpa_chunks) and `loop` (kernels.chunks=loop, the
per-row loop with host syncs), with new tokens/s and the ratio. On a machine
without CUDA it runs a tiny shape on the CPU, through the same code, as a check.

    python bench/rollout_multiturn.py [--model 135m|3b] [--episodes 256] [--turns 4] [--new 48] [--obs 24]
"""
import argparse
import datetime
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.rollout import SHAPES  # noqa: E402
from kernels import attention  # noqa: E402
from r1.envs.base import Env, Observation  # noqa: E402
from r1.generate import Generator, Sampling  # noqa: E402
from r1.model import Transformer, tiny_config  # noqa: E402
from r1.rollout import AgentEnvLoop  # noqa: E402


class Ids:
    """The loop decodes responses for the env's parser; this env parses nothing."""

    def decode(self, ids):
        return ""


class ScriptedEnv(Env):
    """T turns; every observation is the same `obs` token ids; reward 0."""

    def __init__(self, prompt_len, turns, obs, max_new, max_context):
        super().__init__(Ids(), max_context=max_context, max_new_tokens=max_new)
        self.prompt_len, self.turns, self.obs = prompt_len, turns, obs
        self.t = 0

    def reset(self, sample):
        self.t = 0
        return Observation(ids=[100 + (sample["id"] * 7 + i) % 1000 for i in range(self.prompt_len)])

    def step(self, action):
        self.t += 1
        done = self.t >= self.turns
        return (None if done else Observation(ids=[200 + i for i in range(self.obs)])), 0.0, done, {}


def run(model, a, cache_len, chunks):
    attention.PATHS.chunks = chunks
    cuda = next(model.parameters()).is_cuda
    gen = Generator(model, a.episodes, cache_len, cuda_graphs=cuda)
    gen.set_sampling(Sampling(temperature=1.0, seed=0))
    loop = AgentEnvLoop(gen, Ids(), lambda: ScriptedEnv(a.prompt, a.turns, a.obs, a.new, cache_len), a.new)
    samples = [{"id": i} for i in range(a.episodes)]
    loop.run(samples[: min(8, a.episodes)], 1, uid_prefix="warm-")  # graph capture, compiles
    if cuda:
        torch.cuda.synchronize()
    t = time.perf_counter()
    trajs = loop.run(samples, 1)
    if cuda:
        torch.cuda.synchronize()
    dt = time.perf_counter() - t
    n = sum(len(s.response_ids) for tr in trajs for s in tr.steps)
    return n, dt, [[s.response_ids for s in tr.steps] for tr in trajs]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="135m")
    p.add_argument("--episodes", type=int, default=256)
    p.add_argument("--prompt", type=int, default=200)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--new", type=int, default=48)
    p.add_argument("--obs", type=int, default=24)
    a = p.parse_args()
    cuda = torch.cuda.is_available()
    torch.manual_seed(0)
    if cuda:
        cfg = SHAPES[a.model]
        with torch.device("cuda"):
            model = Transformer(cfg).to(torch.bfloat16).eval().requires_grad_(False)  # generation only: fused projections
    else:
        a.episodes, a.prompt, a.turns, a.new, a.obs = min(a.episodes, 6), min(a.prompt, 12), min(a.turns, 3), \
            min(a.new, 6), min(a.obs, 4)
        cfg = tiny_config("llama", tie=True, vocab_size=1200)
        model = Transformer(cfg).eval()
        attention.PATHS.attention = attention.PATHS.attention or "sdpa"  # the CPU check runs the GPU's cache paths (math would take both)
    cache_len = a.prompt + a.turns * (a.new + a.obs) + 8
    res, toks = {}, {}
    for chunks in ("batched", "loop"):
        n, dt, toks[chunks] = run(model, a, cache_len, chunks)
        res[chunks] = (n, dt)
        print(json.dumps({"name": "rollout_multiturn", "model": f"{a.model}-shape" if cuda else "tiny (CPU check)",
                          "chunks": chunks, "episodes": a.episodes, "prompt": a.prompt, "turns": a.turns,
                          "new": a.new, "obs": a.obs, "new_tokens": n, "seconds": round(dt, 3),
                          "tok_s": round(n / dt), "device": torch.cuda.get_device_name() if cuda else "cpu",
                          "torch": torch.__version__, "date": datetime.date.today().isoformat()}), flush=True)
    attention.PATHS.chunks = ""
    (nb, tb), (nl, tl) = res["batched"], res["loop"]
    same = sum(x == y for x, y in zip(toks["batched"], toks["loop"]))
    print(json.dumps({"name": "rollout_multiturn_ratio", "batched_over_loop": round((nb / tb) / (nl / tl), 2),
                      "episodes_with_identical_tokens": f"{same}/{len(toks['loop'])}"}))


if __name__ == "__main__":
    main()
