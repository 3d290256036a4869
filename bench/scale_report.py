"""Weak-scaling report from bench/device.py scale's run folders: one JSON line per GPU count.

Per GPU count, the mean over iterations after the first (which pays for warm-up: CUDA graphs,
allocator growth) of the time split (rollout, scoring, update), episodes/s, sampled tokens/s and
the peak memory, and weak-scaling efficiency = episodes/s at N GPUs / (N x episodes/s at 1 GPU).
"""
import json
import os
import sys


def summary(run_dir: str, gpus: int) -> dict:
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        rows = [json.loads(x) for x in f if x.strip()]
    rows = [r for r in rows if r.get("iter", 0) >= 1]
    use = rows[1:] or rows
    mean = lambda k: sum(r.get(k, 0.0) or 0.0 for r in use) / len(use)  # noqa: E731
    it = mean("time_rollout") + mean("time_score") + mean("time_train")
    episodes = mean("n")
    return {"name": "scale", "gpus": gpus, "iterations": len(use), "iter_s": it,
            "rollout_s": mean("time_rollout"), "score_s": mean("time_score"), "update_s": mean("time_train"),
            "episodes": episodes, "episodes_s": episodes / it if it else 0.0,
            "rollout_tok_s": mean("rollout_tok_s"), "peak_mem_gb": max(r.get("peak_mem_gb", 0.0) or 0.0 for r in use)}


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    runs, counts = argv[0], [int(n) for n in argv[1:]]
    out = [summary(os.path.join(runs, f"n{n}"), n) for n in counts
           if os.path.isfile(os.path.join(runs, f"n{n}", "metrics.jsonl"))]
    base = next((r for r in out if r["gpus"] == 1), None)
    for r in out:
        if base and base["episodes_s"]:
            r["weak_scaling_eff"] = r["episodes_s"] / (r["gpus"] * base["episodes_s"])
        print(json.dumps(r))


if __name__ == "__main__":
    main()
