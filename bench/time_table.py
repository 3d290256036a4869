"""Where a recipe run's time goes: one table row per run folder, from the files the run wrote.

    python bench/time_table.py RUN [RUN ...] [--peak-tflops 989] [--json OUT]

Reads RUN/metrics.jsonl (per-iteration timers), RUN/sft/metrics.jsonl (SFT tokens/s) and, where the run was
launched with its output time-stamped (`RUN/../train.log`, lines "EPOCH text"), the wall time of each phase of
the command. MFU counts 6 x (matmul parameters) FLOPs per token, the policy's and the critic's, against
--peak-tflops (989: dense bf16 of an H100 or H200 SXM); attention's own FLOPs are left out, so it is a floor.
Iteration medians are bench/iteration_result.py's (iterations 2..n, 2..n-1 overlapped); SFT's skip its first two steps.
"""
import argparse
import json
import os
import statistics
import sys

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from iteration_result import run_result  # noqa: E402

SHAPES = {  # model.path stem -> (layers, matmul params per block, LM head params): SmolLM2-135M-Instruct
    "smollm2": (30, 3_538_944, 28_311_552),
}


def rows(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def phases(log):
    """Seconds of each phase of one time-stamped train.py log (None where the log is not there)."""
    if not os.path.isfile(log):
        return {}
    stamps = []
    with open(log) as f:
        for line in f:
            t, _, text = line.partition(" ")
            try:
                stamps.append((float(t), text))
            except ValueError:
                continue
    if not stamps:
        return {}
    first = lambda key: next((t for t, s in stamps if key in s), None)  # noqa: E731
    start, end = stamps[0][0], stamps[-1][0]
    sft, rl_plan = first("SFT warm-up:"), [t for t, s in stamps if s.startswith("memory plan")]
    limit, export = first("train.time_limit="), first("policy exported to")
    out = {"command_s": end - start}
    if sft and len(rl_plan) >= 2:
        out["sft_phase_s"] = rl_plan[1] - sft  # SFT, its checkpoint and its export, to the RL memory plan
        out["startup_s"] = sft - start
    if limit and len(rl_plan) >= 2:
        out["rl_phase_s"] = limit - rl_plan[1]
    if limit:
        out["after_rl_s"] = end - limit  # the last checkpoint, the export, the summary
    return out


def table(run, peak):
    it = run_result(run)  # the iteration medians, as bench/iteration_result.py takes them
    cfg = yaml.safe_load(open(os.path.join(run, "config.yaml")))
    paths = [cfg["model"]["path"]]  # RL after its SFT phase starts from sft/hf: the SFT's model.path names it
    if os.path.isfile(os.path.join(run, "sft", "config.yaml")):
        paths.append(yaml.safe_load(open(os.path.join(run, "sft", "config.yaml")))["model"]["path"])
    shape = next((v for p in paths for k, v in SHAPES.items() if k in str(p).lower()), None)
    if shape is None:  # another model's FLOPs would make every MFU here wrong
        raise SystemExit(f"error: {run}: model.path {paths} names none of {', '.join(SHAPES)} "
                         f"(bench/time_table.py SHAPES)")
    layers, per_block, head = shape
    critic_layers = cfg["model"].get("critic_layers") or layers
    policy_flops = 6 * (layers * per_block + head)
    critic_flops = 6 * critic_layers * per_block if cfg["algo"]["advantage"] in ("step_gae", "token_gae") else 0
    its = [r for r in rows(os.path.join(run, "metrics.jsonl")) if "time_train" in r][1:]
    update_tok_s = statistics.median(r["train_tok_s"] for r in its)
    out = {"run": run, "iterations": it["iterations"], "s_per_iteration": it["iteration_s"],
           "rollout_waited_s": it["rollout_s"], "rollout_played_s": it.get("rollout_play_s"),
           "score_s": it["score_s"], "update_s": it["update_s"], "update_tok_s": update_tok_s,
           "update_mfu": update_tok_s * (policy_flops + critic_flops) / (peak * 1e12)}
    sft_path = os.path.join(run, "sft", "metrics.jsonl")
    if os.path.isfile(sft_path):
        sft = rows(sft_path)
        out["sft_steps"], out["sft_tok_s"] = len(sft), statistics.median(r["train_tok_s"] for r in sft[2:])
        out["sft_mfu"] = out["sft_tok_s"] * policy_flops / (peak * 1e12)
    log = next((p for p in (os.path.join(run, "train.log"), os.path.join(os.path.dirname(os.path.abspath(run)),
                                                                         "train.log")) if os.path.isfile(p)), "")
    out.update(phases(log))
    if "sft_phase_s" in out:
        out["sft_steps_s"] = out["sft_steps"] / out["sft_phase_s"]
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+")
    p.add_argument("--peak-tflops", type=float, default=989.0)
    p.add_argument("--json")
    a = p.parse_args(argv)
    out = [table(r, a.peak_tflops) for r in a.runs]
    keys = ["sft_steps", "sft_phase_s", "sft_steps_s", "sft_tok_s", "sft_mfu", "iterations", "s_per_iteration",
            "score_s", "update_s", "update_tok_s", "update_mfu", "rollout_waited_s", "rollout_played_s",
            "rl_phase_s", "after_rl_s", "command_s"]
    print("| run | " + " | ".join(keys) + " |\n|" + " --- |" * (len(keys) + 1))
    fmt = lambda v: "" if v is None else (f"{v:.3f}" if isinstance(v, float) and v < 10 else f"{v:,.0f}")  # noqa
    for o in out:
        print(f"| {o['run']} | " + " | ".join(fmt(o.get(k)) for k in keys) + " |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
