"""Decode attention over the KV cache: the old gather + SDPA path vs the Triton kernel.

    python bench/decode_attention.py [--save]      # CUDA only

The old path is what kernels/attention.py ran on torch 2.11 without
flash_attn: `_sdpa_decode(q, k_cache[rows], v_cache[rows], kv_lens)`, which
copies each row's whole slot (all L positions) and runs masked SDPA. The new
one is `triton_decode.decode_attention`, which reads only each row's kv_len
keys in place. One layer, one decode step, bf16; both run as the generator
runs them, inside a CUDA graph (--iters calls per graph, so Python launch cost
is out); the time is the median over --reps replays divided by --iters.
kv_lens are uniform in [350, 450] (~400) unless the case says otherwise;
rows are a random permutation of the slots. The last case has few rows, so
the kernel splits each row's keys over several programs (split-K); it is also
timed with one split. `kernel_gbps` counts the K/V bytes the kernel must read.
Prints one JSON object per case; --save also writes them to
bench/results/decode_attention.json.
"""
import argparse
import datetime
import json
import os
import statistics
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from kernels.attention import _sdpa_decode, triton_decode  # noqa: E402

CASES = [  # B, Hq, Hkv, D, L, (kv_len lo, hi)
    (256, 16, 2, 128, 512, (350, 450)),   # Qwen2.5-3B
    (256, 16, 2, 128, 2048, (350, 450)),
    (256, 9, 3, 64, 2048, (350, 450)),    # SmolLM2-135M
    (16, 16, 2, 128, 2048, (1400, 1600)),  # tail of a rollout: few long rows
]


def graph_ms(fn, iters, reps):
    """Median ms of one fn() call, from replays of a CUDA graph holding `iters` calls."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()  # warm-up: Triton compilation, cuDNN/flash selection
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(iters):
            fn()
    graph.replay()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / iters)
    return statistics.median(times)


def run_case(B, hq, hkv, d, L, kv_range, iters, reps):
    g = torch.Generator().manual_seed(0)
    S = B + 1
    kc, vc = (torch.randn(S, L, hkv, d, generator=g).to("cuda", torch.bfloat16) for _ in range(2))
    q = torch.randn(B, hq, d, generator=g).to("cuda", torch.bfloat16)
    rows = torch.randperm(S, generator=g)[:B].cuda()
    lens = torch.randint(kv_range[0], kv_range[1] + 1, (B,), generator=g, dtype=torch.int32).cuda()

    def old():
        return _sdpa_decode(q, kc[rows], vc[rows], lens)

    def new(splits=None):
        return triton_decode.decode_attention(q, kc, vc, rows, lens, splits=splits)

    splits = triton_decode.pick_splits(B * hkv, L, q.device)
    old_ms, new_ms = graph_ms(old, iters, reps), graph_ms(new, iters, reps)
    one_split_ms = graph_ms(lambda: new(splits=1), iters, reps) if splits > 1 else None
    kv_bytes = lens.sum().item() * hkv * d * 2 * kc.element_size()
    return {
        "name": "decode_attention",
        "B": B, "Hq": hq, "Hkv": hkv, "D": d, "L": L, "kv_len_mean": round(lens.float().mean().item(), 1),
        "sdpa_gather_ms": round(old_ms, 4),
        "triton_ms": round(new_ms, 4),
        "speedup": round(old_ms / new_ms, 2),
        "splits": splits,
        "triton_one_split_ms": None if one_split_ms is None else round(one_split_ms, 4),
        "kernel_gbps": round(kv_bytes / new_ms / 1e6, 1),
        "max_abs_diff": (old().float() - new().float()).abs().max().item(),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": getattr(sys.modules.get("triton"), "__version__", None),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=20, help="calls per CUDA graph")
    parser.add_argument("--reps", type=int, default=10, help="graph replays timed")
    parser.add_argument("--save", action="store_true", help="write bench/results/decode_attention.json")
    args = parser.parse_args()
    if not torch.cuda.is_available() or triton_decode is None:
        print("bench/decode_attention.py: needs CUDA and triton; nothing to measure here")
        return
    lines = []
    for case in CASES:
        lines.append(json.dumps(run_case(*case, args.iters, args.reps)))
        print(lines[-1], flush=True)
    if args.save:
        path = os.path.join(ROOT, "bench", "results", "decode_attention.json")
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
