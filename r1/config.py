"""Configuration: one dataclass per section, YAML files, dotted CLI overrides.

    python train.py --config configs/smoke.yaml algo.clip_high=0.28 run.dir=runs/x

Everything a run does is in the resolved config, which the run folder keeps as `config.yaml`. Bad input
fails early with one line that names the culprit: the file and line, the key, the closest valid keys, the
expected type or range. The work is split by job, and this module gathers it for `from r1.config import`:
r1/config_schema.py the keys (dataclasses, docstrings, choice and range tables), r1/config_load.py reading
files and overrides, r1/config_check.py the rules across keys; here the views of a config (dump, describe
for --keys, the run's header). Exit codes are r1/exits.py.
"""
import dataclasses
import difflib
import inspect
import os

import yaml

from r1.config_check import validate
from r1.config_load import check_environment, load_config, read_yaml
from r1.config_schema import (ALIASES, AUTO, BOUNDS, CHOICES, COMMAND_LINE, REMOVED, Algo, Config, ConfigError, Data,
                              Env, Eval, Kernels, Log, Model, Rollout, Run, Train, all_keys, field_docs, get, sections)

__all__ = ["ALIASES", "AUTO", "BOUNDS", "CHOICES", "COMMAND_LINE", "REMOVED", "Algo", "Config", "ConfigError", "Data",
           "Env", "Eval", "Kernels", "Log", "Model", "Rollout", "Run", "Train", "all_keys", "check_environment",
           "choices", "describe", "dump", "get", "header", "load_config", "plural", "read_yaml", "save", "sections",
           "to_dict", "validate"]


def to_dict(cfg: Config) -> dict:
    """{section: {name: value}} as a file writes it: an AUTO key held as 0 is `auto`."""
    out = dataclasses.asdict(cfg)
    for key in AUTO:
        section, _, name = key.partition(".")
        if out[section][name] == 0:
            out[section][name] = "auto"
    return out


def dump(cfg: Config) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)


def save(cfg: Config, path: str):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(dump(cfg))
    os.replace(tmp, path)


def describe(section: str = "") -> str:
    """Every key (or one section's) with its default, written as in a YAML file, and its docstring (--keys)."""
    names = [s.name for s in dataclasses.fields(Config)]
    if section and section not in names:
        close = difflib.get_close_matches(section, names, n=1, cutoff=0.5)
        raise ConfigError(f"--keys {section}: no such section (sections: {', '.join(names)})"
                          + (f"; did you mean {close[0]}?" if close else ""))
    lines = []
    for s in dataclasses.fields(Config):
        if section and s.name != section:
            continue
        docs = field_docs(s.type)
        lines.append(f"{s.name}:")
        for f in dataclasses.fields(s.type):
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            key = f"{s.name}.{f.name}"
            shown = "auto" if key in AUTO and default == 0 else _yaml_value(default)
            lines.append(f"  {key} = {shown}  # {docs.get(f.name, '')}")
            names = choices(key)
            if names and any(names.values()):  # a registry whose entries say what they are: one line each
                lines += [f"      {n}" + (f": {doc}" if doc else "") for n, doc in names.items()]
            elif names:
                lines.append(f"      one of: {', '.join(names)}")
    return "\n".join(lines)


def choices(key: str) -> dict:
    """{name: one-line description or ""} of the names `key` takes, read live from its registry (CHOICES, the
    LoRA targets, reward terms, tasks, tools): a name registered by code is listed as the built-in ones are."""
    from r1.envs.rewards import REWARDS
    from r1.envs.tools import TOOLS
    from r1.lora import TARGETS
    from r1.tasks.registry import TASKS, _builtins

    _builtins()  # the built-in tasks, and the reward terms and tools they register
    table = {"model.lora_targets": TARGETS, "env.rewards": REWARDS, "data.task": TASKS, "env.tools": TOOLS,
             **CHOICES}.get(key, ())
    return {name: _first_line(table[name] if isinstance(table, dict) else None) for name in table}


def _first_line(entry) -> str:
    """The first sentence of what a registry entry says of itself (its doc, or its function's docstring)."""
    schema = getattr(entry, "schema", None)  # a tool: what its schema tells the model
    doc = getattr(entry, "doc", None) \
        or (schema.get("function", schema).get("description") if isinstance(schema, dict) else None) \
        or getattr(getattr(entry, "fn", None), "__doc__", None) \
        or (entry.__doc__ if inspect.isfunction(entry) else None) or ""
    return " ".join(doc.strip().split("\n\n")[0].split()).split(". ")[0].rstrip(".")


def _yaml_value(v) -> str:
    """A default as a YAML file or an override writes it: null, true, 1.0e-06, [a, b]."""
    text = yaml.safe_dump(v, default_flow_style=True, width=1000).strip()
    return text[:-4].strip() if text.endswith("\n...") else text


def plural(n: int, word: str) -> str:
    """'1 step', '2 steps'."""
    return f"{n} {word}{'' if n == 1 else 's'}"


def header(cfg: Config, files) -> str:
    """The few lines a run starts with (the whole resolved config is saved as run.dir/config.yaml)."""
    t = cfg.train
    if t.stage == "sft":
        steps = f"SFT {plural(t.steps, 'step')} x {plural(t.sft_batch, 'chat')}"
    else:
        steps = (f"SFT {plural(t.sft_steps, 'step')} x {plural(t.sft_batch, 'chat')}, then " if t.sft_steps else "") + \
                f"RL {plural(t.steps, 'iteration')} x {plural(cfg.rollout.prompts * cfg.rollout.n, 'episode')}"
    algo = "sft" if t.stage == "sft" else f"{cfg.algo.advantage} ({cfg.algo.policy_loss})"
    return (f"config: {', '.join(files) if files else '(defaults)'}; run.dir {cfg.run.dir} "
            f"(the resolved config goes there as config.yaml)\n"
            f"task {cfg.data.task}; model {cfg.model.path}; algorithm {algo}; {steps}")

