"""bench/iteration_result.py reads a run's own files: medians over iterations 2..n (2..n-1 with overlap: the
last overlapped iteration starts no rollout), the fields the issue asks for, and a refusal for a run too short
to have a median."""
import json
import os
import subprocess
import sys

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from iteration_result import run_result  # noqa: E402


def fake_run(path, lines, overlap=1):
    os.makedirs(path)
    cfg = {"algo": {"advantage": "grpo", "policy_loss": "decoupled_ppo"}, "run": {"memory_fraction": 1.0},
           "model": {"path": "/root/res/sft/hf"},
           "train": {"overlap": overlap, "micro_tokens": 0}}
    with open(os.path.join(path, "config.yaml"), "w") as f:
        yaml.safe_dump(cfg, f)
    with open(os.path.join(path, "metrics.jsonl"), "w") as f:
        for m in lines:
            f.write(json.dumps(m) + "\n")


def line(elapsed, roll, score, train, play):
    return {"time_elapsed": elapsed, "time_rollout": roll, "time_score": score, "time_train": train,
            "time_rollout_play": play, "reward_mean": 0.5}


def test_medians_skip_the_first_iteration(tmp_path):
    lines = [line(30, 20, 9, 9, 20), line(34, 0.1, 1, 2, 3), line(39, 0.3, 2, 3, 4), line(42, 0.2, 3, 1, 5)]
    run = str(tmp_path / "grpo-o0")
    fake_run(run, lines, overlap=0)
    r = run_result(run)
    assert (r["name"], r["algo"], r["overlap"], r["micro_tokens"]) == ("iteration", "grpo", 0, "auto")
    assert r["model"] == "/root/res/sft/hf" and r["medians_over"] == "iterations 2..n"
    assert (r["iteration_s"], r["rollout_s"], r["score_s"], r["update_s"], r["rollout_play_s"]) == (4, 0.2, 2, 2, 4)


def test_the_validation_read_before_rl_is_no_iteration(tmp_path):
    """A run with eval.every > 0 logs its validation read before RL as iteration 0, a line of eval_* keys only."""
    before = {"iter": 0, "eval_n": 200.0, "eval_accuracy": 0.105}
    lines = [line(30, 20, 9, 9, 20), line(34, 0.1, 1, 2, 3), line(39, 0.3, 2, 3, 4), line(42, 0.2, 3, 1, 5)]
    run = str(tmp_path / "ppo-o0")
    fake_run(run, [before] + lines, overlap=0)
    r = run_result(run)
    assert r["iterations"] == 4
    assert (r["iteration_s"], r["rollout_s"], r["score_s"], r["update_s"]) == (4, 0.2, 2, 2)


def test_an_overlapped_run_leaves_out_its_last_iteration_too(tmp_path):
    """Its last iteration starts no next rollout, so it is faster than the others; counting it favoured overlap."""
    lines = [line(30, 20, 9, 9, 20), line(34, 0.1, 1, 2, 3), line(39, 0.3, 2, 3, 4), line(44, 0.2, 3, 1, 5),
             line(45, 0.0, 0.5, 0.5, 0)]
    run = str(tmp_path / "grpo-o1")
    fake_run(run, lines)
    r = run_result(run)
    assert r["medians_over"] == "iterations 2..n-1" and r["iterations"] == 5
    assert (r["iteration_s"], r["rollout_s"], r["score_s"], r["update_s"], r["rollout_play_s"]) == (5, 0.2, 2, 2, 4)


def test_thread_cpu_seconds_and_fallbacks_under_overlap(tmp_path):
    """Overlap runs log each thread's CPU seconds (medians, iterations 2..n) and eager-op fallbacks (a sum);
    runs without them report neither."""
    run = str(tmp_path / "ppo-o1")
    lines = [line(30, 20, 9, 9, 20), line(34, 0.1, 1, 2, 3), line(39, 0.3, 2, 3, 4), line(42, 0.2, 3, 1, 5),
             line(43, 0, 0.5, 0.5, 0)]  # the last: no next rollout, out of the medians, in the counts
    for m, cr, cm, fb, cd in zip(lines, (None, 1.0, 2.0, 3.0, 9.0), (9, 2.5, 1.5, 0.5, 0.1), (40, 2, 0, 0, 0),
                                 (0, 7, 5, 3, 0)):
        m.update({"cpu_main_s": cm, "eager_op_fallbacks": fb, "captures_deferred": cd,
                  **({} if cr is None else {"cpu_rollout_s": cr, "rollout_idle_s": cr / 100})})
    fake_run(run, lines)
    r = run_result(run)
    assert (r["cpu_rollout_s"], r["cpu_main_s"], r["eager_op_fallbacks"], r["captures_deferred"]) == (2.0, 1.5, 42, 15)
    assert r["rollout_idle_s"] == 0.02  # overlap 2's hand-over: the median as the CPU seconds
    del lines[3]["cpu_rollout_s"]  # an iteration that played its own rollout: the median of the others
    fake_run(str(tmp_path / "ppo-o1b"), lines)
    assert run_result(str(tmp_path / "ppo-o1b"))["cpu_rollout_s"] == 1.5
    plain = str(tmp_path / "grpo-o0")
    fake_run(plain, [line(30, 20, 9, 9, 20), line(34, 0.1, 1, 2, 3), line(39, 0.3, 2, 3, 4)], overlap=0)
    assert not {"cpu_rollout_s", "cpu_main_s", "rollout_idle_s", "eager_op_fallbacks",
                "captures_deferred"} & set(run_result(plain))


def test_a_short_run_is_refused(tmp_path):
    run = str(tmp_path / "short")
    fake_run(run, [line(1, 1, 1, 1, 1), line(2, 1, 1, 1, 1)])
    out = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "iteration_result.py"), "--runs", run],
                         capture_output=True, text=True)
    assert out.returncode == 2 and "need at least 3" in out.stderr
    with pytest.raises(SystemExit):
        run_result(run)


def test_a_folder_that_is_not_a_run_is_one_line(tmp_path):
    for folder, made in ((tmp_path / "nope", False), (tmp_path / "empty", True)):
        if made:
            folder.mkdir()
        out = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "iteration_result.py"), "--runs",
                              str(folder)], capture_output=True, text=True)
        assert out.returncode == 2 and out.stderr.strip() == f"error: {folder}: no config.yaml (a train.py run folder?)"


def test_response_lengths_where_the_run_logged_them(tmp_path):
    """mean_response_len and max_response_len (the rollout's tail): medians over iterations 2..n, and absent
    for a run whose metrics lack them (runs from before max_response_len was logged)."""
    lens = [(300, 900), (150, 400), (160, 380), (170, 500)]
    lines = [{**line(30 + 4 * k, 1, 1, 1, 1), "mean_response_len": m, "max_response_len": x}
             for k, (m, x) in enumerate(lens)]
    run = str(tmp_path / "with")
    fake_run(run, lines, overlap=0)
    r = run_result(run)
    assert (r["mean_response_len"], r["max_response_len"]) == (160, 400)
    old = str(tmp_path / "without")
    fake_run(old, [line(30 + 4 * k, 1, 1, 1, 1) for k in range(4)], overlap=0)
    assert "max_response_len" not in run_result(old)
