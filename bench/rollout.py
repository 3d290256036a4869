"""Rollout throughput: our KV-cache generator vs Hugging Face `generate`, same run, same inputs.

Random-weight models of the Qwen2.5-3B and SmolLM2-135M shapes (speed does
not depend on weight values), bf16, batch 64 and 256, 256 prompt tokens and
256 new tokens (forced: no stop), temperature 1. Prints one JSON object per
measurement: new tokens/s for both, the ratio, and our fraction of the
roofline of the decode phase (weights + KV bytes read per step over the
measured copy bandwidth, FLOPs over the measured bf16 matmul rate).

    python bench/rollout.py [--models 3b,135m] [--batches 64,256] [--save [PATH]] [--no-peer]
    python bench/rollout.py --models 3b --batches 256 --lora 16   # the LoRA generator's decode: adapters vs none
    python bench/rollout.py --eager-ops ...    # without the fused elementwise ops (kernels.compile=false)
    python bench/rollout.py --no-graphs ...    # decode without CUDA graphs
    python bench/rollout.py --kernels fuse=false ...   # any key of config section kernels (bench/kernels_flag.py)
"""
import argparse
import datetime
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench import kernels_flag  # noqa: E402
from r1.generate import Generator, Sampling  # noqa: E402
from r1.model import ModelConfig, Transformer, paths_in_use, use_ops  # noqa: E402

SHAPES = {
    "3b": ModelConfig(arch="qwen2", vocab_size=151936, hidden_size=2048, intermediate_size=11008, num_layers=36,
                      num_heads=16, num_kv_heads=2, head_dim=128, rope_theta=1e6, rms_eps=1e-6, tie_embeddings=True,
                      qkv_bias=True),
    "7b": ModelConfig(arch="qwen2", vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_layers=28,
                      num_heads=28, num_kv_heads=4, head_dim=128, rope_theta=1e6, rms_eps=1e-6, tie_embeddings=False,
                      qkv_bias=True),
    "14b": ModelConfig(arch="qwen2", vocab_size=152064, hidden_size=5120, intermediate_size=13824, num_layers=48,
                       num_heads=40, num_kv_heads=8, head_dim=128, rope_theta=1e6, rms_eps=1e-6, tie_embeddings=False,
                       qkv_bias=True),
    "135m": ModelConfig(arch="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30,
                        num_heads=9, num_kv_heads=3, head_dim=64, rope_theta=1e5, rms_eps=1e-5, tie_embeddings=True),
}

GRAPHS = True  # --no-graphs: decode without CUDA graphs
GEN: dict = {}  # --kernels: the Generator's own switches


def measure_ceilings():
    """Copy bandwidth (bytes/s) and bf16 matmul rate (FLOP/s) on this GPU, measured now."""
    x = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(10):
        y.copy_(x)
    torch.cuda.synchronize()
    bw = 2 * x.numel() * 10 / (time.perf_counter() - t)
    del x, y
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(20):
        a @ b
    torch.cuda.synchronize()
    flops = 2 * 8192**3 * 20 / (time.perf_counter() - t)
    return bw, flops


def separate_lora_forward(self, x):
    """LoRALinear's forward before the addmm epilogue (out + (x A^T B^T * scale)): the --lora baseline."""
    out = torch.nn.functional.linear(x, self.weight, self.bias)
    h = torch.nn.functional.linear(torch.nn.functional.linear(x, self.lora_A), self.lora_B)
    return out + (h * self.scale).to(out.dtype)


def ours(cfg, batch, prompt_len, new, seed=0, lora=0, variant="plain"):
    """variant (with lora > 0, rank-`lora` adapters on every projection, random B, as a LoRA generator holds
    them): plain (no adapters: the merged generator), unfused (no adapters, projections unfused as a LoRA
    model's stay), adapters (r1/lora.py), separate (adapters, the previous forward: matmul, scale, add)."""
    from r1 import lora as L

    torch.manual_seed(seed)
    with torch.device("cuda"):
        model = Transformer(cfg)
        if variant in ("adapters", "separate"):
            L.add_adapters(model, lora, float(lora), L.TARGETS)
            for name, p in model.named_parameters():
                if name.endswith("lora_B"):
                    torch.nn.init.normal_(p, std=0.01)
        model = model.to(torch.bfloat16).eval().requires_grad_(False)  # generation only: fused projections
    prompts = torch.randint(100, cfg.vocab_size - 100, (batch, prompt_len)).tolist()
    forward = L.LoRALinear.forward
    if variant == "separate":
        L.LoRALinear.forward = separate_lora_forward
    gen = Generator(model, slots=batch, max_len=prompt_len + new + 8, cuda_graphs=GRAPHS, sync_every=32,
                    **{**GEN, **({"fuse": False} if variant == "unfused" else {})})
    s = Sampling(temperature=1.0, seed=seed)
    gen.generate(prompts, 8, s)  # warm-up: prefill + graph capture
    torch.cuda.synchronize()
    t = time.perf_counter()
    out = gen.generate(prompts, new, s)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t
    n = sum(len(c.token_ids) for c in out)
    # decode-only timing: prefill separately
    torch.cuda.synchronize()
    t = time.perf_counter()
    gen.generate(prompts, 1, s)
    torch.cuda.synchronize()
    t_prefill = time.perf_counter() - t
    nparams = sum(p.numel() for p in model.parameters())
    L.LoRALinear.forward = forward
    del gen, model
    torch.cuda.empty_cache()
    return n, dt, t_prefill, nparams


