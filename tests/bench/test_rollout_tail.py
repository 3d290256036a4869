"""bench/rollout_tail.py: an episode's response tokens summed over its turns, their quantiles, and the fill of a
batch (mean / longest) counted by hand; a file of exactly --batch episodes is a batch as played, others are
drawn from; a missing or wrong file is one line and exit 2."""
import json
import os
import subprocess
import sys

import pytest

from r1.trajectory import Step, Trajectory, save

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "bench", "rollout_tail.py")


def episode(k: int, turns: list) -> Trajectory:
    """An episode whose turns have these many response tokens."""
    steps = [Step([1], [2] * n, [0.0] * n) for n in turns]
    return Trajectory(uid=f"0-{k}", group=0, sample_id=str(k), steps=steps, termination="answered")


def run(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, cwd=ROOT)


def test_a_played_batch_counted_by_hand(tmp_path):
    # four episodes of 10, 20, 30 and 100 tokens (the last in two turns of 60 + 40): a batch of 4 as played
    save([episode(0, [10]), episode(1, [5, 15]), episode(2, [30]), episode(3, [60, 40])],
         str(tmp_path / "iter_000001.jsonl.gz"))
    r = run(str(tmp_path / "iter_000001.jsonl.gz"), "--batch", "4")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["episodes"] == 4 and out["mean"] == 40 and out["max"] == 100
    assert out["p50"] == 30 and out["p90"] == 100  # nearest rank below: sorted [10, 20, 30, 100][int(q * 4)]
    assert out["batches_are"] == "files"
    [b] = out["batches"]
    assert b["longest"] == 100 and b["fill"] == pytest.approx(0.4)  # 160 tokens over 4 x 100 decode steps
    assert b["p90_of_longest"] == 1.0 and b["p95_of_longest"] == 1.0


def test_carry_reads_the_episodes_in_stretches(tmp_path):
    """--carry 25: 10 whole; 5+15 whole (20 < 25); 30 whole (one turn); 60 | 40 paused after its first turn;
    12+14 | 9 paused at 26. A batch of 5 as played: longest episode 100, longest stretch 60."""
    save([episode(0, [10]), episode(1, [5, 15]), episode(2, [30]), episode(3, [60, 40]), episode(4, [12, 14, 9])],
         str(tmp_path / "iter_000001.jsonl.gz"))
    r = run(str(tmp_path / "iter_000001.jsonl.gz"), "--batch", "5", "--carry", "25")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["carry"] == {"tokens": 25, "paused_frac": 0.4, "longest_stretch": 60}
    [b] = out["batches"]
    assert b["longest"] == 100 and b["longest_stretch"] == 60 and b["stretch_of_longest"] == pytest.approx(0.6)
    assert "carry" not in json.loads(run(str(tmp_path / "iter_000001.jsonl.gz"), "--batch", "5").stdout)
    bad = run(str(tmp_path / "iter_000001.jsonl.gz"), "--carry", "-1")
    assert bad.returncode == 2 and "--carry must be 0 (off) or more" in bad.stderr


def test_a_run_folder_and_random_draws(tmp_path):
    (tmp_path / "trajectories").mkdir()
    save([episode(k, [k + 1]) for k in range(6)], str(tmp_path / "trajectories" / "iter_000001.jsonl.gz"))
    r = run(str(tmp_path), "--batch", "4", "--draws", "2")  # 6 episodes, no file of 4: two draws of 4
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["episodes"] == 6 and out["batches_are"] == "random draws" and len(out["batches"]) == 2
    for b in out["batches"]:
        assert b["n"] == 4 and 0 < b["fill"] <= 1 and b["longest"] <= 6


@pytest.mark.parametrize("make, expect", [
    (lambda p: str(p / "nope.jsonl.gz"), "no episode file or folder"),
    (lambda p: (p / "eval.json").write_text("{}") and str(p / "eval.json"), "is not a trajectory file"),
    (lambda p: str(p), "no trajectories/iter_*.jsonl.gz"),
])
def test_bad_input_is_one_line(tmp_path, make, expect):
    r = run(make(tmp_path))
    assert r.returncode == 2 and expect in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
