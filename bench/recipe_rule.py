"""Issue 29's rule, chosen before the run it judges: does a candidate recipe replace the recipe?

The rule (docs/decisions.md, "Tuning on a validation split"): the candidate becomes the recipe if the mean of its in-run validation
reads (eval_accuracy, all 500 validation problems, every eval.every iterations) in the second half of its RL
time is at least the recipe's over the second half of its own. "The second half of its RL time" is the reads
logged after half the loop's last `time_elapsed` (the RL loop's wall time, held-out reads included, the same
schedule for both): by time, not iterations, because a faster candidate runs more of them in the same
half hour. The read before RL (iteration 0, no time_elapsed) is never in it. The test split is not read
here: it picks nothing. Both runs must read the same thing: the task (config.yaml's data.task) and the
number of problems a read covers (eval_n); a quickstart run once "won" against recipe3 on 12 synthetic
problems, so runs that differ there are an error naming both.

    python bench/recipe_rule.py CANDIDATE_RUN RECIPE_RUN [--save PATH]

Prints one JSON object: each run's reads in its second half (iteration, seconds, accuracy), their mean,
and `candidate_wins` (mean >= the recipe's). A run without a read in its second half is an error, not a
loss: the rule cannot be applied to it.
"""
import argparse
import json
import os

import yaml


def read_metrics(run: str) -> tuple:
    """(path, [one dict a line]) of the run's metrics.jsonl, or SystemExit naming it."""
    path = os.path.join(run, "metrics.jsonl")
    try:
        with open(path) as f:
            lines = [json.loads(ln) for ln in f if ln.strip()]
    except OSError as e:
        raise SystemExit(f"error: {path}: {e.strerror or e}") from None
    except json.JSONDecodeError as e:
        raise SystemExit(f"error: {path}: not JSON lines ({e})") from None
    bad = next((i for i, m in enumerate(lines, 1) if not isinstance(m, dict)), None)
    if bad is not None:
        raise SystemExit(f"error: {path}: line {bad} is not a JSON object")
    return path, lines


def second_half_reads(path: str, lines: list) -> list:
    """[(iteration, time_elapsed, eval_accuracy)] of the run's held-out reads after half its RL time."""
    timed = [m for m in lines if "time_elapsed" in m]
    if not timed:
        raise SystemExit(f"error: {path}: no RL iteration logged (no time_elapsed)")
    half = timed[-1]["time_elapsed"] / 2
    reads = [(m["iter"], round(m["time_elapsed"], 1), m["eval_accuracy"]) for m in timed
             if "eval_accuracy" in m and m["time_elapsed"] > half]
    if not reads:
        raise SystemExit(f"error: {path}: no held-out read (eval_accuracy) after half its RL time "
                         f"({half:.0f} s): the rule needs eval.every > 0")
    return reads


def what_it_reads(run: str, lines: list) -> tuple:
    """(task, problems a read covers) of a run, each None where its files do not say."""
    task, path = None, os.path.join(run, "config.yaml")
    try:
        with open(path) as f:
            cfg = yaml.safe_load(f)
    except OSError:
        cfg = None
    except yaml.YAMLError as e:
        raise SystemExit(f"error: {path}: not YAML ({str(e).splitlines()[0]})") from None
    if isinstance(cfg, dict) and isinstance(cfg.get("data"), dict):
        task = cfg["data"].get("task")
    ns = {m.get("eval_n") for m in lines if "eval_accuracy" in m} - {None}
    return task, (ns.pop() if len(ns) == 1 else None)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("candidate")
    ap.add_argument("recipe")
    ap.add_argument("--save", default=None)
    a = ap.parse_args(argv)
    out, reads_what = {"name": "recipe_rule"}, []
    for name, run in (("candidate", a.candidate), ("recipe", a.recipe)):
        path, lines = read_metrics(run)
        reads = second_half_reads(path, lines)
        out[name] = {"run": run, "reads": reads, "mean": round(sum(r[2] for r in reads) / len(reads), 4)}
        reads_what.append(what_it_reads(run, lines))
    for what, x, y in zip(("task", "problems a read"), *reads_what):  # reads of one validation split, or refused
        if x is not None and y is not None and x != y:
            raise SystemExit(f"error: {a.candidate} and {a.recipe} read different things ({what}: {x} against "
                             f"{y}): the rule compares reads of one validation split")
    out["candidate_wins"] = out["candidate"]["mean"] >= out["recipe"]["mean"]
    print(json.dumps(out))
    if a.save:
        with open(a.save, "w") as f:
            f.write(json.dumps(out) + "\n")
    return out


if __name__ == "__main__":
    main()
