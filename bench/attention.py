"""Issue 34: FlashAttention-4 (`fa4`, flash_attn.cute) against today's attention path, measured in one run.

    python bench/attention.py [--out PATH]          # the kernels alone (CUDA); JSON lines on stdout
    python bench/attention.py --collect DIR [--out bench/results/attention.json]
    python bench/attention.py --cpu-check           # the CPU: the timing code on tiny cases, nothing written

Kernels (bf16, causal, packed, one layer): 48 sequences of 64..2,047 tokens (uniform, seeded) with the
heads of the issue (16 q / 2 kv, head dim 128: Qwen2.5-3B's, the 3B shape of the benches), of SmolLM2-135M
(9 / 3, 64) and of Qwen3-4B (32 / 8, 128); forward, and forward + backward. Backends, each through
kernels.attention.varlen_attention as the model calls it:
  fa4          flash_attn.cute.flash_attn_varlen_func, native GQA
  torch_flash  torch's varlen_attn, K/V repeated for GQA on torch 2.11: the baseline (today's path)
  flash_attn   FlashAttention-2, where installed
  sdpa         per-sequence F.scaled_dot_product_attention(is_causal=True, enable_gqa=True), a loop
Reads of the KV cache, fa4 through a page table (kernels.fa4_cache=true) against today's Triton kernels, both
inside a CUDA graph as the generator runs them (bench/decode_attention.py's timing; eager if fa4 cannot be
captured): a decode step (one query per row, 256 rows, kv_len uniform in 350..450, slots of 2,048) against
triton_decode, and an appended chunk (64 rows of 16..128 new tokens after prefixes of 300..600) against
triton_chunk.
Times are medians over --reps of --iters calls, after warm-up (fa4 compiles its kernels on the first call:
`first_call_s`).

--collect DIR turns the logs of the fa4 job (bench/device.py fa4) (train step, agent loop, logprob gap, each with and
without fa4) and DIR/kernels.json into bench/results/attention.json: one object per measurement with
name 'attention', what, backend, seconds, baseline_backend, baseline_seconds.
"""
import argparse
import datetime
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from kernels import attention as A  # noqa: E402

HEADS = [(16, 2, 128, "16q/2kv hd128 (Qwen2.5-3B)"), (9, 3, 64, "9q/3kv hd64 (SmolLM2-135M)"),
         (32, 8, 128, "32q/8kv hd128 (Qwen3-4B)")]
BASELINE = "torch_flash"


def env():
    e = {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu", "torch": torch.__version__,
         "date": datetime.date.today().isoformat()}
    if A.fa4_varlen_func is not None:
        from importlib.metadata import version
        e["flash_attn_4"] = A.fa4_version()
        e["nvidia_cutlass_dsl"] = version("nvidia-cutlass-dsl")
    return e


def batch(hq, hkv, d, n_seq=48, lo=64, hi=2047, device="cuda", dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(lo, hi + 1, (n_seq,), generator=g)
    n = int(lens.sum())
    q, k, v = (torch.randn(n, h, d, generator=g).to(device, dtype) for h in (hq, hkv, hkv))
    cu = torch.zeros(n_seq + 1, dtype=torch.int32)
    cu[1:] = lens.cumsum(0)
    return q, k, v, cu.to(device), int(lens.max())


def sdpa_loop(q, k, v, cu, max_seqlen):
    """The peer without a varlen kernel: one causal SDPA call per sequence, GQA without copies."""
    out = torch.empty_like(q)
    bounds = cu.tolist()
    for s, e in zip(bounds[:-1], bounds[1:]):
        out[s:e] = F.scaled_dot_product_attention(q[s:e].transpose(0, 1), k[s:e].transpose(0, 1),
                                                  v[s:e].transpose(0, 1), is_causal=True,
                                                  enable_gqa=True).transpose(0, 1)
    return out


def backends():
    names = []
    if A.fa4_varlen_func is not None and torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9:
        names.append("fa4")
    if A.varlen_attn is not None and torch.cuda.is_available():
        names.append("torch_flash")
    if A.flash_attn_varlen_func is not None:
        names.append("flash_attn")
    names.append("sdpa")
    if not torch.cuda.is_available():
        names.append("math")  # the CPU check: kernels.attention's reference loop
    return names


def call(backend):
    if backend == "sdpa":
        return sdpa_loop
    return lambda q, k, v, cu, mx: A.varlen_attention(q, k, v, cu, mx, backend=backend)


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn, iters, reps):
    """(median seconds of one call, seconds of the first call): wall clock around `iters` calls, synced."""
    sync()
    t = time.perf_counter()
    fn()
    sync()
    first = time.perf_counter() - t
    fn()
    times = []
    for _ in range(reps):
        sync()
        t = time.perf_counter()
        for _ in range(iters):
            fn()
        sync()
        times.append((time.perf_counter() - t) / iters)
    return statistics.median(times), first


