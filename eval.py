"""Evaluate a model on a task split: `python eval.py --config X model.path=... eval.limit=N`.

model.path may be an HF folder, a .gguf, the short name, or a run folder
(its hf/ export is used). No trainer is built: an actor alone (r1/actor.py
`standalone`: the model in the rollout dtype and its generator) plays the
episodes of r1/evaluate.py. Prints one final JSON line with accuracy, n,
mean_turns, mean_tool_calls, malformed_rate, mean_response_len (and
pass@k with eval.n > 1); writes the greedy trajectories, eval.json and the
resolved config.yaml to eval.out (default: runs/eval-<time>/), nothing else.
"""
import argparse
import json
import os
import sys
import time

from r1.atomic import write_text
from r1.config import USER_ERRORS, ConfigError, dump, load_config, run_main


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", action="append", help="YAML config file; repeat to layer files (e.g. a base config, then an ablation)")
    p.add_argument("overrides", nargs="*")
    a = p.parse_args(argv)
    try:
        cfg = load_config(a.config, a.overrides)
    except ConfigError as e:
        sys.exit(f"error: {e}")
    path = cfg.model.path
    if os.path.isdir(os.path.join(path, "hf")):
        cfg.model.path = os.path.join(path, "hf")
    out = cfg.eval.out or os.path.join("runs", f"eval-{time.strftime('%Y%m%d-%H%M%S')}")
    if os.path.exists(out) and os.listdir(out):
        sys.exit(f"error: eval.out {out} exists and is not empty (nothing was overwritten)")
    cfg.run.dir = out
    cfg.run.resume = False
    cfg.train.steps = 0  # nothing is trained: the memory plan counts the generator alone, the disk plan nothing
    cfg.log.tensorboard = cfg.log.progress = False
    from r1.actor import standalone
    from r1.evaluate import evaluate
    from r1.run import check_run_dir
    from r1.tasks.data import load_rows

    try:
        check_run_dir(cfg)  # eval.out can be written (its parent exists or can be made, and is writable)
        actor = standalone(cfg)
        rows = load_rows(cfg, cfg.eval.split)
    except USER_ERRORS as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("interrupted while starting; no results were written", file=sys.stderr)
        sys.exit(130)
    try:
        res = evaluate(actor, rows, cfg, out_dir=out)
    except KeyboardInterrupt:
        print(f"interrupted: no results were written to {out}", file=sys.stderr)
        sys.exit(130)
    res["model"] = path
    res["task"] = cfg.data.task
    res["split"] = cfg.eval.split
    if actor.d.main:
        write_text(os.path.join(out, "config.yaml"), dump(cfg))  # the resolved config beside its results
        print(f"wrote {os.path.join(out, 'eval.json')} and the greedy episodes, "
              f"{os.path.join(out, 'eval_trajectories.jsonl.gz')}", file=sys.stderr, flush=True)
        print(json.dumps(res), flush=True)


if __name__ == "__main__":
    run_main(main)
