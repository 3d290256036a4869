"""LoRA against full fine-tuning on one GPU host: peak memory and iteration time of the real trainer.

    python bench/lora.py --shapes 7b,14b --ranks 16 --gpus 1 --tokenizer .stage/smol_tok \
        --out bench/results/lora.json
    python bench/lora.py --shapes tiny --ranks 0,4 --steps 2 --cpu      # a dry run of the harness on a CPU

Each run is `train.py` (torchrun with --gpus > 1) in its own process, so one
that runs out of memory is recorded (completed false) and the next starts on
a clean GPU: PPO with a critic (step-level GAE) and a reference (algo.kl_coef
0.01) at configs/gsm8k_tool.yaml's batch (64 prompts x 8 samples, up to 6
turns of 192 tokens), no SFT phase, every memory key left to the plan,
nothing saved (run.save false: one checkpoint of the 3B shape trained in
full is 64 GiB). The models are random weights of Qwen2.5 shapes
(bench/random_model.py: speed and memory do not depend on the values;
SmolLM2's vocabulary, so the tokenizer fits), written per shape unless
--models holds the folder already (a folder this command wrote is removed
after its shape's runs); rank 0 is full fine-tuning, the peer measured in
the same job. A random policy writes the longest
responses, so this is the heavy end of an iteration.

One JSON object per run, a line each, printed and appended to --out: name
"lora", model, lora_rank, gpus, peak_gib (torch's max allocated on rank 0,
null on the CPU), iteration_s (mean over iterations after the first, which
captures CUDA graphs; the first alone if there is one), first_iteration_s,
completed (every iteration logged), the memory plan line, device, versions
and date. Nothing is written without a run behind it.
"""
import argparse
import datetime
import json
import os
import platform
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def overrides(shape: str, model_dir: str | None, tok: str | None, rank: int, steps: int, run_dir: str,
              cpu: bool, generator: str = "adapters") -> list:
    """train.py arguments of one run (generator: model.lora_generator, for rank > 0)."""
    args = ["--config", os.path.join(ROOT, "configs", "gsm8k_tool.yaml"),  # the first recipe, as it was measured
            "--config", os.path.join(ROOT, "configs", "ablations", "first_recipe.yaml"), f"run.dir={run_dir}",
            f"model.lora_rank={rank}", f"model.lora_generator={generator}", "train.sft_steps=0", "algo.advantage=step_gae", "algo.kl_coef=0.01",
            f"train.steps={steps}", "run.save=false", "eval.every=0", "log.progress=false",
            "log.trajectories=false", "log.tensorboard=false"]
    if shape == "tiny":
        args += ["model.path=tiny", "model.tokenizer=" + (tok or "smollm2-135m-instruct")]
    else:
        args += [f"model.path={model_dir}", f"model.tokenizer={tok}"]
    if cpu:  # the harness itself, in minutes: a small batch, short turns
        args += ["run.device=cpu", "rollout.prompts=2", "rollout.n=2", "rollout.max_new_tokens=8", "env.max_steps=2",
                 "data.train_size=16"]
    return args


def summarize(run_dir: str, steps: int) -> dict:
    """peak_gib, iteration_s, first_iteration_s, rollout_tok_s and train_tok_s (means over the iterations after
    the first, as iteration_s), completed, from a run's metrics.jsonl."""
    path = os.path.join(run_dir, "metrics.jsonl")
    lines = []
    if os.path.isfile(path):
        with open(path) as f:
            lines = [json.loads(x) for x in f if x.strip()]
    times = [sum(m.get(k, 0.0) for k in ("time_rollout", "time_score", "time_train", "time_other")) for m in lines]
    later = times[1:] or times[:1]
    rest = lines[1:] or lines[:1]

    def mean(key):
        xs = [m[key] for m in rest if key in m]
        return round(sum(xs) / len(xs)) if xs else None

    peaks = [m["peak_mem_gb"] for m in lines if "peak_mem_gb" in m]
    return {"peak_gib": round(max(peaks), 2) if peaks else None,
            "iteration_s": round(sum(later) / len(later), 3) if later else None,
            "first_iteration_s": round(times[0], 3) if times else None,
            "rollout_tok_s": mean("rollout_tok_s"), "train_tok_s": mean("train_tok_s"),
            "completed": len(lines) == steps}


