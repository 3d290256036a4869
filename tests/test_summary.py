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
