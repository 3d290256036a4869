"""bench/device.py's jobs on the CPU: the recipe and ablate jobs end to end on configs/smoke.yaml's tiny random
model (every phase, its markers, the result files and their schema, a rerun that skips what is done), and
the commands of the other jobs as --dry-run prints them."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEVICE = os.path.join(ROOT, "bench", "device.py")
SCHEMA = ["name", "config", "wall_s", "sft_accuracy", "test_accuracy", "n", "device", "torch", "commit", "date"]
# the smoke config, smaller still: one SFT step, one RL iteration, reads of 2 problems
SMOKE = ["--config", "configs/smoke.yaml", "--set", "data.val_size=2", "data.test_size=2", "train.steps=1",
         "rollout.prompts=2", "--train-set", "train.sft_steps=1", "train.sft_batch=2", "eval.every=0"]


def device(*args, timeout=900):
    return subprocess.run([sys.executable, DEVICE, *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def phases(res) -> list:
    return [ln.split(" ", 1)[1] for ln in (res / "progress.txt").read_text().splitlines()]


@pytest.mark.slow
def test_recipe_job_end_to_end_on_the_smoke_config_then_a_rerun_skips_it(tmp_path):
    res, save = tmp_path / "res", tmp_path / "speedrun.json"
    r = device("recipe", str(res), "--model", "tiny", "--save", str(save), "--commit", "abc123", *SMOKE)
    assert r.returncode == 0, r.stdout + r.stderr
    done = [p for p in phases(res) if p.startswith("done ")]
    assert [p.split()[1] for p in done] == ["recipe", "test-sft", "test-final", "result", "val-final"]
    assert phases(res)[-1] == "ALL DONE"
    out = json.loads((res / "speedrun.json").read_text())
    assert list(out) == SCHEMA
    sft, test = (json.loads((res / f"test-{m}.json").read_text()) for m in ("sft", "final"))
    assert sft["split"] == test["split"] == "test" and test["n"] == 2
    assert (out["sft_accuracy"], out["test_accuracy"], out["n"]) == (sft["accuracy"], test["accuracy"], 2)
    assert out["wall_s"] == float((res / "wall_s").read_text()) > 0
    assert (out["config"], out["device"], out["commit"]) == ("configs/smoke.yaml", "cpu", "abc123")
    assert (res / "recipe" / "sft" / "hf").is_dir() and json.loads((res / "val-final.json").read_text())["split"] == "val"
    assert json.loads(save.read_text()) == [out]
    r = device("recipe", str(res), "--model", "tiny", "--save", str(save), "--commit", "abc123", *SMOKE)
    assert r.returncode == 0, r.stdout + r.stderr
    last = phases(res)[len(phases(res)) - 7:]
    assert last[1:6] == [f"skip {p} (done)" for p in ("recipe", "test-sft", "test-final", "result", "val-final")]
    assert json.loads(save.read_text()) == [out]  # the result phase was done: not appended twice
