"""bench/device.py wait / collect (bench/wait.py) on fake results folders: a device call costs budget, so a wait
that misses a dead job, ends at a failed phase the job goes past, or an archive that leaves out the metrics or
takes the weights, is found here."""
import os
import subprocess
import sys
import tarfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEVICE = os.path.join(ROOT, "bench", "device.py")


def gone_pid() -> int:
    """The pid of a process that has ended."""
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def fake_job(tmp_path, progress: str, pid: int, name="res"):
    res = tmp_path / name
    (res / "lane" / "hf").mkdir(parents=True)
    (res / "progress.txt").write_text(progress)
    (res / "job.pid").write_text(f"{pid}\n")
    (res / "recipe.log").write_text("line 1\nlast words of recipe\n")
    (res / "speedrun.json").write_text("{}\n")
    (res / "lane" / "metrics.jsonl").write_text('{"iter": 1}\n')
    (res / "lane" / "hf" / "model.safetensors").write_bytes(b"x" * 10)  # weights stay behind
    (res / "lane" / "big.bin").write_bytes(b"x" * (4 << 20))  # 4 MiB: over the cut
    return res


def wait(out, limit, *folders):
    return subprocess.run([sys.executable, DEVICE, "wait", *map(str, folders), "--out", str(out), "--limit",
                           str(limit)], capture_output=True, text=True, timeout=120, cwd=ROOT)


BEGIN = "10:00:00 begin: job pid 1, recipe\n10:00:01 start recipe\n"
FAIL = "10:04:00 FAIL recipe rc=1 262s: RuntimeError\n"
DONE = "10:20:00 ALL DONE\n"


@pytest.mark.parametrize("progress,alive,rc,state", [
    (BEGIN + FAIL, False, 1, "died"),  # the job exited after its failed phase
    (BEGIN + FAIL, True, 2, "running"),  # a failed phase, and the job goes on to its next one
    (BEGIN + "10:20:00 done recipe\n" + DONE, False, 0, "done"),
    (BEGIN + "10:20:00 all done\n", False, 0, "done"),  # the older jobs' spelling
    (BEGIN + FAIL + DONE, False, 3, "done, with failed phases: recipe"),
    (BEGIN + FAIL + DONE + BEGIN, True, 2, "running"),  # restarted in the same folder: still running
    (BEGIN + DONE + BEGIN, False, 1, "died"),  # restarted, then gone without a word: the old ALL DONE is not its
    (BEGIN + DONE, True, 2, "running"),  # said ALL DONE, not yet exited
])
def test_wait_ends_when_the_job_ends_and_collects(tmp_path, progress, alive, rc, state):
    res = fake_job(tmp_path, progress, os.getpid() if alive else gone_pid())
    out = tmp_path / "out"
    r = wait(out, 1 if state == "running" else 100, res)
    assert r.returncode == rc, r.stdout + r.stderr
    assert f"wait: {state} after" in r.stdout
    assert progress.splitlines()[-1] in r.stdout
    assert "last words of recipe" in r.stdout  # the failed phase's log, or the newest one
    with tarfile.open(out / "results.tgz") as t:
        names = t.getnames()
    assert "res/lane/metrics.jsonl" in names and "res/progress.txt" in names and "res/job.pid" in names
    assert not any(n.endswith(("model.safetensors", "big.bin")) for n in names)
    assert any(n.startswith("bench/results/") for n in names)
    assert (out / "progress.txt").read_text() == progress and (out / "speedrun.json").exists()


def test_wait_on_a_folder_that_is_not_there_costs_no_wait(tmp_path):
    r = wait(tmp_path / "out", 540, tmp_path / "typo")
    assert r.returncode == 4 and "no folder" in r.stdout


def test_wait_before_the_job_wrote_anything(tmp_path):
    res = tmp_path / "nothing"
    res.mkdir()
    r = wait(tmp_path / "out", 1, res)
    assert r.returncode == 2
    assert "no " in r.stdout and "wait: running" in r.stdout


@pytest.mark.parametrize("first_alive", [False, True])
def test_wait_on_several_says_running_while_any_runs_and_packs_each_apart(tmp_path, first_alive):
    """Two jobs of one host, one call: a job still running (whichever is waited on first) keeps the status at 2,
    the ended one is packed all the same, each in a folder of its job's name."""
    a = fake_job(tmp_path, BEGIN + DONE, os.getpid() if first_alive else gone_pid(), "recipe")
    b = fake_job(tmp_path, BEGIN + DONE, gone_pid() if first_alive else os.getpid(), "pair")
    r = wait(tmp_path / "out", 2, a, b)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "some job still running" in r.stdout
    for name in ("recipe", "pair"):
        with tarfile.open(tmp_path / "out" / name / "results.tgz") as t:
            assert f"{name}/lane/metrics.jsonl" in t.getnames()


@pytest.mark.parametrize("second, rc", [(BEGIN + DONE, 0), (BEGIN + FAIL, 1), (BEGIN + FAIL + DONE, 3)])
def test_wait_on_several_ends_with_the_worst_status(tmp_path, second, rc):
    a = fake_job(tmp_path, BEGIN + DONE, gone_pid(), "recipe")
    b = fake_job(tmp_path, second, gone_pid(), "pair")
    r = wait(tmp_path / "out", 100, a, b)
    assert r.returncode == rc, r.stdout + r.stderr
    assert f"none running (status {rc})" in r.stdout


def test_wait_refuses_two_folders_of_one_name_before_it_waits(tmp_path):
    (tmp_path / "a" / "res").mkdir(parents=True)
    (tmp_path / "b" / "res").mkdir(parents=True)
    r = wait(tmp_path / "out", 540, tmp_path / "a" / "res", tmp_path / "b" / "res")
    assert r.returncode == 4 and "two folders named res" in r.stdout
    assert not (tmp_path / "out").exists()
