"""The speedrun result of a recipe job (bench/device.py recipe), written from the job's own files.

    python bench/speedrun.py RESULTS_DIR [--save bench/results/speedrun.json]
    python bench/speedrun.py COLLECTED/speedrun.json --save bench/results/speedrun.json

RESULTS_DIR holds what the recipe job wrote: job.json (config, stamp: device, torch, commit, date), wall_s (the
whole train.py command: SFT, RL, in-run validation reads, exports), test-sft.json and test-final.json (eval.py's
results on all of the test split). The object goes to RESULTS_DIR/speedrun.json and, with --save, is appended
to that file's list (one object a run; the same run saved twice is refused). The second form appends a result
collected from a device (bench/device.py wait copies it out). Nothing here measures anything.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from learning_result import read_eval  # noqa: E402

KEYS = ("name", "config", "wall_s", "sft_accuracy", "test_accuracy", "n", "device", "torch", "commit", "date")


def _read(path: str, what: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError as e:
        raise SystemExit(f"error: {path}: {e.strerror or e} ({what})") from None


def result(res: str) -> dict:
    job = json.loads(_read(os.path.join(res, "job.json"), "the recipe job's config and stamp"))
    try:
        wall = float(_read(os.path.join(res, "wall_s"), "the train.py command's seconds").strip())
    except ValueError:
        raise SystemExit(f"error: {os.path.join(res, 'wall_s')}: not a number of seconds") from None
    sft, test = read_eval(os.path.join(res, "test-sft.json")), read_eval(os.path.join(res, "test-final.json"))
    for what, r in (("test-sft.json", sft), ("test-final.json", test)):
        if r["split"] != "test":
            raise SystemExit(f"error: {os.path.join(res, what)}: split {r['split']!r}, not test")
    if int(sft["n"]) != int(test["n"]):
        raise SystemExit(f"error: {res}: the SFT and final test reads cover {sft['n']} and {test['n']} problems")
    missing = [k for k in ("config", "device", "torch", "commit", "date") if k not in job]
    if missing:
        raise SystemExit(f"error: {os.path.join(res, 'job.json')}: no {', '.join(missing)}")
    out = {"name": "speedrun", "config": job["config"], "wall_s": round(wall, 1), "sft_accuracy": sft["accuracy"],
           "test_accuracy": test["accuracy"], "n": int(test["n"])}
    out.update({k: job[k] for k in ("device", "torch", "commit", "date")})
    return out


def append(path: str, obj: dict):
    """Add obj to the JSON list in path (created if absent); an equal object already there is refused."""
    runs = []
    if os.path.exists(path):
        try:
            runs = json.loads(_read(path, "the speedrun results"))
        except json.JSONDecodeError as e:
            raise SystemExit(f"error: {path}: not JSON ({e})") from None
        if not isinstance(runs, list):
            raise SystemExit(f"error: {path}: not a list of runs")
    if obj in runs:
        raise SystemExit(f"error: {path} already holds this run")
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(runs + [obj], f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results_dir")
    p.add_argument("--save", help="append the object to this JSON list too")
    a = p.parse_args(argv)
    if os.path.isfile(a.results_dir):
        try:
            out = json.loads(_read(a.results_dir, "a speedrun result"))
        except json.JSONDecodeError as e:
            raise SystemExit(f"error: {a.results_dir}: not JSON ({e})") from None
        if not isinstance(out, dict) or list(out) != list(KEYS) or out["name"] != "speedrun":
            raise SystemExit(f"error: {a.results_dir}: not a speedrun result (keys {', '.join(KEYS)})")
    else:
        out = result(a.results_dir)
        with open(os.path.join(a.results_dir, "speedrun.json"), "w") as f:
            json.dump(out, f, indent=1)
            f.write("\n")
    if a.save:
        append(a.save, out)
    print(json.dumps(out))


if __name__ == "__main__":
    sys.exit(main())