def peer(cfg, batch, prompt_len, new, seed=0):
    import transformers

    torch.manual_seed(seed)
    hf_cfg = transformers.AutoConfig.for_model(**cfg.to_hf())
    hf_cfg._attn_implementation = "sdpa"
    model = transformers.AutoModelForCausalLM.from_config(hf_cfg).to("cuda", torch.bfloat16).eval()
    ids = torch.randint(100, cfg.vocab_size - 100, (batch, prompt_len), device="cuda")
    att = torch.ones_like(ids)
    kw = dict(max_new_tokens=new, min_new_tokens=new, do_sample=True, temperature=1.0, top_p=1.0, pad_token_id=0)
    model.generate(ids, attention_mask=att, max_new_tokens=8, min_new_tokens=8, do_sample=True, pad_token_id=0)
    torch.cuda.synchronize()
    t = time.perf_counter()
    out = model.generate(ids, attention_mask=att, **kw)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t
    n = batch * (out.shape[1] - prompt_len)
    del model
    torch.cuda.empty_cache()
    return n, dt


def roofline(cfg, nparams, batch, prompt_len, new, bw, peak):
    """Floor on decode time for `new` steps: max(bytes/bw, flops/peak) per step, summed."""
    kv_per_tok = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 2  # K and V, bf16
    total = 0.0
    for i in range(new):
        ctx = prompt_len + i
        bytes_ = 2 * nparams + batch * ctx * kv_per_tok
        flops = 2 * nparams * batch + 4 * batch * ctx * cfg.num_heads * cfg.head_dim * cfg.num_layers
        total += max(bytes_ / bw, flops / peak)
    return total


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--models", default="3b,135m")
    p.add_argument("--batches", default="64,256")
    p.add_argument("--prompt", type=int, default=256)
    p.add_argument("--new", type=int, default=256)
    p.add_argument("--no-peer", action="store_true")
    p.add_argument("--lora", type=int, default=0, help="rank: measure the LoRA generator's decode instead (variants "
                   "plain, unfused, adapters, separate; see ours()), same run, no peer")
    p.add_argument("--save", nargs="?", const="bench/results/rollout.json", default=None,
                   help="write the results as JSON (default path bench/results/rollout.json)")
    p.add_argument("--eager-ops", action="store_true", help="eager elementwise ops (kernels.compile=false)")
    p.add_argument("--no-graphs", action="store_true", help="decode without CUDA graphs")
    kernels_flag.add(p)
    a = p.parse_args()
    global GRAPHS
    GRAPHS = not a.no_graphs
    k = kernels_flag.use(a.kernels)
    GEN.update(kernels_flag.generator(k))
    if a.eager_ops:
        use_ops("false")
    import transformers

    bw, peak = measure_ceilings()
    env = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "transformers": transformers.__version__,
           "date": datetime.date.today().isoformat(), "copy_bw_GBps": round(bw / 1e9), "bf16_tflops": round(peak / 1e12),
           "sample_path": "triton", "decode_attention": "triton", "cuda_graphs": GRAPHS,
           "kernels": kernels_flag.words(k), **paths_in_use(torch.cuda.is_available(), GEN.get("fuse"))}
    print(json.dumps({"name": "ceilings", **env}), flush=True)
    results = []
    for m in a.models.split(","):
        cfg = SHAPES[m]
        for b in map(int, a.batches.split(",")):
            if a.lora:
                base = None
                for variant in ("plain", "unfused", "adapters", "separate"):
                    n, dt, t_pre, _ = ours(cfg, b, a.prompt, a.new, lora=a.lora, variant=variant)
                    base = base or n / dt
                    r = {"name": "rollout_lora", "model": f"{m}-shape", "batch": b, "lora_rank": a.lora,
                         "variant": variant, "ours_tok_s": round(n / dt), "ours_s": round(dt, 3),
                         "vs_plain": round(n / dt / base, 3), **env}
                    print(json.dumps(r), flush=True)
                    results.append(r)
                continue
            n, dt, t_pre, nparams = ours(cfg, b, a.prompt, a.new)
            r = {"name": "rollout", "model": f"{m}-shape", "batch": b, "prompt": a.prompt, "new": a.new,
                 "ours_tok_s": round(n / dt), "ours_s": round(dt, 3), "ours_prefill_s": round(t_pre, 3)}
            floor = roofline(cfg, nparams, b, a.prompt, a.new, bw, peak)
            r["roofline_fraction"] = round(floor / max(dt - t_pre, 1e-9), 3)
            if not a.no_peer:
                pn, pdt = peer(cfg, b, a.prompt, a.new)
                r.update(peer_tok_s=round(pn / pdt), peer_s=round(pdt, 3), ratio=round((n / dt) / (pn / pdt), 2))
            r.update(env)
            print(json.dumps(r), flush=True)
            results.append(r)
    if a.save:
        os.makedirs(os.path.dirname(a.save) or ".", exist_ok=True)
        with open(a.save, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
