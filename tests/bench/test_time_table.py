"""bench/time_table.py: where a recorded run's time went, read from its own files (docs/results/speedrun1)."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUN = os.path.join(ROOT, "docs", "results", "speedrun1")


def test_phases_and_medians_of_the_speedrun(tmp_path):
    out = tmp_path / "table.json"
    subprocess.run([sys.executable, os.path.join(ROOT, "bench", "time_table.py"), RUN, "--json", str(out)],
                   check=True, capture_output=True, cwd=ROOT)
    (row,) = json.loads(out.read_text())
    assert row["sft_steps"] == 872 and row["iterations"] == 205
    # the time-stamped log: start-up, SFT to the RL memory plan, RL to the time limit, then the export
    assert round(row["sft_phase_s"]) == 156 and round(row["rl_phase_s"]) == 557 and round(row["command_s"]) == 719
    assert abs(row["startup_s"] + row["sft_phase_s"] + row["rl_phase_s"] + row["after_rl_s"] - row["command_s"]) < 1e-6
    # the iteration medians are bench/iteration_result.py's, and MFU counts the 15-block critic of the config
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    from iteration_result import run_result
    assert row["s_per_iteration"] == run_result(RUN)["iteration_s"]
    assert 0 < row["update_mfu"] < row["sft_mfu"] < 1


def test_a_model_of_unknown_shape_is_refused_in_one_line(tmp_path):
    """MFU counts a model's FLOPs: a run of a model the table has no shape for is refused, never counted as SmolLM2."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    for cfg in (run / "config.yaml", run / "sft" / "config.yaml"):
        cfg.write_text(cfg.read_text().replace("/root/stage/smollm2.gguf", "/models/qwen2.5-3b").replace(
            "/root/res/run/sft/hf", "/models/qwen2.5-3b-sft"))
    p = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "time_table.py"), str(run)],
                       capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 1 and p.stderr.strip().startswith("error:") and "SHAPES" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
