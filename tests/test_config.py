"""r1/config.py: files load, overrides are typed by the field, and every kind of bad input
is one line that names the culprit (key, file:line, closest keys, expected type or range).

Pure config, no model or tokenizer: the whole file runs in well under a second.
"""
import dataclasses
import glob
import os

import pytest
import yaml

from r1.config import (AUTO, BOUNDS, CHOICES, Config, ConfigError, all_keys, describe, dump, get, load_config, save,
                       to_dict, validate)
from r1.config_schema import REMOVED

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = sorted(glob.glob(os.path.join(ROOT, "configs", "*.yaml")))


def error(path=None, overrides=()) -> str:
    """The ConfigError message of a load that must fail; it must be one line."""
    with pytest.raises(ConfigError) as e:
        load_config(path, list(overrides))
    message = str(e.value)
    assert "\n" not in message, message
    return message


def write(tmp_path, text, name="c.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# ---------------------------------------------------------------- good input


def test_configs_dir_is_not_empty():
    assert len(CONFIGS) >= 4, CONFIGS  # smoke, quickstart, gsm8k, gsm8k_tool


@pytest.mark.parametrize("path", CONFIGS, ids=os.path.basename)
def test_every_shipped_config_loads_and_roundtrips(path, tmp_path):
    cfg = load_config(path)
    raw = yaml.safe_load(open(path))
    for section, values in raw.items():  # every value in the file reached the Config
        for name, value in values.items():
            want = 0 if value == "auto" and name in ("slots", "micro_tokens") else value  # auto is stored as 0
            assert get(cfg, f"{section}.{name}") == want, f"{section}.{name}"
    again = tmp_path / "config.yaml"
    save(cfg, str(again))
    assert load_config(str(again)) == cfg


def test_defaults_are_valid_and_documented():
    validate(Config())
    text = describe()
    for key in all_keys():
        line = next(l for l in text.splitlines() if l.strip().startswith(key + " ="))
        assert line.split("#", 1)[1].strip(), f"{key} has no docstring"


def test_rule_tables_name_real_keys():
    # A renamed field must not leave a rule behind that silently checks nothing.
    assert set(CHOICES) <= set(all_keys()), set(CHOICES) - set(all_keys())
    assert set(BOUNDS) <= set(all_keys()), set(BOUNDS) - set(all_keys())
    for key, choices in CHOICES.items():
        assert get(Config(), key) in choices, key


def test_overrides_are_typed_by_the_field():
    cfg = load_config(None, [
        "train.steps=7", "train.lr=1e-5", "train.critic_lr=0.003", "algo.whiten=true", "log.progress=False",
        "model.tokenizer=null", "model.ref_path=None", "env.tools=calculator", "algo.advantage=grpo",
        "run.dir=0755", "eval.split=1", "algo.gamma=1", "algo.entropy_coef=-0.01",
    ])
    assert cfg.train.steps == 7 and type(cfg.train.steps) is int
    assert cfg.train.lr == 1e-5 and type(cfg.train.lr) is float  # YAML 1.1 alone would give the string "1e-5"
    assert cfg.train.critic_lr == 0.003
    assert cfg.algo.whiten is True and cfg.log.progress is False
    assert cfg.model.tokenizer is None and cfg.model.ref_path is None
    assert cfg.env.tools == ["calculator"]
    assert cfg.algo.advantage == "grpo"
    assert cfg.run.dir == "0755" and cfg.eval.split == "1"  # a str field keeps the text as written (no octal)
    assert cfg.algo.gamma == 1.0 and type(cfg.algo.gamma) is float
    assert cfg.algo.entropy_coef == -0.01


def test_override_list_forms_and_last_wins():
    assert load_config(None, ["env.tools=[calculator]"]).env.tools == ["calculator"]
    assert load_config(None, ["env.tools= calculator , calculator"]).env.tools == ["calculator", "calculator"]
    assert load_config(None, ["data.task=gsm8k", "env.tools="]).env.tools == []  # a task without tools
    assert load_config(None, ["env.tools=null"]).env.tools is None  # the task's own tools
    assert load_config(None, ["train.steps=3", "train.steps=5"]).train.steps == 5


def test_overrides_beat_the_file(tmp_path):
    path = write(tmp_path, "train:\n  steps: 3\n  lr: 1e-5\nmodel:\n  tokenizer: some/dir\n")
    cfg = load_config(path, ["train.steps=9", "model.tokenizer=null"])
    assert cfg.train.steps == 9 and cfg.train.lr == 1e-5 and cfg.model.tokenizer is None


def test_file_forms(tmp_path):
    # An empty section keeps defaults; a dotted key at the top level works; a number for a str field is its text.
    path = write(tmp_path, "algo:\n  # nothing yet\nalgo.gamma: 0.5\nrun:\n  dir: 2024\n")
    cfg = load_config(path)
    assert cfg.algo.gamma == 0.5 and cfg.algo.lam == 1.0 and cfg.run.dir == "2024"
    assert load_config(write(tmp_path, "", "empty.yaml")) == Config()


def test_resolved_config_roundtrips_through_dump(tmp_path):
    gsm8k = os.path.join(ROOT, "configs", "gsm8k.yaml")  # a task without tools, so env.tools= is valid
    cfg = load_config(gsm8k, ["model.tokenizer=a/b", "run.dir=0755", "eval.split=1e3", "env.tools=",
                              "train.lr=1e-7", "algo.whiten=true", "eval.out=null", "run.seed=123"])
    assert yaml.safe_load(dump(cfg)) == to_dict(cfg)
    path = write(tmp_path, dump(cfg), "dumped.yaml")
    assert load_config(path) == cfg


# ---------------------------------------------------------------- bad input


def test_unknown_key_in_file_names_file_line_and_close_keys(tmp_path):
    path = write(tmp_path, "algo:\n  gamma: 0.9\n  clip_hi: 0.3\n")
    msg = error(path)
    assert "'algo.clip_hi'" in msg and f"{path}:3" in msg and "algo.clip_high" in msg


def test_unknown_key_on_command_line_names_close_keys():
    msg = error(None, ["algo.clip_hi=0.3"])
    assert "'algo.clip_hi'" in msg and "command line" in msg and "algo.clip_high" in msg
    assert "algo.clip_high" in error(None, ["train.clip_high=0.3"])  # right name, wrong section
    assert "train.lr" in error(None, ["lr=1e-5"])  # no section at all
    assert "'algo.gamma.x'" in error(None, ["algo.gamma.x=1"])


def test_unknown_section_and_stray_key_in_file(tmp_path):
    msg = error(write(tmp_path, "run:\n  seed: 1\nalgoo:\n  gamma: 1\n"))
    assert "'algoo'" in msg and "c.yaml:3" in msg and "did you mean algo?" in msg
    msg = error(write(tmp_path, "lr: 1e-5\n", "stray.yaml"))
    assert "'lr'" in msg and "stray.yaml:1" in msg and "train.lr" in msg


@pytest.mark.parametrize("override, expected", [
    ("train.steps=many", "expects int"), ("train.steps=4.0", "expects int"), ("train.lr=abc", "expects float"),
    ("algo.whiten=1", "expects true or false"), ("algo.whiten=maybe", "expects true or false"),
    ("train.lr=nan", "finite"), ("algo.gamma=.inf", "finite"), ("train.steps=", "expects int"),
    ("env.tools=[1, [2]]", "expects str"), ("run.dir=null", "expects str"), ("eval.split=None", "expects str"),
])
def test_wrong_type_on_command_line_names_key_and_type(override, expected):
    msg = error(None, [override])
    key = override.split("=")[0]
    assert f"'{key}'" in msg and "command line" in msg and expected in msg, msg


def test_wrong_type_in_file_names_key_line_and_type(tmp_path):
    path = write(tmp_path, "run:\n  seed: 1\ntrain:\n  steps: many\n")
    msg = error(path)
    assert "'train.steps'" in msg and f"{path}:4" in msg and "expects int" in msg
    msg = error(write(tmp_path, "algo:\n  whiten: [1]\n", "w.yaml"))
    assert "'algo.whiten'" in msg and "w.yaml:2" in msg and "true or false" in msg
    msg = error(write(tmp_path, "run:\n  dir: [a]\n", "d.yaml"))
    assert "'run.dir'" in msg and "expects str" in msg


def test_choices_name_the_options(tmp_path):
    msg = error(None, ["algo.advantage=grp"])
    assert "'algo.advantage'" in msg and "grpo" in msg and "step_gae" in msg
    msg = error(write(tmp_path, "rollout:\n  dtype: 16\n"))  # a number must not slip past the choices as "16"
    assert "'rollout.dtype'" in msg and "bfloat16" in msg


@pytest.mark.parametrize("old, new, value, in_file", [
    ("env.malformed_penalty", "env.rewards.malformed=-0.1", "-0.1", "env: rewards: {malformed: -0.1}"),
    ("env.format_reward", "env.rewards.format=0.05", "0.05", "env: rewards: {format: 0.05}"),
    ("env.tool_success_reward", "env.rewards.tool_success=0.1", "0.1", "env: rewards: {tool_success: 0.1}"),
    ("env.command_reward", "env.rewards.command=0.2", "0.2", "env: rewards: {command: 0.2}"),
    ("run.dtype", "rollout.dtype=float32", "float32", "rollout: dtype: float32"),
])
def test_a_removed_key_is_refused_naming_the_new_one(tmp_path, old, new, value, in_file):
    assert set(REMOVED) == {"env.malformed_penalty", "env.format_reward", "env.tool_success_reward",
                            "env.command_reward", "run.dtype"}
    assert error(None, [f"{old}={value}"]) == f"config key '{old}' (command line) was removed: write {new}"
    section, name = old.split(".")
    path = write(tmp_path, f"{section}:\n  {name}: {value}\n")
    assert error(path) == f"config key '{old}' in {path}:2 was removed: write {in_file}"
    assert "\n" not in error(path)


def test_a_shaping_weight_is_one_entry_of_env_rewards():
    base = os.path.join(ROOT, "configs", "gsm8k_tool.yaml")
    assert load_config(base).env.rewards == {"malformed": -0.1}
    assert load_config(base, ["env.rewards.format=0.05"]).env.rewards == {"malformed": -0.1, "format": 0.05}
    assert load_config(base, ["env.rewards={format: 0.05}"]).env.rewards == {"format": 0.05}  # a whole mapping
    assert error(None, ["env.rewards.nope.x=1"]).startswith("unknown config key 'env.rewards.nope.x'")
    assert "unknown reward 'nope'" in error(None, ["env.rewards.nope=1"])
    assert "'env.rewards.format'" in error(None, ["env.rewards.format=lots"])
    assert "'run.dir.x'" in error(None, ["run.dir.x=1"])  # only a mapping key has entries


@pytest.mark.parametrize("key", AUTO)
def test_auto_has_one_spelling(tmp_path, key):
    assert error(None, [f"{key}=0"]) == f"config key '{key}' (command line): write auto (the value is then picked " \
                                        f"for the run), not 0"
    section, name = key.split(".")
    path = write(tmp_path, f"{section}:\n  {name}: 0\n")
    assert error(path).startswith(f"config key '{key}' in {path}:2: write auto")
    cfg = load_config(None, [f"{key}=auto"])
    assert get(cfg, key) == 0 and yaml.safe_load(dump(cfg))[section][name] == "auto"
    assert load_config(write(tmp_path, dump(cfg), "saved.yaml")) == cfg  # the saved config.yaml loads back
    assert f"{key} = auto" in describe(section)


@pytest.mark.parametrize("overrides, key, expected", [
    (["rollout.n=0"], "rollout.n", ">= 1"), (["train.steps=-1"], "train.steps", ">= 0"),
    (["rollout.top_p=1.5"], "rollout.top_p", "(0, 1]"),
    (["rollout.top_p=0"], "rollout.top_p", "(0, 1]"), (["algo.gamma=1.1"], "algo.gamma", "in [0.0, 1.0]"),
    (["algo.dual_clip=0.5"], "algo.dual_clip", "> 1"), (["env.rewards.malformed=0.5"], "env.rewards", "<= 0"),
    (["data.level=99"], "data.level", "[1, 8]"), (["env.tools=calc"], "env.tools", "calculator"),
    (["data.task=gsm8k", "env.tools=[calculator]"], "env.tools", "takes no tools"), (["rollout.max_new_tokens=4096"], "rollout.max_new_tokens", "max_context"),
    (["rollout.n=1", "algo.advantage=grpo"], "rollout.n", ">= 2"),
    (["train.time_limit=-5"], "train.time_limit", ">= 0"),
])
def test_out_of_range_values_name_key_and_rule(overrides, key, expected):
    msg = error(None, overrides)
    assert f"'{key}'" in msg and expected in msg, msg


def test_range_error_in_file_names_its_line(tmp_path):
    path = write(tmp_path, "rollout:\n  prompts: 4\n  n: 0\n")
    msg = error(path)
    assert "'rollout.n'" in msg and f"{path}:3" in msg and ">= 1" in msg


def test_bad_yaml_names_file_and_line(tmp_path):
    path = write(tmp_path, "train:\n  steps: 3\n  lr: [1\n  warmup: 2\nalgo:\n  gamma: 1\n")
    msg = error(path)
    assert msg.startswith(f"bad YAML in {path}:4: ") and "at line 3)" in msg  # found at 4, begun at 3
    msg = error(write(tmp_path, "train:\n\tsteps: 3\n", "tab.yaml"))
    assert "tab.yaml:2" in msg


def test_duplicate_keys_are_errors_not_silently_dropped(tmp_path):
    msg = error(write(tmp_path, "algo:\n  gamma: 0.9\ntrain:\n  steps: 3\nalgo:\n  lam: 0.5\n"))
    assert "'algo'" in msg and "c.yaml:5" in msg and "line 1" in msg
    msg = error(write(tmp_path, "algo:\n  gamma: 0.9\n  gamma: 0.8\n", "k.yaml"))
    assert "'algo.gamma'" in msg and "k.yaml:3" in msg


def test_missing_or_unreadable_file(tmp_path):
    msg = error(str(tmp_path / "nope.yaml"))
    assert "not found" in msg and "nope.yaml" in msg and "closest" not in msg
    (tmp_path / "lora.yaml").write_text("model:\n  lora_rank: 4\n")  # a wrong suffix names the file that is there
    assert error(str(tmp_path / "lora.yml")).endswith(f"not found: {tmp_path / 'lora.yml'} (closest: "
                                                      f"{tmp_path / 'lora.yaml'})")
    real = os.listdir
    try:  # a folder that cannot be listed still gives the one line, without a suggestion
        os.listdir = lambda p: (_ for _ in ()).throw(PermissionError(13, "Permission denied", p))
        assert error(str(tmp_path / "lora.yml")) == f"config file not found: {tmp_path / 'lora.yml'}"
    finally:
        os.listdir = real
    assert "directory" in error(str(tmp_path))
    (tmp_path / "bin.yaml").write_bytes(b"run:\n  dir: \xff\xfe\n")
    assert "bin.yaml" in error(str(tmp_path / "bin.yaml"))


@pytest.mark.parametrize("text, kind", [("- 1\n- 2\n", "list"), ("just text\n", "str"), ("3\n", "int")])
def test_non_mapping_file(tmp_path, text, kind):
    path = write(tmp_path, text)
    msg = error(path)
    assert path in msg and "mapping" in msg and kind in msg


@pytest.mark.parametrize("text", ["algo: 3\n", "algo: [1, 2]\n", "algo: grpo\n"])
def test_section_given_a_scalar(tmp_path, text):
    path = write(tmp_path, "run:\n  seed: 1\n" + text)
    msg = error(path)
    assert "section 'algo'" in msg and f"{path}:3" in msg and "mapping" in msg


@pytest.mark.parametrize("text", ["train.steps", "=3", ""])
def test_malformed_override(text):
    msg = error(None, [text])
    assert "key=value" in msg


@pytest.mark.parametrize("name,value", [("R1_PROFILE", "last"), ("R1_PROFILE", "0"), ("R1_SWITCH_US", "0.5ms"),
                                        ("R1_SWITCH_US", "0")])
def test_mistyped_environment_switch_is_a_config_error(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=f"{name}='{value}'"):
        load_config(None, [])
    monkeypatch.setenv(name, "1")
    load_config(None, [])


@pytest.mark.parametrize("name,value,override", [
    ("R1_COMPILE", "0", "kernels.compile=false"), ("R1_COMPILE", "1", "kernels.compile=true"),
    ("R1_FUSE", "0", "kernels.fuse=false"), ("R1_FUSE_TRAIN", "1", "kernels.fuse_train=true"),
    ("R1_CHUNK_GRAPHS", "0", "kernels.chunk_graphs=false"), ("R1_OVERLAP", "0", "kernels.launch_ahead=false"),
    ("R1_MIX", "0", "kernels.mixed_steps=false"), ("R1_SAMPLE", "torch", "kernels.sample=torch"),
    ("R1_ATTN", "sdpa", "kernels.attention=sdpa"), ("R1_DECODE", "sdpa", "kernels.decode=sdpa"),
    ("R1_CHUNKS", "loop", "kernels.chunks=loop"), ("R1_FA4", "0", "kernels.fa4=false"),
    ("R1_FA4_CACHE", "1", "kernels.fa4_cache=true"), ("R1_PAGED", "1", "kernels.paged=true"),
])
def test_a_removed_environment_switch_names_its_config_key(monkeypatch, tmp_path, name, value, override):
    """Each switch that changed what runs is a config key now, saved in the run's config.yaml; the variable,
    still set, is refused with the override that replaces it (which loads, and is what the dump records)."""
    from r1.environment import MOVED

    assert len(MOVED) == 13
    monkeypatch.setenv(name, value)
    assert error(None, []) == (f"environment variable {name} was removed: unset it and write {override} "
                               f"(the run's config.yaml then records it)")
    monkeypatch.delenv(name)
    cfg = load_config(None, [override])
    key, _, text = override.partition("=")
    saved = load_config(write(tmp_path, dump(cfg), "config.yaml"))
    assert saved == cfg and get(saved, key) != get(Config(), key)
    assert str(yaml.safe_load(dump(cfg))["kernels"][key.split(".")[1]]).lower() == text


def test_the_kernels_defaults_are_the_paths_with_no_switch_set():
    """The kernels section's defaults set what the unset environment variables gave: compiled ops for CUDA,
    no fused training projections, automatic attention picks, fa4 picked but not reading the cache, no paged
    reads; a generator with its own defaults (fuse, overlap, mix, chunk graphs, the sampling kernel)."""
    from kernels import attention
    from r1 import model
    from r1.run import use_kernels

    use_kernels(Config())
    assert model.OPS.compile == "auto" and model.OPS.fuse_train is False and model.OPS.rms_norm is not model.rms_norm
    assert vars(attention.PATHS) == {"attention": "", "decode": "", "chunks": "", "fa4": True, "fa4_cache": False}
    assert attention.PAGED is False
    k = Config().kernels
    assert (k.fuse, k.launch_ahead, k.mixed_steps, k.chunk_graphs, k.sample) == (True, True, True, True, "auto")


def test_an_ablation_alone_is_refused_with_the_command_that_layers_it():
    alone = os.path.join("configs", "ablations", "fast.yaml")
    message = error(alone)
    assert message.startswith(f"{alone} is an ablation") and "--config configs/gsm8k_tool.yaml --config" in message
    load_config([os.path.join(ROOT, "configs", "gsm8k_tool.yaml"), os.path.join(ROOT, alone)])  # layered: fine


def test_the_recipe_is_the_synchronous_recipe_with_the_fast_ablation():
    """configs/gsm8k_tool.yaml is written out whole (one command), so it could drift from what it claims to be:
    layered with ablations/synchronous.yaml and then ablations/fast.yaml it must come back to itself but for the
    run folder and the keys it sets for its shorter iterations (time limit, validation and checkpoint cadence)."""
    c = lambda *names: os.path.join(ROOT, "configs", *names)  # noqa: E731
    fast = dataclasses.asdict(load_config(c("gsm8k_tool.yaml")))
    layered = dataclasses.asdict(load_config([c("gsm8k_tool.yaml"), c("ablations", "synchronous.yaml"),
                                              c("ablations", "fast.yaml")]))
    differ = {f"{s}.{k}" for s in fast for k in fast[s] if fast[s][k] != layered[s][k]}
    assert differ == {"run.dir", "train.time_limit", "eval.every", "train.checkpoint_every"}, differ


def test_a_resume_reads_an_older_saved_config_under_the_new_keys(tmp_path):
    """A run saved before the shaping weights moved into env.rewards (and run.dtype into rollout.dtype) resumes
    with the same config without a change reported; a real change is still reported."""
    from r1.run import config_changes

    cfg = load_config(os.path.join(ROOT, "configs", "gsm8k_tool.yaml"), [f"run.dir={tmp_path}"])
    old = to_dict(cfg)
    del old["rollout"]["dtype"]
    old["run"]["dtype"] = "auto"
    old["env"].pop("rewards")
    old["env"].update(malformed_penalty=-0.1, format_reward=0.0, tool_success_reward=0.0, command_reward=0.0)
    saved = write(tmp_path, yaml.safe_dump(old), "config.yaml")
    assert config_changes(cfg, saved) == []
    cfg.env.rewards = {"malformed": -0.1, "format": 0.05}
    assert config_changes(cfg, saved) == ["env.rewards {'malformed': -0.1} -> {'malformed': -0.1, 'format': 0.05}"]


def test_help_lists_the_choices_its_registries_hold(monkeypatch):
    """--keys lists each registry key's names from the registry itself: a name registered by code shows up
    with its own one-line description, beside the built-in ones."""
    import dataclasses as dc

    from r1.algos.estimators import ESTIMATORS
    from r1.algos.policy_losses import POLICY_LOSSES
    from r1.envs.context import CONTEXT_POLICIES
    from r1.envs.rewards import REWARDS, Reward

    def mine(*args):
        """My own entry, for the help test. More text that the help leaves out."""

    monkeypatch.setitem(ESTIMATORS, "my_estimator", dc.replace(ESTIMATORS["grpo"], fn=mine))
    monkeypatch.setitem(POLICY_LOSSES, "my_loss", dc.replace(POLICY_LOSSES["ppo"], fn=mine))
    monkeypatch.setitem(CONTEXT_POLICIES, "my_policy", mine)
    monkeypatch.setitem(REWARDS, "my_term", Reward(mine, "a term of my own"))
    algo, env = describe("algo").splitlines(), describe("env").splitlines()
    assert "      my_estimator: My own entry, for the help test" in algo
    assert "      my_loss: My own entry, for the help test" in algo
    assert "      step_gae: Agent-R1 step-level GAE: one value and one reward per step; every token of step t gets A_t" \
        in algo
    assert "      my_policy: My own entry, for the help test" in env
    assert "      my_term: a term of my own" in env
    assert [line.split(":")[0].strip() for line in algo if line.strip().split(":")[0] in ("off", "std", "mean_std")] \
        == ["off", "std", "mean_std"]  # algo.normalize_reward: r1/algos/reward_norm.MODES, each with its line
    assert any(line.startswith("      q_proj") or "one of: q_proj, k_proj" in line for line in describe("model").splitlines())
    assert "      synthetic: " in describe("data")
    assert load_config(None, ["env.context_policy=my_policy"]).env.context_policy == "my_policy"


def test_a_script_without_a_config_does_not_ignore_a_moved_switch():
    """bench scripts build models without a config: importing r1.model with a moved switch set stops them with
    the key to use instead."""
    import subprocess
    import sys

    env = {**os.environ, "R1_MIX": "0"}
    out = subprocess.run([sys.executable, "-c", "import r1.model"], cwd=ROOT, env=env, capture_output=True,
                         text=True)
    assert out.returncode != 0
    assert ("environment variable R1_MIX was removed: unset it and write kernels.mixed_steps=false"
            in out.stderr.splitlines()[-1])


def test_the_generator_gets_the_kernels_keys(monkeypatch):
    """The generator's own switches reach it from the config (r1/actor.py), no longer from the environment:
    the defaults leave each to the Generator (on where it applies), false turns it off."""
    import types

    import torch

    import r1.actor as actor

    seen = {}
    monkeypatch.setattr(actor, "Generator", lambda *a, **k: seen.update(k))
    monkeypatch.setattr(actor, "AgentEnvLoop", lambda *a, **k: None)
    monkeypatch.setattr(actor, "make_env", lambda cfg, tok: None)
    tok, d = types.SimpleNamespace(stop_ids=[]), types.SimpleNamespace(device=torch.device("cpu"))
    keys = ("fuse", "overlap", "mix", "chunk_graphs", "triton_sample")
    actor.Actor(Config(), tok, None, 2, d)
    assert {k: seen[k] for k in keys} == {"fuse": None, "overlap": None, "mix": None, "chunk_graphs": True,
                                          "triton_sample": True}
    cfg = load_config(None, ["kernels.fuse=false", "kernels.launch_ahead=false", "kernels.mixed_steps=false",
                             "kernels.chunk_graphs=false", "kernels.sample=torch"])
    actor.Actor(cfg, tok, None, 2, d)
    assert {k: seen[k] for k in keys} == dict.fromkeys(keys, False)
