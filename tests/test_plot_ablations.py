"""Ablation files layer onto the base config and switch exactly what they say; the plot script draws runs."""
import glob
import json
import os

import pytest

from r1.config import load_config, to_dict


# read against the synchronous recipe (configs/ablations/README.md): layered after synchronous.yaml
AFTER_SYNC = {"fast", "overlap", "overlap_process", "share_prefix", "precision_bf16", "lora"}


@pytest.mark.parametrize("path", sorted(glob.glob("configs/ablations/*.yaml")))
def test_ablation_changes_only_its_keys(path):
    import yaml

    recipe = ["configs/gsm8k_tool.yaml"]
    if os.path.basename(path)[:-5] in AFTER_SYNC:
        recipe.append("configs/ablations/synchronous.yaml")
    base = to_dict(load_config(recipe))
    layered = to_dict(load_config(recipe + [path]))
    with open(path) as f:
        wanted = {(s, k) for s, keys in yaml.safe_load(f).items() for k in keys}
    changed = {(s, k) for s in base for k in base[s] if base[s][k] != layered[s][k]}
    assert changed and changed <= wanted


def test_plot_writes_a_png(tmp_path):
    from r1.plot import plot

    for name, rewards in (("ppo", [0.1, 0.2, 0.4]), ("grpo", [0.1, 0.15, 0.3])):
        os.makedirs(tmp_path / name)
        with open(tmp_path / name / "metrics.jsonl", "w") as f:
            for i, r in enumerate(rewards, 1):
                f.write(json.dumps({"iter": i, "reward_mean": r, **({"eval_accuracy": r / 2} if i % 2 else {})}) + "\n")
    out = plot([str(tmp_path / "ppo"), str(tmp_path / "grpo")], ["reward_mean", "eval_accuracy"], str(tmp_path / "c.png"))
    with open(out, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_moving_average_by_hand():
    from r1.plot import moving_average

    assert moving_average([1.0, 2.0, 3.0, 4.0], 2) == [1.0, 1.5, 2.5, 3.5]
    assert moving_average([1.0, 3.0], 5) == [1.0, 2.0]
    assert moving_average([1.0, 3.0], 1) == [1.0, 3.0]


def test_series_against_time_puts_each_point_at_its_iterations_seconds():
    """--x time: a point at its iteration's time_elapsed (the held-out read of iteration 0 at 0 s, an eval row that
    shares its iteration's line or comes on a line of its own), a point whose iteration has no time left out."""
    from r1.plot import series

    rows = [{"iter": 0, "eval_accuracy": 0.09},
            {"iter": 1, "reward_mean": 0.1, "time_elapsed": 16.8},
            {"iter": 2, "reward_mean": 0.2, "time_elapsed": 22.5, "eval_accuracy": 0.1},
            {"iter": 3, "eval_accuracy": 0.12}, {"iter": 3, "reward_mean": 0.3, "time_elapsed": 28.4},
            {"iter": 4, "eval_accuracy": 0.2}]
    assert series(rows, "reward_mean", "time") == ([16.8, 22.5, 28.4], [0.1, 0.2, 0.3])
    assert series(rows, "eval_accuracy", "time") == ([0.0, 22.5, 28.4], [0.09, 0.1, 0.12])
    assert series(rows, "eval_accuracy") == ([0, 2, 3, 4], [0.09, 0.1, 0.12, 0.2])


def test_plot_cli_against_time_writes_a_png(tmp_path):
    from r1 import plot

    os.makedirs(tmp_path / "run")
    with open(tmp_path / "run" / "metrics.jsonl", "w") as f:
        for i in (1, 2, 3):
            f.write(json.dumps({"iter": i, "reward_mean": 0.1 * i, "time_elapsed": 5.5 * i}) + "\n")
    plot.main([str(tmp_path / "run"), "--out", str(tmp_path / "t.png"), "--x", "time"])
    assert (tmp_path / "t.png").read_bytes()[:4] == b"\x89PNG"


def test_series_against_time_lays_a_resumed_runs_sessions_end_to_end():
    """time_elapsed starts again at 0 in a resumed session: its points follow the first session's last second."""
    from r1.plot import series

    rows = [{"iter": 1, "reward_mean": 0.1, "time_elapsed": 10.0}, {"iter": 2, "reward_mean": 0.2, "time_elapsed": 29.4},
            {"iter": 3, "reward_mean": 0.3, "time_elapsed": 24.2}, {"iter": 4, "reward_mean": 0.4, "time_elapsed": 63.1}]
    assert series(rows, "reward_mean", "time") == ([10.0, 29.4, 29.4 + 24.2, 29.4 + 63.1], [0.1, 0.2, 0.3, 0.4])


def test_plot_against_time_of_a_run_without_time_is_one_line(tmp_path):
    from r1 import plot

    os.makedirs(tmp_path / "sft")
    (tmp_path / "sft" / "metrics.jsonl").write_text(json.dumps({"iter": 1, "sft_loss": 1.0}) + "\n")
    with pytest.raises(SystemExit, match="--x time: .*sft logs no time_elapsed"):
        plot.main([str(tmp_path / "sft"), "--out", str(tmp_path / "t.png"), "--x", "time", "--keys", "sft_loss"])
    assert not (tmp_path / "t.png").exists()
