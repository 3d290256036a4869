"""Per-decode-step sampling cost: the torch path of r1/generate.py::sample vs kernels/triton_sample.py.

    python bench/sample.py [--batches 64,256] [--vocabs 49152,151936] [--dtypes bf16,fp32] [--reps 20]

Seeded sampling at temperature 1, top_k 0, top_p 1 (the rollout default), on
random logits [B, V] in the given dtype (the generator now hands its logits
over in the model dtype; fp32 is the old `.float()` input). Times are the
median of --reps CUDA-event timings after two warm-ups (Triton compiles in
the first). Prints one JSON object per case with both times, their ratio,
the kernel's logits read rate (GB/s) and whether the two paths sampled the
same tokens. Needs CUDA; on CPU it prints one line and exits.
"""
import argparse
import datetime
import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from r1.generate import Sampling, sample  # noqa: E402


def time_ms(fn, reps):
    for _ in range(2):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="64,256")
    parser.add_argument("--vocabs", default="49152,151936")
    parser.add_argument("--dtypes", default="bf16,fp32")
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench/sample.py needs CUDA (it times GPU sampling kernels); nothing to do on CPU")
        return
    import triton

    from kernels import triton_sample

    env = {"device": torch.cuda.get_device_name(), "sms": torch.cuda.get_device_properties(0).multi_processor_count,
           "torch": torch.__version__, "triton": triton.__version__,
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    s = Sampling(temperature=1.0)
    dtypes = {"bf16": torch.bfloat16, "fp32": torch.float32}
    for name in args.dtypes.split(","):
        for v in map(int, args.vocabs.split(",")):
            for b in map(int, args.batches.split(",")):
                torch.manual_seed(0)
                logits = (torch.randn(b, v, device="cuda") * 3).to(dtypes[name])
                seeds = torch.randint(0, 1 << 62, (b,), device="cuda")
                pos = torch.randint(0, 4096, (b,), device="cuda")
                ref = sample(logits, s, seeds, pos, use_triton=False)
                got = triton_sample.sample(logits, s.temperature, seeds, pos)
                inputs = (logits, seeds, pos)
                torch_ms = time_ms(lambda x=inputs: sample(x[0], s, x[1], x[2], use_triton=False), args.reps)
                kernel_ms = time_ms(lambda x=inputs: triton_sample.sample(x[0], s.temperature, x[1], x[2]), args.reps)
                print(json.dumps({
                    "name": "sample", "batch": b, "vocab": v, "dtype": name,
                    "torch_ms": round(torch_ms, 4), "kernel_ms": round(kernel_ms, 4),
                    "ratio": round(torch_ms / kernel_ms, 1),
                    "kernel_read_GBps": round(logits.numel() * logits.element_size() / kernel_ms / 1e6, 1),
                    "same_tokens": bool(torch.equal(ref[0], got[0])),
                    "max_logprob_diff": (ref[1] - got[1]).abs().max().item(), **env}), flush=True)


if __name__ == "__main__":
    main()
