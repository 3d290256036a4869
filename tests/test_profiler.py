"""R1_PROFILE: one iteration under torch.profiler, a report per phase; bad values are errors."""
import os

import pytest

from r1.profiler import busy_us, wanted


def test_busy_is_the_union_of_intervals():
    assert busy_us([]) == 0
    assert busy_us([(0, 10), (5, 12), (20, 25), (21, 22)]) == 17
    assert busy_us([(3, 4), (0, 1)]) == 2


def test_wanted_reads_the_iteration(monkeypatch):
    monkeypatch.delenv("R1_PROFILE", raising=False)
    assert not wanted(1)
    monkeypatch.setenv("R1_PROFILE", "2")
    assert wanted(2) and not wanted(1)
    for bad in ("yes", "0", "-1"):
        monkeypatch.setenv("R1_PROFILE", bad)
        with pytest.raises(ValueError, match="R1_PROFILE"):
            wanted(1)


def test_training_writes_the_profile_of_the_named_iteration(tmp_path, monkeypatch):
    """The smoke config on the CPU, two iterations, R1_PROFILE=2: the report has the three phases."""
    from r1.config import load_config
    from r1.trainer import Trainer

    monkeypatch.setenv("R1_PROFILE", "2")
    cfg = load_config("configs/smoke.yaml", [f"run.dir={tmp_path / 'run'}", "train.steps=2", "rollout.prompts=2",
                                             "rollout.n=2", "rollout.max_new_tokens=8", "eval.every=0"])
    Trainer(cfg).fit()
    text = (tmp_path / "run" / "profile_iter2.txt").read_text()
    assert not os.path.exists(tmp_path / "run" / "profile_iter1.txt")
    for name in ("r1.rollout", "r1.score", "r1.update"):
        line = next(ln for ln in text.splitlines() if ln.startswith(name))
        assert float(line.split()[1]) > 0  # wall ms
    assert "top ops by self CPU time" in text


def test_kernel_table_sums_by_name_longest_first():
    from r1.profiler import kernel_table
    rows = kernel_table([(0, 1000, "mm"), (1000, 1500, "copy"), (2000, 4000, "mm"), (5000, 5100, "add")], rows=2)
    assert rows[0].split() == ["3.0", "2", "mm"]
    assert rows[1].split() == ["0.5", "1", "copy"]
    assert rows[2].split()[:2] == ["0.1", "1"] and "the other 1 kernels" in rows[2]
    assert kernel_table([]) == []
