"""Peak memory and time of logprob+entropy, forward+backward: naive vs fused (kernels/logprob.py).

    python bench/logprob_memory.py [--save]      # on CUDA: N=16384, H=2048, V=151936, bf16

The naive peer is `logprob_entropy_reference` under autograd (full fp32
logits, several [N, V] tensors kept for backward). The fused path is
`logprob_entropy` as the trainer calls it (Triton when available); where that
is Triton, the fused torch path is measured too. Peaks are
torch.cuda.max_memory_allocated over one forward+backward, inputs included
(they are also given alone as inputs_gb). Times are the median of --reps runs
after one warm-up. The loss is sum(a * logp + b * entropy) with random a, b,
so both gradients flow. Prints one JSON line; --save also writes it to
bench/results/logprob_memory.json. Without CUDA it runs a tiny shape as a CPU
dry run (no memory numbers, nothing saved) to show the script works.
"""
import argparse
import datetime
import json
import os
import statistics
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from kernels.logprob import logprob_entropy, logprob_entropy_reference, triton_logprob  # noqa: E402


def run_once(fn, hidden, weight, targets, a, b, **kw):
    """One forward+backward; returns (logp, entropy) detached."""
    logp, ent = fn(hidden, weight, targets, **kw)
    (a * logp + b * ent).sum().backward()
    hidden.grad = weight.grad = None
    return logp.detach(), ent.detach()


def measure(fn, inputs, reps, cuda, **kw):
    """(peak bytes or None, median ms, outputs of the warm-up run)."""
    out = run_once(fn, *inputs, **kw)  # warm-up: cuBLAS handles, Triton compilation
    times = []
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    for _ in range(reps):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run_once(fn, *inputs, **kw)
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            run_once(fn, *inputs, **kw)
            times.append((time.perf_counter() - t0) * 1e3)
    peak = torch.cuda.max_memory_allocated() if cuda else None
    return peak, statistics.median(times), out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--save", action="store_true", help="write bench/results/logprob_memory.json")
    parser.add_argument("--n", type=int, default=16384, help="tokens")
    parser.add_argument("--h", type=int, default=2048, help="hidden size")
    parser.add_argument("--v", type=int, default=151936, help="vocab size")
    parser.add_argument("--chunk-size", type=int, default=4096)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()

    cuda = torch.cuda.is_available()
    if cuda:
        device, dtype, (n, h, v) = "cuda", torch.bfloat16, (args.n, args.h, args.v)
    else:
        device, dtype, (n, h, v) = "cpu", torch.float32, (512, 64, 3000)
        print(f"CPU dry run: no CUDA, so a tiny fp32 shape N={n} H={h} V={v} and no memory numbers",
              file=sys.stderr)
    torch.manual_seed(0)
    hidden = torch.randn(n, h, device=device, dtype=dtype).requires_grad_()
    weight = (torch.randn(v, h, device=device, dtype=dtype) / h**0.5).requires_grad_()
    targets = torch.randint(0, v, (n,), device=device)
    a = torch.randn(n, device=device)
    b = torch.randn(n, device=device)
    inputs = (hidden, weight, targets, a, b)
    inputs_bytes = sum(t.numel() * t.element_size() for t in inputs)
    kw = dict(temperature=args.temperature)
    fused_kw = dict(kw, chunk_size=args.chunk_size)
    uses_triton = cuda and triton_logprob is not None

    fused_peak, fused_ms, fused_out = measure(logprob_entropy, inputs, args.reps, cuda, **fused_kw)
    torch_peak = torch_ms = None
    if uses_triton:
        torch_peak, torch_ms, _ = measure(logprob_entropy, inputs, args.reps, cuda, use_triton=False, **fused_kw)
    naive_peak, naive_ms, naive_out = measure(logprob_entropy_reference, inputs, args.reps, cuda, **kw)

    gb = (lambda x: None if x is None else round(x / 1e9, 3))
    result = {
        "name": "logprob_memory",
        "naive_peak_gb": gb(naive_peak),
        "fused_peak_gb": gb(fused_peak),
        "ratio": round(naive_peak / fused_peak, 2) if cuda else None,
        "naive_ms": round(naive_ms, 2),
        "fused_ms": round(fused_ms, 2),
        "fused_path": "triton" if uses_triton else "torch",
        "fused_torch_path_peak_gb": gb(torch_peak),
        "fused_torch_path_ms": None if torch_ms is None else round(torch_ms, 2),
        "inputs_gb": gb(inputs_bytes) if cuda else None,
        "max_abs_diff_logp": (fused_out[0] - naive_out[0]).abs().max().item(),
        "max_abs_diff_entropy": (fused_out[1] - naive_out[1]).abs().max().item(),
        "n": n, "h": h, "v": v, "dtype": str(dtype).removeprefix("torch."), "chunk_size": args.chunk_size,
        "device": torch.cuda.get_device_name() if cuda else "cpu (dry run, tiny shape)",
        "torch": torch.__version__,
        "triton": getattr(sys.modules.get("triton"), "__version__", None),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    line = json.dumps(result)
    print(line)
    if args.save and not cuda:
        print("--save ignored on a CPU dry run (it would overwrite the GPU result)", file=sys.stderr)
    elif args.save:
        path = os.path.join(ROOT, "bench", "results", "logprob_memory.json")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(line + "\n")


if __name__ == "__main__":
    main()
