"""bench/lora.py: the runs it launches are the config it claims, and its summary reads metrics.jsonl right.

The harness itself ran on the CPU (`python bench/lora.py --shapes tiny --ranks 0,4 --steps 2 --cpu`); its
GPU numbers come from bench/device.py lora.
"""
import json
import os

from bench.lora import ROOT, overrides, summarize
from r1.config import load_config


def load(args: list):
    """load_config of train.py's arguments: --config FILE ... then key=value overrides."""
    files = [args[i + 1] for i, w in enumerate(args) if w == "--config"]
    assert args[:2 * len(files):2] == ["--config"] * len(files)
    return load_config(files, args[2 * len(files):])


def test_a_run_is_ppo_with_critic_and_reference_at_the_gsm8k_tool_batch(tmp_path):
    args = overrides("7b", "/m/7b", "/t", 16, 3, str(tmp_path / "r"), cpu=False)
    assert [os.path.relpath(f, ROOT) for f in args[1:4:2]] == ["configs/gsm8k_tool.yaml",
                                                               "configs/ablations/first_recipe.yaml"]
    cfg = load(args)
    assert cfg.model.lora_rank == 16 and cfg.model.path == "/m/7b" and cfg.model.tokenizer == "/t"
    assert cfg.algo.advantage == "step_gae" and cfg.algo.kl_coef == 0.01 and cfg.train.sft_steps == 0
    assert (cfg.rollout.prompts, cfg.rollout.n, cfg.rollout.max_new_tokens) == (64, 8, 192)
    assert cfg.train.steps == 3 and cfg.eval.every == 0 and not cfg.run.save  # no 64 GiB checkpoint of a 3B
    assert cfg.model.lora_generator == "adapters"
    merged = overrides("7b", "/m/7b", "/t", 16, 3, str(tmp_path / "r"), cpu=False, generator="merged")
    assert load(merged).model.lora_generator == "merged"
    tiny = overrides("tiny", None, None, 0, 2, str(tmp_path / "r"), cpu=True)
    assert load(tiny).model.path == "tiny"


def test_summary_skips_the_first_iteration_and_reports_completion(tmp_path):
    lines = [{"iter": 1, "time_rollout": 10.0, "time_score": 1.0, "time_train": 4.0, "time_other": 1.0,
              "peak_mem_gb": 50.0, "rollout_tok_s": 1.0, "train_tok_s": 2.0},
             {"iter": 2, "time_rollout": 5.0, "time_score": 1.0, "time_train": 3.0, "time_other": 1.0,
              "peak_mem_gb": 60.5, "rollout_tok_s": 1000.0, "train_tok_s": 3000.0},
             {"iter": 3, "time_rollout": 6.0, "time_score": 1.0, "time_train": 4.0, "time_other": 1.0,
              "peak_mem_gb": 60.0, "rollout_tok_s": 2000.0, "train_tok_s": 5000.0}]
    with open(tmp_path / "metrics.jsonl", "w") as f:
        f.write("".join(json.dumps(m) + "\n" for m in lines))
    s = summarize(str(tmp_path), steps=3)
    assert s == {"peak_gib": 60.5, "iteration_s": 11.0, "first_iteration_s": 16.0, "rollout_tok_s": 1500,
                 "train_tok_s": 4000, "completed": True}
    assert not summarize(str(tmp_path), steps=4)["completed"]
    empty = summarize(str(tmp_path / "missing"), steps=3)
    assert empty == {"peak_gib": None, "iteration_s": None, "first_iteration_s": None, "rollout_tok_s": None,
                     "train_tok_s": None, "completed": False}
    assert not os.path.exists(tmp_path / "missing")


def test_a_model_folder_that_was_there_is_never_removed(tmp_path):
    """--models may point at folders the user keeps: only a folder this command wrote goes after its runs."""
    from bench.lora import main

    kept = tmp_path / "models" / "3b"
    kept.mkdir(parents=True)
    (kept / "config.json").write_text("{}")  # not a loadable model: the run fails at start, quickly
    (kept / "notes.txt").write_text("mine")
    main(["--shapes", "3b", "--ranks", "16", "--models", str(tmp_path / "models"), "--runs", str(tmp_path / "runs"),
          "--tokenizer", str(tmp_path / "no-tokenizer"), "--cpu", "--out", str(tmp_path / "out.json")])
    assert (kept / "notes.txt").read_text() == "mine"
    line = json.loads((tmp_path / "out.json").read_text())
    assert line["completed"] is False and line["exit"] != 0
