"""The closing summary names the split its accuracy line is on: a validation curve is not a test score."""
import json

from r1.summary import summarize_run


def _run(tmp_path, split):
    rows = [{"iter": 0, "eval_n": 4, "eval_accuracy": 0.25}, {"iter": 1, "reward_mean": 0.5, "accuracy": 0.5},
            {"iter": 1, "eval_n": 4, "eval_accuracy": 0.5}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if split is not None:
        (tmp_path / "config.yaml").write_text(f"eval:\n  split: {split}\n")
    return "\n".join(summarize_run(str(tmp_path)))


def test_accuracy_line_names_the_split(tmp_path):
    assert "validation accuracy (4 problems, greedy): 25.0% before RL -> 50.0% after iteration 1" in \
        _run(tmp_path, "val")


def test_test_split_and_unreadable_config_say_held_out(tmp_path):
    assert "held-out accuracy (4 problems, greedy)" in _run(tmp_path, "test")
    (tmp_path / "config.yaml").write_text("eval: [unclosed\n")
    assert "held-out accuracy (4 problems, greedy)" in "\n".join(summarize_run(str(tmp_path)))
    (tmp_path / "config.yaml").unlink()
    assert "held-out accuracy (4 problems, greedy)" in "\n".join(summarize_run(str(tmp_path)))


def test_next_steps_name_only_what_the_run_wrote(tmp_path):
    """A benchmark (run.save=false, log.trajectories=false, log.tensorboard=false) gets no hint to evaluate an hf/
    or read trajectories it never wrote; a run that wrote them gets each, at its last saved iteration."""
    bare = _run(tmp_path, "test")
    assert "--keys reward_mean --out reward_mean.png" in bare
    assert "eval.py" not in bare and "r1.trajectory show" not in bare and "tensorboard --logdir" not in bare
    for folder, name in (("hf", "config.json"), ("trajectories", "iter_000003.jsonl.gz"), ("tb", "events.out")):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / name).write_text("")
    full = "\n".join(summarize_run(str(tmp_path)))
    assert f"python eval.py --config {tmp_path / 'config.yaml'} model.path={tmp_path}" in full
    assert f"r1.trajectory show {tmp_path} --iter 3 --index 0" in full and "tensorboard --logdir" in full


def test_an_sft_run_is_plotted_by_its_loss(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"iter": i, "sft_loss": 1.0 / i}) + "\n" for i in (1, 2)))
    text = "\n".join(summarize_run(str(tmp_path)))
    assert "--keys sft_loss --out sft_loss.png" in text and "reward_mean" not in text
    (tmp_path / "metrics.jsonl").write_text("")
    assert "r1.plot" not in "\n".join(summarize_run(str(tmp_path)))  # nothing logged: nothing to plot


def test_the_recipe_is_suggested_to_runs_of_other_tasks_only(tmp_path):
    """A GSM8K-tool run has met the recipe (it may be the recipe); a smoke or quickstart run is pointed to it."""
    assert "configs/gsm8k_tool.yaml" in _run(tmp_path, "test")  # no task in its config: the default
    (tmp_path / "config.yaml").write_text("data:\n  task: synthetic\n")
    assert "configs/gsm8k_tool.yaml" in "\n".join(summarize_run(str(tmp_path)))
    (tmp_path / "config.yaml").write_text("data:\n  task: gsm8k_tool\n")
    assert "configs/gsm8k_tool.yaml" not in "\n".join(summarize_run(str(tmp_path)))
