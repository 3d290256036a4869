"""bench/cli_kinds.py: the command-line task's greedy episodes grouped by request kind, with the paired counts
against a baseline, and one-line refusals for another task's config or episodes of another split."""
import os
import subprocess
import sys

import pytest

from r1.config import load_config
from r1.tasks.data import load_rows
from r1.trajectory import save
from test_gsm8k_calculations import episode

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from cli_kinds import main  # noqa: E402

CONFIG = os.path.join(ROOT, "configs", "cli.yaml")
SCRIPT = os.path.join(ROOT, "bench", "cli_kinds.py")


@pytest.fixture(scope="module")
def kinds():
    return {r["id"]: r["kind"] for r in load_rows(load_config(CONFIG, ["data.test_size=64"]), "test")}


def test_kinds_and_paired_counts(tmp_path, kinds, capsys):
    two_step = [k for k, v in kinds.items() if v == "lines_of_largest"][:2]
    newest = [k for k, v in kinds.items() if v == "newest"][:3]
    assert len(two_step) == 2 and len(newest) == 3  # level 3 (the config's) asks both kinds
    final = [episode(two_step[0], True, 2), episode(two_step[1], False, 1)] + [episode(k, True, 1) for k in newest]
    base = [episode(two_step[0], False, 1), episode(two_step[1], False, 1), episode(newest[0], True, 1),
            episode(newest[1], False, 1), episode(newest[2], True, 1)]
    save(final, str(tmp_path / "final.jsonl.gz"))
    save(base, str(tmp_path / "base.jsonl.gz"))
    config = tmp_path / "cli.yaml"  # the evaluation's own config: 64 test requests
    config.write_text(open(CONFIG).read().replace("test_size: 256", "test_size: 64"))
    rows = main([str(tmp_path / "final.jsonl.gz"), "--base", str(tmp_path / "base.jsonl.gz"), "--config",
                 str(config), "--split", "test"])
    assert [r["kind"] for r in rows] == ["newest", "lines_of_largest"]  # most problems first
    by = {r["kind"]: r for r in rows}
    assert (by["newest"]["problems"], by["newest"]["accuracy"], by["newest"]["base_accuracy"]) == \
        (3, 1.0, pytest.approx(2 / 3))
    assert (by["newest"]["gained"], by["newest"]["lost"]) == (1, 0)
    assert (by["lines_of_largest"]["accuracy"], by["lines_of_largest"]["gained"]) == (0.5, 1)
    assert "| lines_of_largest | 2 | 0.0% | 50.0% | 1 / 0 (p = " in capsys.readouterr().out


@pytest.mark.parametrize("args, says", [
    (["--config", os.path.join(ROOT, "configs", "gsm8k_tool.yaml"), "--split", "test"], "data.task is 'gsm8k_tool'"),
    (["--config", CONFIG, "--split", "test"], "not in this split"),
])
def test_refusals_are_one_line(tmp_path, args, says):
    save([episode("cli-nope-1", True, 1)], str(tmp_path / "e.jsonl.gz"))
    out = subprocess.run([sys.executable, SCRIPT, str(tmp_path / "e.jsonl.gz"), *args],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode != 0 and says in out.stderr + out.stdout
    assert len((out.stderr + out.stdout).strip().splitlines()) == 1
