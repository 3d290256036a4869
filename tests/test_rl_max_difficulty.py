"""data.rl_max_difficulty: RL's prompts come only from training rows the task measures at most that hard
(GSM8K: the calculations its reference solution marks); 0 leaves every row; SFT, validation and test rows are
never left out; a task without a measure, or a cap that leaves no row, is one line naming the key."""
import os
import subprocess
import sys

import pytest

from r1.config import ConfigError, load_config
from r1.tasks import builtin
from r1.tasks.data import load_rows, rl_rows
from r1.tasks.registry import TASKS, Task, get_task, register_task

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMOKE = os.path.join(ROOT, "configs", "smoke.yaml")
TOOL = os.path.join(ROOT, "configs", "gsm8k_tool.yaml")
TINY = ["rollout.prompts=4", "rollout.n=2", "rollout.max_new_tokens=8", "data.train_size=32", "data.test_size=4",
        "log.tensorboard=false", "log.trajectories=false"]


def graded(row) -> int:
    """A made-up difficulty for the synthetic rows: their answer modulo 3."""
    return int(row["answer"]) % 3


@pytest.fixture
def graded_task():
    synthetic = get_task("synthetic")
    task = register_task(Task("synthetic_graded", synthetic.rows, synthetic.env, tools=synthetic.tools,
                              expert=synthetic.expert, difficulty=graded), replace=True)
    yield task.name
    TASKS.pop(task.name, None)


def test_gsm8k_difficulty_counts_the_reference_calculations():
    row = {"solution": "She has <<2*3=6>>6 and <<6+4=10>>10, then <<10/2=5>>5.\n#### 5"}
    assert builtin.calculations(row) == 3
    assert builtin.calculations({"solution": "No calculator here.\n#### 5"}) == 0
    assert get_task("gsm8k_tool").difficulty is builtin.calculations is get_task("gsm8k").difficulty


def test_a_cap_keeps_the_rows_no_harder_in_their_order():
    cfg = load_config(TOOL, ["data.rl_max_difficulty=2"])
    rows = load_rows(cfg, "train")
    kept = rl_rows(cfg, rows)
    assert kept == [r for r in rows if builtin.calculations(r) <= 2]
    assert 0 < len(kept) < len(rows)
    assert rl_rows(load_config(TOOL), rows) is rows  # 0: every row, the same list
    # validation and test are never filtered: the cap changes neither split
    for split in ("val", "test"):
        assert load_rows(cfg, split) == load_rows(load_config(TOOL), split)


def test_a_cap_that_leaves_nothing_and_a_task_without_a_measure_are_one_line():
    cfg = load_config(TOOL, ["data.rl_max_difficulty=1", "data.train_size=3"])
    rows = [r for r in load_rows(load_config(TOOL), "train") if builtin.calculations(r) >= 3][:3]
    with pytest.raises(ValueError, match=r"data.rl_max_difficulty=1 leaves none of the 3 training rows"):
        rl_rows(cfg, rows)
    with pytest.raises(ConfigError) as e:
        load_config(SMOKE, ["data.rl_max_difficulty=2"])
    assert "task synthetic has no difficulty measure" in str(e.value) and "\n" not in str(e.value)


def test_the_trainer_draws_its_prompts_from_the_capped_rows(tmp_path, graded_task):
    from r1.trainer import Trainer

    base = [f"data.task={graded_task}", *TINY, "train.steps=1"]
    trainer = Trainer(load_config(SMOKE, [f"run.dir={tmp_path / 'capped'}", *base, "data.rl_max_difficulty=1"]))
    assert trainer.train_rows == load_rows(trainer.cfg, "train") and len(trainer.train_rows) == 32
    assert trainer.rl_rows == [r for r in trainer.train_rows if graded(r) <= 1]
    drawn = [r for it in range(12) for r in trainer.prompts_for(it)]  # several epochs of the capped rows
    assert drawn and all(graded(r) <= 1 for r in drawn)
    assert {r["id"] for r in drawn} == {r["id"] for r in trainer.rl_rows}
    whole = Trainer(load_config(SMOKE, [f"run.dir={tmp_path / 'whole'}", *base]))
    assert whole.rl_rows is whole.train_rows
    assert any(graded(r) == 2 for it in range(12) for r in whole.prompts_for(it))


def test_train_py_refuses_a_cap_that_leaves_no_row_before_its_sft_phase(tmp_path):
    """The recipe's SFT phase takes minutes on a GPU: a cap that leaves RL no row is refused before it, and
    nothing is left behind."""
    run = tmp_path / "run"
    r = subprocess.run([sys.executable, "train.py", "--config", os.path.join(ROOT, "configs", "gsm8k_tool.yaml"),
                        "data.rl_max_difficulty=1", "data.train_size=2", "data.val_size=0", "eval.split=test",
                        f"run.dir={run}", "train.sft_steps=1"],
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines()[-1] == ("error: data.rl_max_difficulty=1 leaves none of the 2 training rows "
                                                  "of data.task=gsm8k_tool: raise it, or 0 for every row")
    assert not run.exists() and "SFT step" not in r.stderr + r.stdout
