"""Reading a config: defaults <- YAML files (later ones winning) <- dotted `key=value` overrides.

Values are typed by the dataclass field, not guessed: a command-line value for a `str` field is kept as
written (`run.dir=0755` stays "0755"), other fields parse it as YAML (`train.lr=1e-5`, `env.tools=[calculator]`
or `env.tools=calculator`), and `null`/`None` clears an optional field (and is an error for a required one,
rather than a folder named "null"). A YAML file is read twice, once as nodes (for line numbers and duplicate
keys, which PyYAML would silently resolve to the last one) and once as values. Every error is one line naming
the file and line or the command line, the key, and the closest valid keys or the expected type. A removed
key (REMOVED) is refused with the key that replaced it.
"""
import difflib
import math
import os
import types
import typing

import yaml

from r1.config_check import validate
from r1.config_schema import (ALIASES, AUTO, CHOICES, COMMAND_LINE, REMOVED, Config, ConfigError, get,
                              all_keys, sections)
from r1.environment import moved_switch


NULLS = ("null", "Null", "NULL", "~", "None", "none")  # null, in a file or on the command line


def _unknown(key: str, where: str) -> ConfigError:
    keys = all_keys()
    # Same field name in another section first (train.clip_high -> algo.clip_high), then spelling.
    name = key.rpartition(".")[2]
    close = [k for k in keys if k.rpartition(".")[2] == name and k != key]
    close += [k for k in difflib.get_close_matches(key, keys, n=3, cutoff=0.5) if k not in close]
    hint = f"; did you mean {', '.join(close[:3])}?" if close else "; `python train.py --keys` lists them all"
    return ConfigError(f"unknown config key '{key}'{where}{hint}")


def _type_name(tp, optional: bool) -> str:
    if typing.get_origin(tp) is dict:
        name = "a mapping of name: {}".format(typing.get_args(tp)[1].__name__)
    elif typing.get_origin(tp) is list:
        name = f"a list of {typing.get_args(tp)[0].__name__}"
    else:
        name = {bool: "true or false", float: "float (e.g. 1e-5)"}.get(tp, getattr(tp, "__name__", str(tp)))
    return name + (" or null" if optional else "")


def _from_text(raw: str, tp):
    """A command-line value -> a Python value, by the field's type (str stays as written)."""
    if tp is str or raw == "":
        return raw
    if typing.get_origin(tp) is list and not raw.lstrip().startswith("["):
        return [v.strip() for v in raw.split(",") if v.strip()]
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw


def _coerce(key: str, value, tp, where: str, text: bool = False):
    """Check/convert one value against a field type; raise ConfigError naming the key."""
    optional = False
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        optional = type(None) in args
        tp = next(a for a in args if a is not type(None))
    if isinstance(value, str) and value in NULLS:
        value = None  # `model.tokenizer=None`; a required field then says it got None
    if optional and value is None:
        return None
    if text and value is not None:
        value = _from_text(value, tp)
    bad = ConfigError(f"config key '{key}'{where} expects {_type_name(tp, optional)}, got {value!r:.80}")
    if typing.get_origin(tp) is dict:
        if not isinstance(value, dict):
            raise bad
        _, inner = typing.get_args(tp)
        return {str(k): _coerce(f"{key}.{k}", v, inner, where) for k, v in value.items()}
    if typing.get_origin(tp) is list:
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, list):
            raise bad
        (inner,) = typing.get_args(tp)
        return [_coerce(key, v, inner, where) for v in value]
    if tp is bool:
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        if not isinstance(value, bool):
            raise bad
        return value
    if tp is int:
        if key in AUTO:  # one spelling: `auto`, held as 0
            if isinstance(value, str) and value.strip().lower() == "auto":
                return 0
            if (value == 0 and not isinstance(value, bool)) or value == "0":
                raise ConfigError(f"config key '{key}'{where}: write auto (the value is then picked for the run), not 0")
        if isinstance(value, str):
            try:
                value = int(value)
            except ValueError:
                raise bad from None
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad
        return value
    if tp is float:
        if isinstance(value, str):
            try:
                value = float(value)  # YAML 1.1 reads 1e-5 (no dot) as a string
            except ValueError:
                raise bad from None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad
        if not math.isfinite(value):
            raise ConfigError(f"config key '{key}'{where} expects a finite float, got {value!r}")
        return float(value)
    if tp is str:
        switch = key in CHOICES and key not in CHOICES.TABLES and "true" in CHOICES[key]  # true/false/auto
        if isinstance(value, bool) and switch:
            value = str(value).lower()  # `activation_checkpointing: true` in a file: a true/false/auto key
        if isinstance(value, str) and switch:
            value = value.lower()
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            value = str(value)  # `dir: 2024` in a file
        if not isinstance(value, str):
            raise bad
        if key in CHOICES and key not in CHOICES.TABLES:  # a table's names: checked once every key is set
            _check_choice(key, value, where)
        return value
    raise bad


