"""Where a decode step's time goes: torch.profiler over our generator, kernels grouped by kind.

The rollout benchmark gives one number (new tokens/s); this splits a decode
step of the same set-up (random weights of a real shape, batch B, P prompt
tokens, N forced new tokens, CUDA graphs as in the trainer) into matmuls,
attention, sampling, cache writes / indexing, elementwise and the rest, in
milliseconds per decode step of GPU kernel time, plus the top kernels by name.
It answers "what bounds the step" with a measurement rather than a guess.
Kernel names are matched by substrings (cuBLAS/CUTLASS GEMMs, our Triton
kernels by function name); anything unmatched is reported under "other".

    python bench/profile_decode.py [--model 3b|135m] [--batch 256] [--prompt 256] [--new 64] [--eager]
    python bench/profile_decode.py --torch-sample      # the torch sampling path, for comparison

On a machine without CUDA it runs the 135m shape for a few tokens on the CPU
(CPU operator times, for checking the script), unless --model says otherwise.
"""
import argparse
import datetime
import json
import os
import sys
from collections import defaultdict

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.rollout import SHAPES  # noqa: E402
from r1.generate import Generator, Sampling  # noqa: E402
from r1.model import Transformer, paths_in_use  # noqa: E402

KINDS = [  # first match wins
    ("attention", ("_decode_kernel", "_combine_kernel", "flash", "fmha", "attention", "sdpa")),
    ("sampling", ("_sample_kernel", "sample", "exponential", "softmax", "argmax", "topk", "sort")),
    ("matmul", ("gemm", "cutlass", "nvjet", "sm90_xmma", "matmul", "addmm", "linear", "mm")),
    ("cache/indexing", ("index", "gather", "scatter", "put")),
    ("elementwise", ("elementwise", "vectorized", "reduce", "mul", "add", "copy", "cat", "rsqrt", "pow", "mean")),
]


def kind(name: str) -> str:
    low = name.lower()
    for k, keys in KINDS:
        if any(s in low for s in keys):
            return k
    return "other"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default=None)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--prompt", type=int, default=256)
    p.add_argument("--new", type=int, default=64)
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--eager", action="store_true", help="no CUDA graphs (kernels inside graph replays are "
                   "normally traced too; this checks the split does not depend on it)")
    p.add_argument("--torch-sample", action="store_true", help="the torch sampling path (kernels.sample=torch)")
    a = p.parse_args()
    cuda = torch.cuda.is_available()
    dev = "cuda" if cuda else "cpu"
    if not cuda:
        a.model, a.batch, a.prompt, a.new = a.model or "135m", min(a.batch, 4), min(a.prompt, 16), min(a.new, 4)
    name = a.model or "3b"
    cfg = SHAPES[name]
    torch.manual_seed(0)
    with torch.device(dev):
        model = Transformer(cfg).to(torch.bfloat16 if cuda else torch.float32).eval().requires_grad_(False)
    prompts = torch.randint(100, cfg.vocab_size - 100, (a.batch, a.prompt)).tolist()
    gen = Generator(model, slots=a.batch, max_len=a.prompt + a.new + 8, cuda_graphs=cuda and not a.eager,
                    sync_every=32, triton_sample=not a.torch_sample)
    s = Sampling(temperature=1.0, seed=0)
    gen.generate(prompts, 8, s)  # warm-up: prefill, compiles, graph capture
    gen.generate(prompts, 1, s)  # the prefill alone, to subtract below
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof_prefill:
        gen.generate(prompts, 1, s)
        if cuda:
            torch.cuda.synchronize()
    with profile(activities=acts) as prof:
        gen.generate(prompts, a.new + 1, s)
        if cuda:
            torch.cuda.synchronize()

    def totals(pr):
        out = defaultdict(float)
        for e in pr.key_averages():
            # GPU: only the device's own events (kernels, copies). A CPU op (aten::mul) also carries the
            # device time of the kernels it launched, so counting it too would count those kernels twice.
            if cuda and (e.device_type != DeviceType.CUDA or getattr(e, "is_user_annotation", False)):
                continue  # (inductor's "## Call CompiledFxGraph ##" ranges are user annotations, not kernels)
            t = e.device_time_total if cuda else e.self_cpu_time_total  # microseconds
            if t > 0:
                out[e.key] += t
        return out

    full, pre = totals(prof), totals(prof_prefill)
    steps = a.new  # decode steps beyond the prefill's first token
    per_kernel = {k: max(0.0, full[k] - pre.get(k, 0.0)) / 1e3 / steps for k in full}  # ms per decode step
    by_kind = defaultdict(float)
    for k, ms in per_kernel.items():
        by_kind[kind(k)] += ms
    top = sorted(per_kernel.items(), key=lambda kv: -kv[1])[: a.top]
    res = {"name": "profile_decode", "model": f"{name}-shape", "batch": a.batch, "prompt": a.prompt, "new": a.new,
           "device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
           "time": "GPU kernel time" if cuda else "CPU self time (script check only)",
           "cuda_graphs": cuda and not a.eager, "sample_path": "torch" if a.torch_sample or not cuda else "triton",
           "decode_attention": "triton" if cuda else "math",
           **paths_in_use(cuda),
           "ms_per_step_total": round(sum(by_kind.values()), 3),
           "ms_per_step_by_kind": {k: round(v, 3) for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])},
           "top_kernels_ms_per_step": [[k[:90], round(v, 4)] for k, v in top],
           "date": datetime.date.today().isoformat()}
    print(json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
