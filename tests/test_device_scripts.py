"""The device-call helpers (bench/h200_wait.sh, bench/h200_collect.sh) on a fake results folder: a device call
costs budget, so a wait that misses a failed phase, or an archive that leaves out the metrics, is found here."""
import os
import subprocess
import tarfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WAIT = os.path.join(ROOT, "bench", "h200_wait.sh")


def fake_job(tmp_path, progress: str):
    res = tmp_path / "res"
    (res / "lane" / "hf").mkdir(parents=True)
    (res / "progress.txt").write_text(progress)
    (res / "lane.log").write_text("line 1\nlast words\n")
    (res / "lane" / "metrics.jsonl").write_text('{"iter": 1}\n')
    (res / "lane" / "hf" / "model.safetensors").write_bytes(b"x" * 10)  # weights stay behind
    (res / "lane" / "big.bin").write_bytes(b"x" * (4 << 20))  # 4 MiB: over the cut
    out = tmp_path / "out"
    out.mkdir()
    return res, out


def wait(res, out, limit):
    return subprocess.run(["bash", WAIT, str(res), ROOT, str(out), str(limit)], capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("progress,rc,state", [
    ("10:00 start recipe\n10:04 FAIL recipe rc=1 262s: RuntimeError\n", 1, "fail"),
    ("10:00 start recipe\n10:20 done recipe\n10:21 ALL DONE\n", 0, "done"),
    ("10:00 start recipe\n", 2, "running"),
])
def test_wait_ends_on_failure_or_done_and_collects(tmp_path, progress, rc, state):
    res, out = fake_job(tmp_path, progress)
    r = wait(res, out, 1 if state == "running" else 100)
    assert r.returncode == rc, r.stdout + r.stderr
    assert f"wait: {state} after" in r.stdout
    assert "last words" in r.stdout and progress.splitlines()[-1] in r.stdout
    with tarfile.open(out / "results.tgz") as t:
        names = t.getnames()
    assert "res/lane/metrics.jsonl" in names and "res/progress.txt" in names
    assert not any(n.endswith(("model.safetensors", "big.bin")) for n in names)
    assert any(n.startswith("bench/results/") for n in names)


def test_wait_before_the_job_wrote_anything(tmp_path):
    res = tmp_path / "nothing"
    res.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    r = wait(res, out, 1)
    assert r.returncode == 2
    assert "no " in r.stdout and "wait: running" in r.stdout