def _check_choice(key: str, value: str, where: str):
    if value not in CHOICES[key]:
        close = difflib.get_close_matches(value, list(CHOICES[key]), n=3, cutoff=0.5)
        alias = ALIASES.get(key, {}).get(value.lower())
        hint = f" ({alias})" if alias else f" (closest: {', '.join(close)})" if close else ""
        raise ConfigError(f"config key '{key}'{where} must be one of {', '.join(CHOICES[key])}; "
                          f"got {value!r:.80}{hint}")


def _set(cfg: Config, key: str, value, where: str = "", text: bool = False):
    if key in REMOVED:
        raise _removed(key, value, where)
    section, _, name = key.partition(".")
    name, _, entry = name.partition(".")
    if section not in sections() or "." in entry:
        raise _unknown(key, where)
    hints = typing.get_type_hints(type(getattr(cfg, section)))
    if name not in hints or (entry and typing.get_origin(hints[name]) is not dict):
        raise _unknown(key, where)
    if entry:  # one entry of a mapping key, the others kept: env.rewards.format=0.05
        mapping = dict(getattr(getattr(cfg, section), name))
        mapping[entry] = _coerce(key, value, typing.get_args(hints[name])[1], where, text)
        setattr(getattr(cfg, section), name, mapping)
        return
    setattr(getattr(cfg, section), name, _coerce(key, value, hints[name], where, text))


def upgrade(saved: dict) -> dict:
    """A run's saved config.yaml ({section: {name: value}}) with its removed keys moved to the keys that replaced
    them (a zero reward weight left out, as it pays nothing), so a resume compares like with like."""
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in saved.items()}
    for key, new in REMOVED.items():
        section, name = key.split(".")
        if not isinstance(out.get(section), dict) or name not in out[section]:
            continue
        value = out[section].pop(name)
        to_section, to_name, entry = (new.split(".") + [""])[:3]
        target = out.setdefault(to_section, {})
        if not isinstance(target, dict):
            continue
        if entry:
            if value:
                target[to_name] = {**(target.get(to_name) or {}), entry: value}
        else:
            target.setdefault(to_name, value)
    return out


def _removed(key: str, value, where: str) -> ConfigError:
    """A removed key, and what to write instead, as the place it was given writes it."""
    new = REMOVED[key]
    section, name, entry = (new.split(".") + [""])[:3]
    if where == COMMAND_LINE:
        write = f"{new}={value}"
    else:
        write = f"{section}: {name}: {{{entry}: {value}}}" if entry else f"{section}: {name}: {value}"
    return ConfigError(f"config key '{key}'{where} was removed: write {write}")


def _at(path: str, line: int | None) -> str:
    return f" in {path}:{line}" if line else f" in {path}"


def _flatten(data: dict, path: str, lines: dict) -> list[tuple[str, object, str]]:
    """{section: {name: value}} -> [(dotted key, value, where)]; a dotted key at the top level is kept."""
    out = []
    for k, v in data.items():
        k = str(k)
        where = _at(path, lines.get(k))
        if "." in k:
            out.append((k, v, where))  # `algo.gamma: 0.9` at the top level
        elif k in sections():
            if v is None:
                continue  # an empty section (every key commented out) keeps the defaults
            if not isinstance(v, dict):
                raise ConfigError(f"config section '{k}'{where} must be a mapping of {k}.* keys, got {v!r:.80}")
            out += [(f"{k}.{name}", value, _at(path, lines.get(f"{k}.{name}"))) for name, value in v.items()]
        elif isinstance(v, dict):
            close = difflib.get_close_matches(k, sections(), n=1, cutoff=0.5)
            hint = f"did you mean {close[0]}? " if close else ""
            raise ConfigError(f"unknown config section '{k}'{where}; {hint}sections: {', '.join(sections())}")
        else:
            out.append((k, v, where))  # a stray key such as `lr: 1e-5`: _set names the close keys
    return out


