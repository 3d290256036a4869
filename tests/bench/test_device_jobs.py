"""The commands of bench/device.py's jobs, as --dry-run prints them without running anything: which lanes run,
what each adds to the command it is compared with, which GPU each phase is pinned to, and the ablation files
layered under every command. A device session spent on the wrong lane is found here."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEVICE = os.path.join(ROOT, "bench", "device.py")


def dry(tmp_path, *args) -> dict:
    """{phase: (environment words, command words)} in the order the job runs them; nothing is written."""
    r = subprocess.run([sys.executable, DEVICE, args[0], str(tmp_path / "res"), *args[1:], "--dry-run"],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert not (tmp_path / "res").exists()
    out = {}
    for line in r.stdout.splitlines():
        words = line.split()
        if words[1:2] == ["dry"]:
            cmd = words[3:]
            k = next(i for i, w in enumerate(cmd) if "=" not in w or w.startswith(("/", "torchrun")))
            out[words[2].rstrip(":")] = (cmd[:k], cmd[k + 1:])
    return out


def refused(tmp_path, *args) -> str:
    r = subprocess.run([sys.executable, DEVICE, args[0], str(tmp_path / "res"), *args[1:]], capture_output=True,
                       text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 2, r.stdout + r.stderr
    assert not (tmp_path / "res").exists()
    return r.stderr


def without(words, lane, base, key):
    """The lane's command less `key`, with the lane's name spelled as the base's."""
    more = list(words)
    assert key in more
    more.remove(key)
    return sorted(w.replace(lane, base) for w in more)


def test_iteration_lanes_named_in_only_are_the_ones_that_run(tmp_path):
    runs = dry(tmp_path, "iteration", "--model", "m", "--only", "ppo-o0", "ppo-o2")
    assert list(runs) == ["ppo-o0", "ppo-o2"]
    assert "train.overlap=2" in runs["ppo-o2"][1] and "train.overlap=2" not in runs["ppo-o0"][1]
    assert "--only names ppo-o3, not a lane" in refused(tmp_path, "iteration", "--model", "m", "--only", "ppo-o3")


def test_iteration_at_the_3b_shape_makes_its_model_then_runs_three_ppo_lanes(tmp_path):
    tok = tmp_path / "tok"
    tok.mkdir()
    (tok / "tokenizer.json").write_text("{}")
    runs = dry(tmp_path, "iteration", "--shape", "3b", "--tokenizer", str(tok))
    assert list(runs) == ["random-model", "ppo-o0", "ppo-o1", "ppo-o2"]
    assert all({"rollout.prompts=32", "run.save=false", "train.steps=4"} <= set(runs[n][1]) for n in list(runs)[1:])
    assert "needs --tokenizer" in refused(tmp_path, "iteration", "--shape", "3b")


def test_iteration_fuse_train_lanes_run_under_the_switch_alone(tmp_path):
    runs = dry(tmp_path, "iteration", "--model", "m", "--only", "ppo-o0", "ppo-o0-ft", "ppo-o2-ft")
    assert runs["ppo-o0"][0] == [] and runs["ppo-o0-ft"][0] == runs["ppo-o2-ft"][0] == ["R1_FUSE_TRAIN=1"]
    assert sorted(w.replace("ppo-o0-ft", "ppo-o0") for w in runs["ppo-o0-ft"][1]) == sorted(runs["ppo-o0"][1])


def test_iteration_sets_add_their_key_and_nothing_else(tmp_path):
    """-sp adds train.share_prefix=true; -bf adds train.precision=bf16; -mb1 algo.minibatches=1; -scored
    train.score_policy=always: each lane is the lane it is compared with plus one key."""
    runs = dry(tmp_path, "iteration", "--model", "m")
    pairs = [(b, b + "-sp", "train.share_prefix=true") for b in ("ppo-o0", "grpo-o0", "ppo-o2", "grpo-o2")]
    pairs += [(b, b + "-bf", "train.precision=bf16") for b in ("ppo-o0-sp", "grpo-o0-sp", "ppo-o2-sp", "grpo-o2-sp")]
    pairs += [("grpo-o0-sp-bf", "grpo-o0-sp-bf-mb1", "algo.minibatches=1"),
              ("grpo-o0-sp-bf-mb1", "grpo-o0-sp-bf-mb1-scored", "train.score_policy=always"),
              ("grpo-o2-sp-bf", "grpo-o2-sp-bf-mb1", "algo.minibatches=1"),
              ("ppo-o2-sp-bf", "ppo-o2-sp-bf-mb1", "algo.minibatches=1")]
    for base, lane, key in pairs:
        assert without(runs[lane][1], lane, base, key) == sorted(runs[base][1]), lane


@pytest.mark.parametrize("job, first, lanes", [
    ("precision", ["gpu-test"], ["ppo-o2-sp", "ppo-o2-sp-bf", "grpo-o2-sp", "grpo-o2-sp-bf", "grpo-o0-sp-bf-mb1-scored",
                                 "grpo-o0-sp-bf-mb1", "grpo-o2-sp-bf-mb1", "ppo-o2-sp-bf-mb1"]),
    ("share-prefix", ["gpu-test", "bench-135m", "bench-3b"], ["ppo-o0", "ppo-o0-sp", "grpo-o0", "grpo-o0-sp", "ppo-o2",
                                                              "ppo-o2-sp"]),
])
def test_iteration_sets_run_their_tests_then_the_sft_then_their_lanes(tmp_path, job, first, lanes):
    runs = dry(tmp_path, job, "--model", "m.gguf")
    assert list(runs) == first + ["sft"] + lanes
    assert "train.steps=467" in runs["sft"][1] and "model.path=m.gguf" in runs["sft"][1]
    assert all(f"model.path={tmp_path}/res/sft/hf" in runs[n][1] for n in lanes)


