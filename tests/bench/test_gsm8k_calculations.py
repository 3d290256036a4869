"""bench/gsm8k_calculations.py: episodes grouped by their problem's reference calculations, with the paired counts
against a baseline, and a clear error when the episodes are not of the split named."""
import os
import subprocess
import sys

import pytest

from r1.config import load_config
from r1.tasks.data import load_rows
from r1.trajectory import Step, Trajectory, save

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from gsm8k_calculations import calculations, main  # noqa: E402

CONFIG = os.path.join(ROOT, "configs", "gsm8k_tool.yaml")


def episode(sample_id: str, correct: bool, calls: int) -> Trajectory:
    steps = [Step([1], [2], [0.0], info={"tool_calls": 1}) for _ in range(calls)]
    steps.append(Step([1], [2], [0.0], reward=float(correct), done=True, info={"correct": correct}))
    return Trajectory(uid=sample_id, group=0, sample_id=sample_id, steps=steps, termination="answered")


@pytest.fixture(scope="module")
def test_calcs():
    return calculations(load_rows(load_config(CONFIG), "test"))


def test_groups_and_paired_counts(tmp_path, test_calcs, capsys):
    two = [k for k, n in test_calcs.items() if n == 2][:3]
    five = [k for k, n in test_calcs.items() if n == 5][:2]
    # final: 2 of the 2-calculation problems right; one 5-calculation problem wrong with 2 calls (fewer than 5)
    final = [episode(two[0], True, 2), episode(two[1], True, 2), episode(two[2], False, 3),
             episode(five[0], False, 2), episode(five[1], True, 5)]
    base = [episode(two[0], False, 2), episode(two[1], True, 2), episode(two[2], True, 2),
            episode(five[0], False, 6), episode(five[1], False, 5)]
    save(final, str(tmp_path / "final.jsonl.gz"))
    save(base, str(tmp_path / "base.jsonl.gz"))
    rows = main([str(tmp_path / "final.jsonl.gz"), "--base", str(tmp_path / "base.jsonl.gz"), "--config", CONFIG,
                 "--split", "test"])
    by = {r["calculations"]: r for r in rows}
    assert set(by) == {"2", "5"}
    assert by["2"]["problems"] == 3 and by["2"]["accuracy"] == pytest.approx(2 / 3)
    assert (by["2"]["gained"], by["2"]["lost"], by["2"]["base_accuracy"]) == (1, 1, pytest.approx(2 / 3))
    assert by["2"]["wrong_with_fewer_calls"] == 0.0  # its one wrong answer made 3 calls for 2 calculations
    assert by["5"]["wrong_with_fewer_calls"] == 1.0 and by["5"]["mean_calls"] == 3.5
    assert by["5"]["base_mean_calls"] == 5.5 and (by["5"]["gained"], by["5"]["lost"]) == (1, 0)
    assert "| 2 | 3 | 66.7% | 66.7% |" in capsys.readouterr().out


def test_a_group_without_wrong_answers_has_no_under_calling_share(tmp_path, test_calcs, capsys):
    one = [k for k, n in test_calcs.items() if n == 1][:1]
    save([episode(one[0], True, 1)], str(tmp_path / "e.jsonl.gz"))
    rows = main([str(tmp_path / "e.jsonl.gz"), "--config", CONFIG, "--split", "test"])
    assert rows[0]["wrong_with_fewer_calls"] is None
    assert "| 1 | 1 | 100.0% | 1.00 |  |" in capsys.readouterr().out


def test_a_baseline_of_other_problems_is_refused(tmp_path, test_calcs):
    two = [k for k, n in test_calcs.items() if n == 2][:2]
    save([episode(two[0], True, 2), episode(two[1], True, 2)], str(tmp_path / "final.jsonl.gz"))
    save([episode(two[0], True, 2)], str(tmp_path / "base.jsonl.gz"))
    with pytest.raises(SystemExit, match="different problems .1 only in the evaluation, 0 only in the baseline"):
        main([str(tmp_path / "final.jsonl.gz"), "--base", str(tmp_path / "base.jsonl.gz"), "--config", CONFIG,
              "--split", "test"])


def test_episodes_of_another_split_are_refused(tmp_path):
    save([episode("gsm8k-nope-1", True, 1)], str(tmp_path / "e.jsonl.gz"))
    script = os.path.join(ROOT, "bench", "gsm8k_calculations.py")
    out = subprocess.run([sys.executable, script, str(tmp_path / "e.jsonl.gz"), "--config", CONFIG, "--split", "test"],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode != 0 and "not in this split" in out.stderr + out.stdout
