"""Would an FP8 frozen base help? (issue 30, item 8: "only if measured to help"). Before any model code: the
base's projections of the Qwen2.5-7B shape as one matmul each, bf16 (what r1 runs, `x @ w.t()`) against FP8
e4m3 through `torch._scaled_mm` with per-output-channel weight scales and per-token activation scales, timed on
the same GPU in the same run, with the cost of quantizing the activations counted (it is paid at every call)
and without it (the kernel alone). Token counts: a decode step of 256 slots, a prefill chunk, a training
micro-batch. Error: each result against a float64 reference of the same (bf16-rounded) operands, as the
relative Frobenius error, bf16's and FP8's side by side. Prints one JSON line a shape and a summary line;
`--out F` also writes them to F. CPU: a small shape, for a dry run of the code path only (no speed meaning).
    python bench/fp8_matmul.py [--out bench/results/fp8_matmul_h200.json] [--reps 20]
"""
import argparse
import json
import os
import sys
import time

import torch

E4M3_MAX = 448.0
# Qwen2.5-7B: hidden 3584, 28 query heads and 4 key/value heads of 128, MLP 18944; LoRA keeps projections unfused
SHAPES_7B = {"q": (3584, 3584), "k": (3584, 512), "v": (3584, 512), "o": (3584, 3584),
             "gate": (3584, 18944), "up": (3584, 18944), "down": (18944, 3584)}
TOKENS = (256, 4096, 16384)


def quantize_rows(x: torch.Tensor):
    """Per-row (per-token, or per-output-channel for a weight [out, in]) e4m3 and its float32 scale column."""
    scale = x.abs().amax(dim=-1, keepdim=True).float().clamp(min=1e-12) / E4M3_MAX
    return (x.float() / scale).to(torch.float8_e4m3fn), scale


def fp8_linear(x8, sx, w8, sw):
    """x8 [M, K] row-major, w8 [N, K] row-major: `w8.t()` is the column-major right operand _scaled_mm wants."""
    return torch._scaled_mm(x8, w8.t(), scale_a=sx, scale_b=sw.t(), out_dtype=torch.bfloat16)


def timed(fn, reps: int, cuda: bool) -> float:
    """Median seconds of one call, after two warm-up calls."""
    fn(); fn()
    out = []
    for _ in range(reps):
        if cuda:
            torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        out.append(time.perf_counter() - t)
    return sorted(out)[len(out) // 2]


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
    t_bf16 = timed(lambda: x @ w.t(), reps, cuda)
    t_kernel = timed(lambda: fp8_linear(x8, sx, w8, sw), reps, cuda)
    t_fp8 = timed(lambda: fp8_linear(*quantize_rows(x), w8, sw), reps, cuda)
    flops = 2 * m * k * n
    return {"name": "fp8_matmul", "proj": name, "k": k, "n": n, "tokens": m,
            "bf16_ms": round(t_bf16 * 1e3, 4), "fp8_kernel_ms": round(t_kernel * 1e3, 4),
            "fp8_with_quant_ms": round(t_fp8 * 1e3, 4), "speedup_kernel": round(t_bf16 / t_kernel, 3),
            "speedup_with_quant": round(t_bf16 / t_fp8, 3), "bf16_tflops": round(flops / t_bf16 / 1e12, 1),
            "err_bf16": rel_err(x @ w.t(), ref), "err_fp8": rel_err(fp8_linear(x8, sx, w8, sw), ref),
            "weight_mib_bf16": round(n * k * 2 / 2**20, 1), "weight_mib_fp8": round(n * k * 1.0 / 2**20 + n * 4 / 2**20, 1)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="also write the JSON lines here")
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args(argv)
    if a.reps < 1:
        sys.exit(f"error: --reps must be at least 1, got {a.reps}")
    if a.out and not os.path.isdir(os.path.dirname(os.path.abspath(a.out))):
        sys.exit(f"error: --out {a.out}: no folder {os.path.dirname(os.path.abspath(a.out))}")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    shapes, tokens = (SHAPES_7B, TOKENS) if device == "cuda" else ({"q": (64, 64), "down": (128, 64)}, (8,))
    rows = []
    for m in tokens:
        total = {"bf16_ms": 0.0, "fp8_with_quant_ms": 0.0, "fp8_kernel_ms": 0.0}
        for name, (k, n) in shapes.items():
            try:
                r = measure(name, k, n, m, a.reps, device)
            except RuntimeError as e:  # e.g. a GPU without FP8 matmuls (before Hopper / Ada)
                sys.exit(f"error: FP8 matmul of {name} ({m} x {k} x {n}) on {device}: {str(e).splitlines()[0]}")
            rows.append(r)
            print(json.dumps(r), flush=True)
            for key in total:
                total[key] += r[key]
        s = {"name": "fp8_matmul_layer", "tokens": m, "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
             "torch": torch.__version__, **{k: round(v, 4) for k, v in total.items()},
             "layer_speedup_with_quant": round(total["bf16_ms"] / total["fp8_with_quant_ms"], 3),
             "layer_speedup_kernel": round(total["bf16_ms"] / total["fp8_kernel_ms"], 3)}
        rows.append(s)
        print(json.dumps(s), flush=True)
    if a.out:
        with open(a.out, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