def test_ablate_layers_base_abl_under_every_command_and_pins_lanes_to_gpus(tmp_path):
    """--base-abl grpo: every lane's training and reads carry the file right after the config; with --gpus 1 2
    the SFT is on GPU 1, a lane on each GPU, and every read on its lane's GPU."""
    runs = dry(tmp_path, "ablate", "--model", "m.gguf", "--arms", "overlap_process", "--base-abl", "grpo",
               "--test", "recipe", "overlap_process", "--gpus", "1", "2")
    assert list(runs)[0] == "gsm8k/sft" and runs["gsm8k/sft"][0] == ["CUDA_VISIBLE_DEVICES=1"]
    lanes = [n for n in runs if n != "gsm8k/sft"]
    assert sorted(lanes) == sorted(f"gsm8k/{p}-{x}" for p in ("rl", "val", "test") for x in ("recipe", "overlap_process"))
    under = ["--config", "configs/gsm8k_tool_30min.yaml", "--config", "configs/ablations/grpo.yaml"]
    assert all(runs[n][1][1:5] == under for n in lanes)
    assert all(("configs/ablations/overlap_process.yaml" in runs[n][1]) == n.endswith("overlap_process") for n in lanes)
    assert {runs[n][0][0] for n in lanes if n.endswith("recipe")} == {"CUDA_VISIBLE_DEVICES=1"}
    assert {runs[n][0][0] for n in lanes if n.endswith("overlap_process")} == {"CUDA_VISIBLE_DEVICES=2"}
    assert all("train.time_limit=300.0" in runs[n][1] for n in lanes if "/rl-" in n)
    assert all(f"model.path={tmp_path}/res/gsm8k/sft/hf" in runs[n][1] for n in lanes if "/rl-" in n)


def test_ablate_reads_the_recipe_lane_under_an_arm_that_changes_the_environment(tmp_path):
    runs = dry(tmp_path, "ablate", "--model", "m.gguf", "--arms", "max_steps", "grpo")
    as_read = runs["gsm8k/val-recipe-as-max_steps"][1]
    assert "configs/ablations/max_steps.yaml" in as_read and f"model.path={tmp_path}/res/gsm8k/recipe" in as_read
    assert not any("recipe-as-grpo" in n for n in runs)


def test_lora_pair_is_the_ablate_job_with_lora_read_on_test(tmp_path):
    runs = dry(tmp_path, "lora-pair", "--model", "m.gguf")
    assert list(runs) == ["gsm8k/sft", "gsm8k/rl-recipe", "gsm8k/val-recipe", "gsm8k/test-recipe", "gsm8k/rl-lora",
                          "gsm8k/val-lora", "gsm8k/test-lora"]
    assert "train.time_limit=450.0" in runs["gsm8k/rl-lora"][1]


def test_recipe_layers_base_abl_in_every_command_and_reads_validation_last(tmp_path):
    runs = dry(tmp_path, "recipe", "--model", "m.gguf", "--config", "configs/gsm8k_tool_30min_fast.yaml",
               "--base-abl", "score_sampler", "critic_half_share")
    assert list(runs) == ["recipe", "test-sft", "test-final", "result", "val-final"]
    under = ["--config", "configs/gsm8k_tool_30min_fast.yaml", "--config", "configs/ablations/score_sampler.yaml",
             "--config", "configs/ablations/critic_half_share.yaml"]
    assert all(runs[n][1][1:7] == under for n in runs if n != "result")
    assert f"model.path={tmp_path}/res/recipe/sft/hf" in runs["test-sft"][1]
    assert "eval.split=val" in runs["val-final"][1] and "eval.split=test" in runs["test-final"][1]
    assert "no ablation 'critic_halff'" in refused(tmp_path, "recipe", "--model", "m", "--base-abl", "critic_halff")


def test_agent_spreads_shapes_over_gpus_with_each_path_environment(tmp_path):
    runs = dry(tmp_path, "agent", "--gpus", "0", "1", "--paths", "default", "nochunk", "eager", "--schedules",
               "3b=16-sync,8", "--tests", "0")
    assert sorted(runs) == sorted(f"agent-{m}-{p}" for m in ("3b", "135m") for p in ("default", "nochunk", "eager"))
    assert runs["agent-3b-eager"][0] == ["R1_COMPILE=0", "R1_FUSE=0", "R1_CHUNK_GRAPHS=0", "CUDA_VISIBLE_DEVICES=0"]
    assert runs["agent-135m-nochunk"][0] == ["R1_CHUNK_GRAPHS=0", "CUDA_VISIBLE_DEVICES=1"]
    assert runs["agent-3b-default"][1][-2:] == ["--schedules", "16-sync,8"]
    assert "--schedules" not in runs["agent-135m-default"][1]