def kernel_cases(a, device):
    rows = []
    for hq, hkv, d, label in HEADS:
        q, k, v, cu, mx = batch(hq, hkv, d, device=device, **a.batch)
        dout = torch.randn_like(q)
        what = f"{len(cu) - 1} sequences of {a.batch.get('lo', 64)}-{a.batch.get('hi', 2047)} tokens " \
               f"({int(cu[-1])} tokens), {label}, bf16"
        for mode in ("fwd", "fwd+bwd"):
            res = {}
            for b in backends():
                f = call(b)
                if mode == "fwd":
                    def run(f=f):
                        with torch.no_grad():
                            f(q, k, v, cu, mx)
                else:
                    qg, kg, vg = (t.detach().clone().requires_grad_() for t in (q, k, v))

                    def run(f=f, qg=qg, kg=kg, vg=vg):
                        f(qg, kg, vg, cu, mx).backward(dout)
                try:
                    res[b] = timed(run, a.iters, a.reps)
                except Exception as e:  # a backend that cannot take this shape: say so, measure the others
                    res[b] = None
                    print(json.dumps({"name": "attention", "what": f"{mode} {what}", "backend": b,
                                      "error": f"{type(e).__name__}: {str(e)[:200]}"}), flush=True)
            base = res.get(BASELINE) or res.get("sdpa")
            base_name = BASELINE if res.get(BASELINE) else "sdpa"
            for b, r in res.items():
                if r is None or b == base_name:
                    continue
                rows.append({"name": "attention", "what": f"{mode}, {what}", "backend": b, "seconds": round(r[0], 6),
                             "baseline_backend": base_name, "baseline_seconds": round(base[0], 6),
                             "speedup": round(base[0] / r[0], 2), "first_call_s": round(r[1], 3),
                             "baseline_first_call_s": round(base[1], 3)})
                print(json.dumps(rows[-1]), flush=True)
    return rows


def cache_case(a, chunk):
    """fa4 reading the cache through its page table vs today's Triton kernel, one step of one layer.

    chunk False: a decode step (one query per row, 256 rows, kv_len 350-450) against triton_decode.
    chunk True: an appended chunk (64 rows of 16-128 new tokens after a prefix of 300-600, the tool
    results of the agent loop) against triton_chunk."""
    from bench.decode_attention import graph_ms  # noqa: E402
    B, hq, hkv, d, L = (64 if chunk else 256), 16, 2, 128, 2048
    g = torch.Generator().manual_seed(0)
    kc, vc = (torch.randn(B, L, hkv, d, generator=g).to("cuda", torch.bfloat16) for _ in range(2))
    rows = torch.randperm(B, generator=g).cuda()
    if chunk:
        n_new = torch.randint(16, 129, (B,), generator=g)
        lens = (torch.randint(300, 601, (B,), generator=g) + n_new).to(torch.int32).cuda()
        what = (f"appended chunk against the KV cache, {B} rows of 16-128 new tokens ({int(n_new.sum())}) after "
                f"prefixes of 300-600, slots of {L}, 16q/2kv hd128, bf16")
    else:
        n_new = torch.ones(B, dtype=torch.long)
        lens = torch.randint(350, 451, (B,), generator=g, dtype=torch.int32).cuda()
        what = f"decode step against the KV cache, {B} rows, kv_len 350-450, slots of {L}, 16q/2kv hd128, bf16"
    cu = torch.cat([torch.zeros(1, dtype=torch.long), n_new.cumsum(0)]).to(torch.int32).cuda()
    q = torch.randn(int(n_new.sum()), hq, d, generator=g).to("cuda", torch.bfloat16)
    max_q, base = int(n_new.max()), ("triton_chunk" if chunk else "triton")
    res = {}
    for b in ("fa4", base):
        def run(b=b):
            A.cache_attention(q, kc, vc, cu, max_q, rows, lens, backend=b)
        t = time.perf_counter()
        run()
        sync()
        first = time.perf_counter() - t
        try:
            res[b] = (graph_ms(run, a.iters, a.reps) / 1e3, first, "cuda graph")
        except Exception as e:  # fa4 not capturable: eager, and say why
            res[b] = (timed(run, a.iters, a.reps)[0], first, f"eager ({type(e).__name__}: {str(e)[:120]})")
    r = {"name": "attention", "what": what, "backend": "fa4", "seconds": round(res["fa4"][0], 7),
         "baseline_backend": base, "baseline_seconds": round(res[base][0], 7),
         "speedup": round(res[base][0] / res["fa4"][0], 2), "first_call_s": round(res["fa4"][1], 3),
         "timing": res["fa4"][2], "baseline_timing": res[base][2]}
    print(json.dumps(r), flush=True)
    return [r]


def last_json(path, name):
    """The last JSON object named `name` in a log (the benches print one line each), else None."""
    if not os.path.exists(path):
        return None
    found = None
    for line in open(path, errors="replace"):
        line = line.strip()
        if line.startswith("{"):
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if obj.get("name") == name:
                found = obj
    return found


