"""Would an FP8 frozen base help? (issue 30, item 8: "only if measured to help"). Before any model code: the
base's projections of the Qwen2.5-7B shape as one matmul each, bf16 (what r1 runs, `x @ w.t()`) against FP8
e4m3 through `torch._scaled_mm` with per-output-channel weight scales and per-token activation scales, timed on
the same GPU in the same run, with the cost of quantizing the activations counted (it is paid at every call)
and without it (the kernel alone). Token counts: a decode step of 256 slots, a prefill chunk, a training
micro-batch. Error: each result against a float64 reference of the same (bf16-rounded) operands, as the
relative Frobenius error, bf16's and FP8's side by side. Timing: `--reps` calls back to back between two CUDA
events (one call alone between synchronizes would time launch and sync at 256 tokens), each call on the next of
enough copies of the weights (256 MiB of them) that they come from HBM as in a model, not from the 50 MB L2: an
FP8 weight is half the bytes to read, its main gain in decode. Prints one JSON line a shape and a summary line,
each also appended to `--out F` as it comes (a run cut short keeps its rows). `--device cpu` (the default
without CUDA): two small shapes, a dry run of the code path only, no speed meaning; on the CPU `_scaled_mm`
also takes a row-major second operand, so the CUDA layout rule is checked on the GPU only.
    python bench/fp8_matmul.py [--out bench/results/fp8_matmul.json] [--reps 50] [--device cuda|cpu]
"""
import argparse
import json
import math
import sys
import time

import torch

E4M3_MAX = 448.0
# Qwen2.5-7B: hidden 3584, 28 query heads and 4 key/value heads of 128, MLP 18944; LoRA keeps projections unfused
SHAPES_7B = {"q": (3584, 3584), "k": (3584, 512), "v": (3584, 512), "o": (3584, 3584),
             "gate": (3584, 18944), "up": (3584, 18944), "down": (18944, 3584)}
TOKENS = (256, 4096, 16384)
COPY_BYTES = 256 * 2**20  # weight copies enough to leave the L2 cache (50 MB on an H200) behind


def quantize_rows(x: torch.Tensor):
    """Per-row (per-token, or per-output-channel for a weight [out, in]) e4m3 and its float32 scale column."""
    scale = x.abs().amax(dim=-1, keepdim=True).float().clamp(min=1e-12) / E4M3_MAX
    return (x.float() / scale).to(torch.float8_e4m3fn), scale


def fp8_linear(x8, sx, w8, sw):
    """x8 [M, K] row-major, w8 [N, K] row-major: `w8.t()` is the column-major right operand _scaled_mm wants."""
    return torch._scaled_mm(x8, w8.t(), scale_a=sx, scale_b=sw.t(), out_dtype=torch.bfloat16)


def timed(fn, reps: int, cuda: bool) -> float:
    """Seconds a call: fn(i) for i in range(reps) back to back (i picks the weight copy), after two warm-up calls."""
    fn(0)
    fn(1)
    if cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for i in range(reps):
            fn(i)
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 1e3 / reps
    t = time.perf_counter()
    for i in range(reps):
        fn(i)
    return (time.perf_counter() - t) / reps


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.double() - ref).norm() / ref.norm())


def measure(name: str, k: int, n: int, m: int, reps: int, device: str) -> dict:
    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(m, k, device=device, generator=g).bfloat16()
    w = (torch.randn(n, k, device=device, generator=g) / k ** 0.5).bfloat16()
    w8, sw = quantize_rows(w)  # once: the frozen base is stored this way
    x8, sx = quantize_rows(x)
    ref = x.double() @ w.double().t()
    cuda = device == "cuda"
    copies = max(1, min(16, math.ceil(COPY_BYTES / (n * k * 2)))) if cuda else 1
    ws = [w] + [w.clone() for _ in range(copies - 1)]
    w8s = [w8] + [w8.clone() for _ in range(copies - 1)]
    t_bf16 = timed(lambda i: x @ ws[i % copies].t(), reps, cuda)
    t_kernel = timed(lambda i: fp8_linear(x8, sx, w8s[i % copies], sw), reps, cuda)
    t_fp8 = timed(lambda i: fp8_linear(*quantize_rows(x), w8s[i % copies], sw), reps, cuda)
    flops = 2 * m * k * n
    return {"name": "fp8_matmul", "proj": name, "k": k, "n": n, "tokens": m, "weight_copies": copies,
            "bf16_ms": round(t_bf16 * 1e3, 4), "fp8_kernel_ms": round(t_kernel * 1e3, 4),
            "fp8_with_quant_ms": round(t_fp8 * 1e3, 4), "speedup_kernel": round(t_bf16 / t_kernel, 3),
            "speedup_with_quant": round(t_bf16 / t_fp8, 3), "bf16_tflops": round(flops / t_bf16 / 1e12, 1),
            "err_bf16": rel_err(x @ w.t(), ref), "err_fp8": rel_err(fp8_linear(x8, sx, w8, sw), ref),
            "weight_mib_bf16": round(n * k * 2 / 2**20, 1), "weight_mib_fp8": round(n * k * 1.0 / 2**20 + n * 4 / 2**20, 1)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="also append the JSON lines here, each as it comes (the file is started anew)")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--device", choices=["cuda", "cpu"], help="default: cuda where there is one")
    a = ap.parse_args(argv)
    if a.reps < 1:
        sys.exit(f"error: --reps must be at least 1, got {a.reps}")
    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        sys.exit("error: --device cuda: torch sees no CUDA device")
    out = None
    if a.out:
        try:
            out = open(a.out, "w")
        except OSError as e:
            sys.exit(f"error: --out {a.out}: {e.strerror}")
    shapes, tokens = (SHAPES_7B, TOKENS) if device == "cuda" else ({"q": (64, 64), "down": (128, 64)}, (8,))

    def emit(row):
        print(json.dumps(row), flush=True)
        if out:
            out.write(json.dumps(row) + "\n")
            out.flush()

    for m in tokens:
        total = {"bf16_ms": 0.0, "fp8_with_quant_ms": 0.0, "fp8_kernel_ms": 0.0}
        for name, (k, n) in shapes.items():
            try:
                r = measure(name, k, n, m, a.reps, device)
            except torch.OutOfMemoryError:
                raise
            except RuntimeError as e:  # e.g. a GPU without FP8 matmuls (before Hopper / Ada)
                first = (str(e).splitlines() or [type(e).__name__])[0]
                sys.exit(f"error: FP8 matmul of {name} ({m} x {k} x {n}) on {device}: {first}")
            emit(r)
            for key in total:
                total[key] += r[key]
        emit({"name": "fp8_matmul_layer", "tokens": m, "device": torch.cuda.get_device_name() if device == "cuda"
              else "cpu", "torch": torch.__version__, **{k: round(v, 4) for k, v in total.items()},
              "layer_speedup_with_quant": round(total["bf16_ms"] / total["fp8_with_quant_ms"], 3),
              "layer_speedup_kernel": round(total["bf16_ms"] / total["fp8_kernel_ms"], 3)})
    if out:
        out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