def read_yaml(path: str) -> tuple[dict, dict]:
    """A config file -> ({section: {name: value}}, {key or dotted key: line number})."""
    if not os.path.exists(path):
        folder = os.path.dirname(path) or "."
        try:
            names = sorted(f for f in os.listdir(folder) if f.endswith((".yaml", ".yml")))
        except OSError:  # no such folder, or one that cannot be listed: no suggestion
            names = []
        near = difflib.get_close_matches(os.path.basename(path), names, n=1)
        where = "" if os.path.isabs(path) else f" in {os.getcwd()} (a relative path is read from the current folder)"
        raise ConfigError(f"config file not found: {path}{where}" + (f" (closest: {os.path.join(folder, near[0])})"
                                                                     if near else ""))
    if os.path.isdir(path):
        raise ConfigError(f"config file {path} is a directory, not a YAML file")
    from r1.bounded import read_text

    try:  # a FIFO or a device is refused, not waited on or read forever; 1 MiB: configs/ holds 2 KB files
        text = read_text(path, 1 << 20, "config file")
    except OSError as e:
        raise ConfigError(f"cannot read config file {path}: {e}") from None
    except ValueError as e:  # not a regular file, too large, not UTF-8: the message names the file
        raise ConfigError(str(e)) from None
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f"{path}:{mark.line + 1}" if mark else path
        problem = " ".join((getattr(e, "problem", None) or str(e).splitlines()[0]).split())
        context, start = getattr(e, "context", None), getattr(e, "context_mark", None)
        if context and start and mark and start.line != mark.line:  # where the broken construct began
            problem += f" ({context} at line {start.line + 1})"
        raise ConfigError(f"bad YAML in {at}: {problem}") from None
    if data is None:
        return {}, {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must be a mapping of sections (run:, model:, ...), "
                          f"got a {type(data).__name__}")
    return data, _key_lines(root, path)


def _key_lines(root, path: str) -> dict:
    """Line of every section and key; a key given twice is an error (PyYAML keeps the last silently)."""
    lines = {}

    def walk(node, prefix):
        seen = {}
        for key_node, value_node in node.value:
            key, line = prefix + str(key_node.value), key_node.start_mark.line + 1
            if key in seen:
                raise ConfigError(f"duplicate config key '{key}' in {path}:{line} (first at line {seen[key]})")
            seen[key] = lines[key] = line
            if not prefix and isinstance(value_node, yaml.MappingNode):
                walk(value_node, key + ".")

    walk(root, "")
    return lines


def _parse_override(text: str) -> tuple[str, str]:
    key, eq, raw = text.partition("=")
    if not eq or not key.strip():
        yaml_file = not eq and text.endswith((".yaml", ".yml"))
        hint = f"; did you mean --config {text}? (a config file goes after --config)" if yaml_file else ""
        raise ConfigError(f"bad override '{text}': expected key=value, e.g. train.steps=4{hint}")
    return key.strip(), raw


def load_config(path: str | list | None = None, overrides: list[str] = ()) -> Config:
    """Defaults <- YAML file(s), later files winning (a base config, then an ablation) <- key=value overrides,
    each checked, then validate()."""
    cfg, origin = Config(), {}
    paths = [path] if isinstance(path, str) else list(path or [])
    if paths and os.path.basename(os.path.dirname(os.path.abspath(paths[0]))) == "ablations":
        raise ConfigError(f"{paths[0]} is an ablation: it switches a few keys of a recipe and is meant as the later "
                          f"file, e.g. --config configs/gsm8k_tool.yaml --config {paths[0]}")
    for path in paths:
        data, lines = read_yaml(path)
        for key, value, where in _flatten(data, path, lines):
            _set(cfg, key, value, where)
            origin[key] = origin[".".join(key.split(".")[:2])] = where
    for text in overrides:
        key, raw = _parse_override(text)
        _set(cfg, key, raw, COMMAND_LINE, text=True)
        origin[key] = origin[".".join(key.split(".")[:2])] = COMMAND_LINE
    # the algorithm tables import torch: their names are checked after every key is known, so a mistyped
    # key is reported without waiting for torch to load
    for key in CHOICES.TABLES:
        _check_choice(key, get(cfg, key), origin.get(key, " (default)"))
    validate(cfg, origin)
    check_environment()
    return cfg


def check_environment():
    """A switch that moved into the config (REMOVED_ENV) and is still set, or a mistyped diagnostic
    (R1_PROFILE=last), is a one-line error before anything runs, not a run that silently ignores it."""
    moved = moved_switch()  # r1/environment.py
    if moved:
        raise ConfigError(moved)
    v = os.environ.get("R1_PROFILE", "")
    if v and not (v.isdigit() and int(v) >= 1):
        raise ConfigError(f"environment variable R1_PROFILE={v!r}: give the iteration to profile, 1 or more")
    v = os.environ.get("R1_SWITCH_US", "")
    if v and not (v.isdigit() and int(v) >= 1):
        raise ConfigError(f"environment variable R1_SWITCH_US={v!r}: give the interpreter's thread switch "
                          f"interval in microseconds, 1 or more (Python's default is 5000)")
