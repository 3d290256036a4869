"""bench/speedrun.py: the speedrun result copied from a recipe job's files, refused when the files do not fit."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "bench", "speedrun.py")
CONFIG = "configs/gsm8k_tool.yaml + configs/ablations/speedrun.yaml"  # as the speedrun job labels it
STAMP = {"device": "NVIDIA H100 80GB HBM3", "torch": "2.9.0", "commit": "abc", "date": "2026-12-06"}


def job_folder(tmp_path, sft=("test", 1319, 0.07), final=("test", 1319, 0.12), wall="1712.34\n"):
    res = tmp_path / "res"
    res.mkdir()
    (res / "job.json").write_text(json.dumps({"job": "speedrun", "config": CONFIG, **STAMP}))
    (res / "wall_s").write_text(wall)
    for name, (split, n, acc) in (("sft", sft), ("final", final)):
        (res / f"test-{name}.json").write_text(json.dumps({"n": n, "accuracy": acc, "split": split}))
    return res


def run(*args):
    return subprocess.run([sys.executable, SCRIPT, *map(str, args)], capture_output=True, text=True, timeout=60)


def test_the_result_is_copied_from_the_files_and_appended_once(tmp_path):
    res, save = job_folder(tmp_path), tmp_path / "results" / "speedrun.json"
    r = run(res, "--save", save)
    assert r.returncode == 0, r.stderr
    out = json.loads((res / "speedrun.json").read_text())
    assert out == {"name": "speedrun", "config": CONFIG, "wall_s": 1712.3,
                   "sft_accuracy": 0.07, "test_accuracy": 0.12, "n": 1319, **STAMP}
    assert json.loads(save.read_text()) == [out] and json.loads(r.stdout) == out
    again = run(res, "--save", save)  # the same run twice
    assert again.returncode != 0 and "already holds this run" in again.stderr
    collected = tmp_path / "collected.json"  # a copy brought back from a device, appended to another list
    collected.write_text(json.dumps(dict(out, commit="def")))
    r = run(collected, "--save", save)
    assert r.returncode == 0, r.stderr
    assert [x["commit"] for x in json.loads(save.read_text())] == ["abc", "def"]


@pytest.mark.parametrize("kw, words", [(dict(sft=("val", 1319, 0.1)), "split 'val', not test"),
                                       (dict(final=("test", 200, 0.1)), "cover 1319 and 200 problems"),
                                       (dict(wall="soon\n"), "not a number of seconds")])
def test_files_that_do_not_fit_are_refused_with_the_culprit(tmp_path, kw, words):
    res = job_folder(tmp_path, **kw)
    r = run(res)
    assert r.returncode != 0 and words in r.stderr and not (res / "speedrun.json").exists()


def test_a_folder_without_the_job_file_names_it(tmp_path):
    res = job_folder(tmp_path)
    (res / "job.json").unlink()
    r = run(res)
    assert r.returncode != 0 and "job.json" in r.stderr
    bad = tmp_path / "other.json"
    bad.write_text('{"name": "learning"}')
    r = run(bad, "--save", tmp_path / "s.json")
    assert r.returncode != 0 and "not a speedrun result" in r.stderr and not (tmp_path / "s.json").exists()
