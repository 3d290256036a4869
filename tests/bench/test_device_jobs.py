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
    assert runs["ppo-o0"][0] == runs["ppo-o0-ft"][0] == runs["ppo-o2-ft"][0] == []
    assert without(runs["ppo-o0-ft"][1], "ppo-o0-ft", "ppo-o0", "kernels.fuse_train=true") == sorted(runs["ppo-o0"][1])
    assert "kernels.fuse_train=true" in runs["ppo-o2-ft"][1]


def test_iteration_lanes_switch_from_the_first_recipe(tmp_path):
    """The lanes' names (o0: synchronous, no -sp, no -bf) hold of the first recipe, not of today's recipe."""
    runs = dry(tmp_path, "iteration", "--model", "m", "--only", "ppo-o0")
    assert runs["ppo-o0"][1][1:5] == ["--config", "configs/gsm8k_tool.yaml", "--config",
                                      "configs/ablations/first_recipe.yaml"]


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
    under = ["--config", "configs/gsm8k_tool.yaml", "--config", "configs/ablations/grpo.yaml"]
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
    assert runs["gsm8k/rl-lora"][1][1:7] == ["--config", "configs/gsm8k_tool.yaml", "--config",
                                             "configs/ablations/synchronous.yaml", "--config", "configs/ablations/lora.yaml"]


def test_recipe_layers_base_abl_in_every_command_and_reads_validation_last(tmp_path):
    runs = dry(tmp_path, "recipe", "--model", "m.gguf", "--base-abl", "score_sampler", "critic_half_share")
    assert list(runs) == ["recipe", "test-sft", "test-final", "result", "val-final"]
    under = ["--config", "configs/gsm8k_tool.yaml", "--config", "configs/ablations/score_sampler.yaml",
             "--config", "configs/ablations/critic_half_share.yaml"]
    assert all(runs[n][1][1:7] == under for n in runs if n != "result")
    assert f"model.path={tmp_path}/res/recipe/sft/hf" in runs["test-sft"][1]
    assert "eval.split=val" in runs["val-final"][1] and "eval.split=test" in runs["test-final"][1]
    assert "no ablation 'critic_halff'" in refused(tmp_path, "recipe", "--model", "m", "--base-abl", "critic_halff")


def test_speedrun_is_the_recipe_job_with_its_overlay_on_the_recipe(tmp_path):
    """speedrun: every train.py and eval.py command layers configs/ablations/speedrun.yaml on configs/gsm8k_tool.yaml
    (after --base-abl), and the result phase writes RES/speedrun.json through bench/speedrun.py."""
    runs = dry(tmp_path, "speedrun", "--model", "m.gguf", "--commit", "abc123")
    assert list(runs) == ["recipe", "test-sft", "test-final", "result", "val-final"]
    under = ["--config", "configs/gsm8k_tool.yaml", "--config", "configs/ablations/speedrun.yaml"]
    assert all(runs[n][1][1:5] == under and runs[n][1][5].startswith("model.path=") for n in runs if n != "result")
    assert runs["recipe"][1][0] == "train.py" and "model.path=m.gguf" in runs["recipe"][1]
    assert runs["result"][1] == [os.path.join(ROOT, "bench", "speedrun.py"), str(tmp_path / "res")]
    runs = dry(tmp_path, "speedrun", "--model", "m.gguf", "--base-abl", "grpo")
    assert runs["recipe"][1][1:7] == ["--config", "configs/gsm8k_tool.yaml", "--config", "configs/ablations/grpo.yaml",
                                      "--config", "configs/ablations/speedrun.yaml"]
    r = subprocess.run([sys.executable, DEVICE, "--help"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert "speedrun" in r.stdout and "configs/ablations/speedrun.yaml" in r.stdout


def test_agent_spreads_shapes_over_gpus_with_each_path_environment(tmp_path):
    runs = dry(tmp_path, "agent", "--gpus", "0", "1", "--paths", "default", "nochunk", "eager", "--schedules",
               "3b=16-sync,8", "--tests", "0")
    assert sorted(runs) == sorted(f"agent-{m}-{p}" for m in ("3b", "135m") for p in ("default", "nochunk", "eager"))
    assert runs["agent-3b-eager"][0] == ["CUDA_VISIBLE_DEVICES=0"] and "--eager-paths" in runs["agent-3b-eager"][1]
    assert runs["agent-135m-nochunk"][0] == ["CUDA_VISIBLE_DEVICES=1"]
    assert "--no-chunk-graphs" in runs["agent-135m-nochunk"][1]
    assert not {"--eager-paths", "--no-chunk-graphs"} & set(runs["agent-3b-default"][1])
    assert runs["agent-3b-default"][1][-2:] == ["--schedules", "16-sync,8"]
    assert "--schedules" not in runs["agent-135m-default"][1]


JOBS = [("recipe", "--model", "m.gguf"), ("speedrun", "--model", "m.gguf"), ("ablate", "--model", "m", "--arms", "grpo"),
        ("lora-pair", "--model", "m"), ("iteration", "--model", "m"), ("precision", "--model", "m"),
        ("share-prefix", "--model", "m"), ("lora",), ("scale",), ("rollout",),
        ("agent", "--paths", "default", "nochunk", "eager"), ("fa4",), ("compile", "--model", "m"),
        ("learn", "--model", "m"), ("grpo-pair", "--model", "m"), ("cli", "--model", "m"), ("tune", "--model", "m"),
        ("peer-trl", "--model", "m", "--cli-seconds", "60")]
KEEP = ("R1_PROFILE", "R1_SWITCH_US", "R1_CACHE", "R1_TEST_TOKENIZER")  # the R1_* variables that remain


@pytest.mark.parametrize("args", JOBS, ids=[a[0] for a in JOBS])
def test_every_job_sets_kernels_by_config_or_flag_and_its_commands_load(tmp_path, args):
    """No phase of any job sets an R1_* variable other than the four that remain (r1/environment.py refuses the
    rest), and every train.py / eval.py command's config files and overrides load (a renamed config or key is
    found here, not on the device)."""
    from r1.config import load_config

    runs = dry(tmp_path, *args)
    assert runs
    loaded = 0
    for name, (env, cmd) in runs.items():
        for w in env:
            assert not w.startswith("R1_") or w.split("=")[0] in KEEP, (name, w)
        if cmd[:1] not in (["train.py"], ["eval.py"]) and "train.py" not in cmd:
            continue
        cmd = cmd[cmd.index("train.py") + 1:] if "train.py" in cmd else cmd[1:]
        files = [cmd[i + 1] for i, w in enumerate(cmd) if w == "--config"]
        overrides = [w for i, w in enumerate(cmd) if "=" in w and cmd[i - 1] != "--config" and not w.startswith("-")]
        load_config([os.path.join(ROOT, f) for f in files], overrides)
        loaded += 1
    assert loaded or args[0] in ("lora", "rollout", "agent", "fa4")



def test_grpo_pair_refuses_a_removed_switch_as_a_lane_word(tmp_path):
    from r1.environment import MOVED

    name = next(k for k, v in MOVED.items() if v == "kernels.launch_ahead")
    assert f"{name} was removed, write kernels.launch_ahead=false" in refused(
        tmp_path, "grpo-pair", "--model", "m", "--b", f"{name}=0")
    runs = dry(tmp_path, "grpo-pair", "--model", "m", "--b", "R1_SWITCH_US=200", "kernels.mixed_steps=false")
    assert runs["grpo-b"][0] == ["R1_SWITCH_US=200", "CUDA_VISIBLE_DEVICES=1"]
    assert "kernels.mixed_steps=false" in runs["grpo-b"][1]
