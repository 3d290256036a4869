"""Iteration time of finished runs (issue 31: PPO and GRPO, train.overlap 0 against 1) as JSON, from the
runs' own metrics.jsonl; nothing here times anything.

    python bench/iteration_result.py --runs R/ppo-o0 R/ppo-o1 ... [--save bench/results/iteration.json]

One object per run: name "iteration", model (model.path), algo (algo.advantage of its config.yaml),
overlap, micro_tokens and memory_fraction as asked, and medians over iterations 2..n (the first compiles and captures;
with overlap, 2..n-1: the last iteration of an overlapped run starts no next rollout, so it is faster than
the steady state, and counting it favoured overlap):
iteration_s (the step of time_elapsed), rollout_s (what the iteration waited for its rollout), score_s,
update_s, and with overlap rollout_play_s (the rollout's own time) and each thread's CPU seconds,
cpu_rollout_s and cpu_main_s, and with overlap 2 rollout_idle_s (the rollout process's time between two
plays: the hand-over when the trainer waits on the rollout) (medians over the iterations that logged
them); mean_response_len and max_response_len (medians: the rollout's length and its longest episode,
where the run logged both);
alloc_retries (CUDA, summed over 2..n), eager_op_fallbacks (summed over all iterations: the first is where
compiles happen) and captures_deferred (overlap: CUDA graph captures held off while the update ran, summed over 2..n). It
refuses a run with fewer than 3 iterations (with overlap, 3 leave one steady iteration). --device, --torch and
--date name the machine, version and day the runs ran on when they are read elsewhere (default: this one, today).
"""
import argparse
import datetime
import json
import os
import statistics
import sys

import yaml


def fail(message: str):
    """A wrong argument: one line on stderr, exit 2 (as train.py and eval.py)."""
    print(message, file=sys.stderr)
    raise SystemExit(2)


def run_result(run: str) -> dict:
    for name in ("config.yaml", "metrics.jsonl"):
        if not os.path.isfile(os.path.join(run, name)):
            fail(f"error: {run}: no {name} (a train.py run folder?)")
    with open(os.path.join(run, "config.yaml")) as f:
        cfg = yaml.safe_load(f)
    with open(os.path.join(run, "metrics.jsonl")) as f:
        lines = [json.loads(ln) for ln in f if ln.strip()]
    # an iteration's line has its time; the validation read before RL (iteration 0, eval_* only) has none and is
    # no iteration (a run with eval.every > 0 starts with one: reading it crashed on its missing time_elapsed)
    lines = [m for m in lines if "time_elapsed" in m]
    overlap = cfg["train"].get("overlap", 0)
    if len(lines) < 3:
        fail(f"error: {run}: {len(lines)} iterations in metrics.jsonl, need at least 3")
    steady = lines[:-1] if overlap else lines  # overlap: the last iteration starts no rollout (above)
    later = steady[1:]
    elapsed = [b["time_elapsed"] - a["time_elapsed"] for a, b in zip(steady, steady[1:])]
    med = lambda key: round(statistics.median(m[key] for m in later), 3)  # noqa: E731
    out = {"name": "iteration", "run": os.path.basename(os.path.normpath(run)), "model": cfg["model"]["path"],
           "algo": cfg["algo"]["advantage"],
           "policy_loss": cfg["algo"]["policy_loss"], "overlap": overlap,
           "micro_tokens": cfg["train"]["micro_tokens"] or "auto", "memory_fraction": cfg["run"]["memory_fraction"],
           "iterations": len(lines), "iteration_s": round(statistics.median(elapsed), 3),
           "rollout_s": med("time_rollout"), "score_s": med("time_score"), "update_s": med("time_train"),
           "medians_over": "iterations 2..n-1" if overlap else "iterations 2..n"}
    if "time_rollout_play" in later[0]:
        out["rollout_play_s"] = med("time_rollout_play")
    for key in ("mean_response_len", "max_response_len"):  # the rollout's length and its tail (runs that log it)
        if all(key in m for m in later):
            out[key] = med(key)
    # overlap: each thread's CPU seconds, the process's time between plays (an iteration that played its own rollout,
    # on-policy, has neither)
    for key in ("cpu_rollout_s", "cpu_main_s", "rollout_idle_s"):
        have = [m[key] for m in later if key in m]
        if have:
            out[key] = round(statistics.median(have), 3)
    if any("eager_op_fallbacks" in m for m in lines):
        out["eager_op_fallbacks"] = sum(m.get("eager_op_fallbacks", 0) for m in lines)
    rest = lines[1:]  # counts: every iteration after the first
    if any("captures_deferred" in m for m in rest):
        out["captures_deferred"] = sum(m.get("captures_deferred", 0) for m in rest)
    if "alloc_retries" in rest[0]:
        out["alloc_retries"] = sum(m["alloc_retries"] for m in rest)
    out["reward_mean_last"] = lines[-1].get("reward_mean")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", nargs="+", required=True)
    ap.add_argument("--save", default="")
    ap.add_argument("--device", default="", help="the GPU the runs ran on (default: this machine's)")
    ap.add_argument("--torch", default="", help="the torch version they ran with (default: this one)")
    ap.add_argument("--date", default="", help="the day they ran (default: today)")
    a = ap.parse_args()
    import torch

    meta = {"device": a.device or (torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"),
            "torch": a.torch or torch.__version__, "date": a.date or datetime.date.today().isoformat()}
    results = [{**run_result(r), **meta} for r in a.runs]
    for r in results:
        print(json.dumps(r))
    if a.save:
        with open(a.save, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
