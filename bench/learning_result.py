"""The learning result of a recipe run (issue 29) as one JSON object, written from the run's own files.

    python bench/learning_result.py --run RUN_DIR --sft-eval SFT_EVAL.json --test-eval TEST_EVAL.json \
        --wall WALL_SECONDS --config CONFIG --device "NVIDIA H200" [--save bench/results/learning.json]

The evaluation files are the last lines eval.py prints (`eval.out/eval.json` holds the same object); both
must be of the test split, all of it, so the numbers are the ones the README may quote. Nothing here
computes an accuracy: it copies what eval.py measured and refuses files that do not fit together.
`device` is the GPU the command ran on (the device job passes torch's name for it): a run meant
for an H200 was once lent an H100, and a file named learning_h200_*.json did not say so.
"""
import argparse
import datetime
import json
import os
import sys

import yaml


def read_eval(path: str) -> dict:
    """eval.py's result: its eval.out/eval.json, or its log, whose last line is the same object."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError as e:
        raise SystemExit(f"error: {path}: {e.strerror or e}") from None
    try:
        res = json.loads(text)  # eval.json: the whole file is the object
    except json.JSONDecodeError:
        lines = [ln for ln in text.splitlines() if ln.strip()]
        try:
            res = json.loads(lines[-1])
        except (IndexError, json.JSONDecodeError):
            raise SystemExit(f"error: {path}: neither eval.py's eval.json nor a log whose last line is its JSON "
                             f"result") from None
    if not isinstance(res, dict) or "accuracy" not in res or "n" not in res:
        raise SystemExit(f"error: {path}: no accuracy or n (is it eval.py's result?)")
    if "split" not in res:
        raise SystemExit(f"error: {path}: no split (an eval.json written before eval.py recorded it? use the "
                         f"eval log's last line)")
    return res


def run_facts(run: str, model: str) -> tuple:
    """(model, task) as the run's saved config has them: a CPU dry run of the recipe's script on the random
    tiny model must not be labelled as the real model. The SFT phase's config (sft/config.yaml) names the
    model the command started from (the RL config names the SFT export). Without either, (model, "gsm8k_tool")."""
    path = next((p for p in (os.path.join(run, "sft", "config.yaml"), os.path.join(run, "config.yaml"))
                 if os.path.isfile(p)), None)
    if path is None:
        return model, "gsm8k_tool"
    with open(path) as f:
        cfg = yaml.safe_load(f) or {}
    where = (cfg.get("model") or {}).get("path", "")
    return ("tiny (random weights)" if where == "tiny" else model), (cfg.get("data") or {}).get("task", "gsm8k_tool")


def result(run: str, sft: dict, test: dict, wall: float, config: str, model: str, device: str = "") -> dict:
    for what, res in (("SFT", sft), ("final", test)):
        if res["split"] != "test":
            raise SystemExit(f"error: the {what} evaluation is of split {res['split']!r}, not test")
    if int(sft["n"]) != int(test["n"]):
        raise SystemExit(f"error: the SFT and final evaluations cover {sft['n']} and {test['n']} problems")
    model, task = run_facts(run, model)
    return {"name": "learning", "model": model, "task": task, "wall_s": round(wall, 1),
            "sft_accuracy": sft["accuracy"], "test_accuracy": test["accuracy"], "n": int(test["n"]),
            "config": config, "run": run, "device": device or "not recorded",
            "date": datetime.date.today().isoformat()}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", required=True)
    p.add_argument("--sft-eval", required=True)
    p.add_argument("--test-eval", required=True)
    p.add_argument("--wall", type=float, required=True, help="seconds of the whole train.py command, SFT included")
    p.add_argument("--config", required=True)
    p.add_argument("--model", default="SmolLM2-135M-Instruct")
    p.add_argument("--device", default="", help="the GPU the command ran on, e.g. 'NVIDIA H200'")
    p.add_argument("--save", help="write the object to this file too")
    a = p.parse_args(argv)
    out = result(a.run, read_eval(a.sft_eval), read_eval(a.test_eval), a.wall, a.config, a.model, a.device)
    print(json.dumps(out))
    if a.save:
        os.makedirs(os.path.dirname(a.save) or ".", exist_ok=True)
        with open(a.save, "w") as f:
            json.dump(out, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    sys.exit(main())