def collect(d):
    """The objects of the fa4 job's runs in d (bench/device.py fa4): kernels.json, then each pair of logs (with fa4, without)."""
    rows = json.load(open(os.path.join(d, "kernels.json"))) if os.path.exists(os.path.join(d, "kernels.json")) else []
    base_label = "torch_flash+triton (kernels.fa4=false: today's path)"

    def pair(what, backend, new, old, key, **extra):
        if new is None or old is None or new.get(key) is None or old.get(key) is None:
            return
        rows.append({"name": "attention", "what": what, "backend": backend, "seconds": new[key],
                     "baseline_backend": base_label, "baseline_seconds": old[key],
                     "speedup": round(old[key] / new[key], 3), **extra})

    old = last_json(os.path.join(d, "train-base.log"), "train_step")
    new = last_json(os.path.join(d, "train-fa4.log"), "train_step")
    if new and old:
        pair(f"PPO train step, {new.get('model')} (bench/train_step.py: {new.get('sequences')} sequences, "
             f"{new.get('useful_tokens')} tokens, AdamW)", "fa4 (kernels.attention=fa4)", new, old, "ours_s",
             tok_s=new.get("ours_tok_s"), baseline_tok_s=old.get("ours_tok_s"), peak_gb=new.get("ours_peak_gb"),
             baseline_peak_gb=old.get("ours_peak_gb"))
    old = last_json(os.path.join(d, "agent-base.log"), "agent_rollout")
    for tag, backend in (("fa4", "fa4 (first prompts; cache reads on Triton)"),
                         ("fa4cache", "fa4 (first prompts and cache reads: kernels.fa4_cache=true)")):
        new = last_json(os.path.join(d, f"agent-{tag}.log"), "agent_rollout")
        if new and old:
            gap = {k: new.get(k) for k in ("logprob_gap_mean", "logprob_gap_max")}
            gap.update({"baseline_" + k: old.get(k) for k in ("logprob_gap_mean", "logprob_gap_max")})
            pair(f"single-turn engine, {new.get('model')} (bench/agent_rollout.py)", backend, new, old,
                 "single_turn_s", tok_s=new.get("single_turn_tok_s"), baseline_tok_s=old.get("single_turn_tok_s"))
            pair(f"agent loop, {new.get('model')} (bench/agent_rollout.py, {new.get('episodes')} episodes)", backend,
                 new, old, "agent_s", tok_s=new.get("agent_tok_s"), baseline_tok_s=old.get("agent_tok_s"), **gap)
    old = last_json(os.path.join(d, "gap-base.log"), "logprob_gap")
    new = last_json(os.path.join(d, "gap-fa4.log"), "logprob_gap")
    if new and old:  # no time: the gap itself, both ways
        rows.append({"name": "attention", "what": f"sampler-trainer logprob gap, {new.get('model')} "
                     f"(bench/logprob_gap.py, {new.get('tokens')} tokens)", "backend": "fa4", "seconds": None,
                     "baseline_backend": base_label, "baseline_seconds": None,
                     **{k: new.get(k) for k in ("gap_mean", "gap_max", "gap_p99")},
                     **{"baseline_" + k: old.get(k) for k in ("gap_mean", "gap_max", "gap_p99")}})
    return rows


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=None, help="write the objects as a JSON list here")
    p.add_argument("--collect", default=None, metavar="DIR", help="gather the fa4 job's runs in DIR (bench/device.py fa4)")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--no-decode", action="store_true", help="no cache cases (decode step, appended chunk)")
    p.add_argument("--cache-only", action="store_true", help="the cache cases alone")
    p.add_argument("--cpu-check", action="store_true", help="tiny cases on the CPU through the same code; no file")
    a = p.parse_args()
    e = env()
    if a.collect:
        rows = collect(a.collect)
        if not rows:
            sys.exit(f"bench/attention.py: nothing to collect in {a.collect}")
    elif a.cpu_check:
        a.batch = {"n_seq": 3, "lo": 2, "hi": 9}
        a.iters, a.reps = 1, 1
        rows = kernel_cases(a, "cpu")
        print(json.dumps({"name": "attention_cpu_check", "rows": len(rows), "backends": backends()}))
        return
    elif not torch.cuda.is_available():
        print("bench/attention.py: no CUDA here, nothing measured (--cpu-check runs the code on tiny cases)")
        return
    else:
        a.batch = {}
        rows = [] if a.cache_only else kernel_cases(a, "cuda")
        for chunk in ((False, True) if "fa4" in backends() and not a.no_decode else ()):
            try:
                rows += cache_case(a, chunk)
            except Exception as e:  # fa4 cannot read this cache: a finding, and the kernel rows still count
                print(json.dumps({"name": "attention", "what": f"{'chunk' if chunk else 'decode step'} against the "
                                  "KV cache", "backend": "fa4", "error": f"{type(e).__name__}: {str(e)[:200]}"}),
                      flush=True)
    rows = [{**r, **{k: v for k, v in e.items() if k not in r}} for r in rows]
    if a.out:
        os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
        with open(a.out, "w") as f:
            json.dump(rows, f, indent=1)
        print(f"wrote {len(rows)} objects to {a.out}")


if __name__ == "__main__":
    main()
