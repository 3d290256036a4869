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


ABL = ["--task", "smoke=configs/smoke.yaml", "--sft-steps", "1", "--rl-seconds", "1", "--set", "data.val_size=2",
       "data.test_size=2", "train.steps=1", "rollout.prompts=2", "train.sft_batch=2"]


@pytest.mark.slow
def test_ablate_job_sft_once_then_lanes_and_a_rerun_runs_only_what_is_missing(tmp_path):
    """One SFT, the recipe's lane and grpo's for seed 3, each trained from it and read on validation, the pair
    compared; then --dry-run reruns print no phase for the finished lanes, only the lanes of a new seed (the SFT
    kept), and a lane whose weights are gone before its pending read trains again."""
    res = tmp_path / "res"
    r = device("ablate", str(res), "--model", "tiny", "--arms", "grpo", "--seeds", "3", *ABL)
    assert r.returncode == 0, r.stdout + r.stderr
    done = [p.split()[1] for p in phases(res) if p.startswith("done ")]
    assert done[0] == "smoke/sft" and sorted(done[1:]) == sorted(
        ["smoke/rl-recipe-s3", "smoke/val-recipe-s3", "smoke/rl-grpo-s3", "smoke/val-grpo-s3"])
    lane = json.loads((res / "smoke" / "grpo-s3.lane.json").read_text())
    assert (lane["arm"], lane["seed"], lane["task"], lane["rl_seconds"]) == ("grpo", 3, "smoke", 1.0)
    assert lane["sft"] == (res / "smoke" / "sft.id").read_text().strip() and lane["device"] == "cpu"
    assert "  seed: 3\n" in (res / "smoke" / "grpo-s3" / "config.yaml").read_text()
    rows = [json.loads(ln) for ln in (res / "smoke" / "compare.jsonl").read_text().splitlines()]
    assert [(x["ablation"], x["same_sft"]) for x in rows] == [("grpo-s3", True)]
    assert {"gained", "lost", "p_exact"} <= set(rows[0]["vs_recipe"])
    table = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "ablation_table.py"), str(res / "smoke")],
                           capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert table.returncode == 0, table.stderr
    lanes = [ln.split("|")[1].strip() for ln in table.stdout.splitlines() if ln.startswith("| ")]
    assert lanes[2:] == ["recipe-s3", "grpo-s3"], table.stdout  # after the header and its rule

    def dry(*more):
        r = device("ablate", str(res), "--model", "tiny", "--arms", "grpo", *more, *ABL, "--dry-run")
        assert r.returncode == 0, r.stdout + r.stderr
        return [ln.split()[2].rstrip(":") for ln in r.stdout.splitlines() if ln.split()[1:2] == ["dry"]]

    assert dry("--seeds", "3") == []
    assert dry("--seeds", "3", "4") == ["smoke/rl-recipe-s4", "smoke/val-recipe-s4", "smoke/rl-grpo-s4",
                                         "smoke/val-grpo-s4"]
    (res / "smoke" / "val-grpo-s3.done").unlink()
    import shutil
    shutil.rmtree(res / "smoke" / "grpo-s3" / "hf")  # a new session: the lane's weights did not come back
    assert dry("--seeds", "3") == ["smoke/rl-grpo-s3", "smoke/val-grpo-s3"]
    shutil.rmtree(res / "smoke" / "sft" / "hf")
    assert dry("--seeds", "3") == ["smoke/sft", "smoke/rl-grpo-s3", "smoke/val-grpo-s3"]


@pytest.mark.parametrize("args, line", [
    (["--arms", "grpo", "lorra"], "no ablation 'lorra'"),
    (["--arms", "grpo", "--test", "recipe", "lora"], "--test names lora, not an arm"),
    (["--arms", "grpo", "--base-abl", "grpoo"], "no ablation 'grpoo'"),
    (["--arms", "grpo", "--task", "a=configs/smoke.yaml"], "configs/smoke.yaml has no train.sft_steps"),
])
def test_ablate_refuses_a_wrong_lane_before_it_writes(tmp_path, args, line):
    """A misspelled arm once ran the recipe's lane alone, a device session spent on the wrong table."""
    r = device("ablate", str(tmp_path / "res"), "--model", "m.gguf", *args, timeout=120)
    assert r.returncode == 2 and line in r.stderr, r.stdout + r.stderr
    assert not (tmp_path / "res").exists()


def test_a_failed_phase_is_named_before_all_done_and_the_wait_says_so(tmp_path):
    """A wrong model path: the recipe phase fails, the phases after it that need its files fail or are not
    run, the job ends with "failed phases: recipe" then ALL DONE and exits 1; the wait reports status 3."""
    res = tmp_path / "res"
    r = device("recipe", str(res), "--model", str(tmp_path / "none.gguf"), "--config", "configs/smoke.yaml",
               timeout=300)
    assert r.returncode == 1, r.stdout + r.stderr
    lines = phases(res)
    assert lines[-2] == "failed phases: recipe" and lines[-1] == "ALL DONE"
    assert (res / "job.pid").read_text().strip().isdigit() and lines[0].startswith("begin: job pid ")
    w = device("wait", str(res), "--out", str(tmp_path / "out"), "--limit", "5", timeout=120)
    assert w.returncode == 3 and "done, with failed phases: recipe" in w.stdout