def environment() -> dict:
    import torch

    dev = torch.cuda.get_device_name(0) if torch.cuda.is_available() else platform.processor() or "cpu"
    return {"device": dev, "torch": torch.__version__, "python": platform.python_version(),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="3b,7b,14b", help="bench/rollout.py SHAPES names, or tiny (CPU dry run)")
    p.add_argument("--ranks", default="0,16", help="model.lora_rank values; 0 = full fine-tuning (the peer)")
    p.add_argument("--generators", default="adapters", help="model.lora_generator values tried for each rank > 0")
    p.add_argument("--gpus", type=int, default=1)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--tokenizer", default=None, help="an HF tokenizer folder (needed for the random models)")
    p.add_argument("--models", default="/tmp/r1-lora-models", help="where the random model folders go")
    p.add_argument("--runs", default="/tmp/r1-lora-runs")
    p.add_argument("--out", default=None, help="append each run's JSON line to this file")
    p.add_argument("--cpu", action="store_true", help="run on the CPU with a small batch (checks the harness)")
    p.add_argument("--timeout", type=int, default=3600, help="seconds a run may take")
    p.add_argument("--keep-models", action="store_true",
                   help="keep the random model folders this command writes (default: each removed after its shape's "
                   "runs; 14B is 29.5 GB; a folder that was there before is never removed)")
    a = p.parse_args(argv)
    os.makedirs(a.runs, exist_ok=True)
    for shape in a.shapes.split(","):
        model_dir, made = None, False
        if shape != "tiny":
            if not a.tokenizer:
                p.error("--tokenizer is needed for the random model shapes")
            model_dir = os.path.join(a.models, shape)
            if not os.path.isfile(os.path.join(model_dir, "config.json")):
                made = True
                subprocess.run([sys.executable, os.path.join(ROOT, "bench", "random_model.py"), "--shape", shape,
                                "--tokenizer", a.tokenizer, "--out", model_dir], check=True)
        runs = [(rank, gen) for rank in map(int, a.ranks.split(","))
                for gen in (a.generators.split(",") if rank else ["adapters"])]
        for rank, gen in runs:
            run_dir = os.path.join(a.runs, f"{shape}-r{rank}-g{a.gpus}" + (f"-{gen}" if gen != "adapters" else ""))
            subprocess.run(["rm", "-rf", run_dir], check=True)
            args = overrides(shape, model_dir, a.tokenizer, rank, a.steps, run_dir, a.cpu, gen)
            launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={a.gpus}"] \
                if a.gpus > 1 else [sys.executable]
            log = run_dir + ".log"
            with open(log, "w") as f:
                try:
                    rc = subprocess.run(launch + [os.path.join(ROOT, "train.py"), *args], cwd=ROOT, stdout=f,
                                        stderr=subprocess.STDOUT, timeout=a.timeout).returncode
                except subprocess.TimeoutExpired:
                    rc = "timeout"
            with open(log, errors="replace") as f:
                text = f.read()
            plan = next((x for x in text.splitlines() if x.startswith("memory plan")), None)
            r = {"name": "lora", "model": f"{shape}-shape", "lora_rank": rank, "lora_generator": gen if rank else None,
                 "gpus": a.gpus,
                 **summarize(run_dir, a.steps), "exit": rc, "memory_plan": plan, **environment()}
            if rc != 0:
                r["error"] = (text.strip().splitlines() or ["(no output)"])[-1][:300]
            line = json.dumps(r)
            print(line, flush=True)
            if a.out:
                with open(a.out, "a") as f:
                    f.write(line + "\n")
        if made and not a.keep_models:  # only a folder this command wrote
            subprocess.run(["rm", "-rf", model_dir], check=True)


if __name__ == "__main__":
    main()
