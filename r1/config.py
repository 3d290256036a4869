"""Configuration: one dataclass per section, YAML files, dotted CLI overrides.

    python train.py --config configs/smoke.yaml algo.clip_high=0.28 run.dir=runs/x

Each field carries a docstring (read back by `describe()` for `--help`).
Everything a run does is in the resolved config, which the run folder keeps
as `config.yaml`. Bad input fails early with one line that names the
culprit: the file, the key, the closest valid keys, the expected type.
"""
import ast
import dataclasses
import difflib
import inspect
import os
import types
import typing
from dataclasses import dataclass, field

import yaml


class ConfigError(ValueError):
    """A one-line, user-facing configuration error."""


@dataclass
class Run:
    dir: str = "runs/default"
    """Output folder: config.yaml, metrics.jsonl, tensorboard events, checkpoints/, trajectories/, hf/."""
    resume: bool = False
    """Continue from the latest checkpoint in run.dir (otherwise an existing run.dir is an error)."""
    seed: int = 0
    """Seed for sampling, data order and model init."""
    device: str = "auto"
    """auto (cuda if available, else cpu), cpu or cuda."""
    dtype: str = "auto"
    """Parameter/compute dtype: auto (bfloat16 on cuda, float32 on cpu), float32 or bfloat16."""


@dataclass
class Model:
    path: str = "smollm2-135m-instruct"
    """Policy weights: an HF directory, a .gguf file, the short name smollm2-135m-instruct, or `tiny` (random tiny model)."""
    tokenizer: str | None = None
    """Tokenizer source (HF directory, .gguf, short name); defaults to model.path."""
    arch: str = "llama"
    """For model.path=tiny: llama, qwen2 or qwen3."""
    tiny_layers: int = 2
    """For model.path=tiny: number of layers."""
    tiny_hidden: int = 64
    """For model.path=tiny: hidden size."""
    critic_path: str | None = None
    """Critic initialisation: None = the policy's weights (with a fresh value head)."""
    ref_path: str | None = None
    """Reference policy for KL: None = the initial policy weights."""


@dataclass
class Data:
    task: str = "synthetic"
    """synthetic (embedded, no download), gsm8k (single step) or gsm8k_tool (multi-step with the calculator)."""
    path: str | None = None
    """GSM8K folder (train.jsonl/test.jsonl or the HF parquet layout); unused for synthetic."""
    level: int = 1
    """Synthetic task difficulty (1 = one operation ... higher = more chained steps)."""
    train_size: int = 2000
    """Synthetic: number of generated training problems. GSM8K: cap on rows used (0 = all)."""
    test_size: int = 200
    """Synthetic: number of generated held-out problems."""


@dataclass
class Env:
    max_steps: int = 4
    """Maximum environment steps (model turns) per episode."""
    context_policy: str = "append"
    """append (token-exact concatenation), window (keep the first prompt and the latest turns) or truncate (end the episode)."""
    max_context: int = 2048
    """Token budget of a step's prompt + response; exceeding it ends the episode (append/truncate) or slides the window."""
    malformed_penalty: float = 0.0
    """Reward added (use a negative number) for each step with a malformed tool call."""
    tools: list[str] = field(default_factory=lambda: ["calculator"])
    """Tools offered by ToolEnv tasks (names known to r1.envs.tools.get_tool)."""


@dataclass
class Rollout:
    prompts: int = 8
    """Prompts per iteration (global, across ranks)."""
    n: int = 4
    """Samples per prompt (a group, for GRPO/RLOO)."""
    max_new_tokens: int = 256
    """Maximum sampled tokens per step."""
    temperature: float = 1.0
    """Sampling temperature; logprobs are recorded at this temperature and the loss uses it too."""
    top_p: float = 1.0
    """Nucleus sampling; the recorded logprob is of the full tempered distribution (see r1/generate.py)."""
    top_k: int = 0
    """Top-k sampling (0 = off); same logprob rule as top_p."""
    slots: int = 64
    """Concurrent rows in the generator's KV cache (continuous batching)."""
    cache_len: int = 0
    """KV cache positions per slot (0 = env.max_context)."""


@dataclass
class Algo:
    advantage: str = "step_gae"
    """step_gae, token_gae, grpo, rloo, reinforce_pp or reinforce_pp_baseline (see docs/algorithms.md)."""
    gamma: float = 1.0
    """Discount across steps (step_gae) or tokens (token_gae)."""
    lam: float = 1.0
    """GAE lambda."""
    grpo_std_norm: bool = True
    """GRPO: divide by the group std (False = Dr.GRPO)."""
    reward_level: str = "trajectory"
    """Group baselines on the trajectory's total reward (trajectory) or per step (step)."""
    whiten: bool = False
    """Whiten advantages over the batch."""
    adv_clip: float = 0.0
    """Clip advantages to [-adv_clip, adv_clip] (0 = off)."""
    clip_low: float = 0.2
    """PPO ratio clip below 1."""
    clip_high: float = 0.2
    """PPO ratio clip above 1 (clip-higher: e.g. 0.28)."""
    dual_clip: float = 0.0
    """Dual-clip constant c > 1 for negative advantages (0 = off)."""
    ratio_level: str = "token"
    """token (PPO) or step (GSPO-style geometric mean ratio over the step's tokens)."""
    log_ratio_clamp: float = 20.0
    """Clamp |log ratio| before exp."""
    tis_cap: float = 0.0
    """Truncated importance sampling cap against the sampler logprobs (0 = off)."""
    loss_agg: str = "token_mean"
    """token_mean, seq_mean_token_sum, seq_mean_token_mean or step_mean."""
    value_clip: float = 0.0
    """PPO value clipping range (0 = off)."""
    vf_coef: float = 1.0
    """Value loss coefficient (the critic has its own optimizer; this scales its loss)."""
    entropy_coef: float = 0.0
    """Entropy bonus coefficient."""
    kl_coef: float = 0.0
    """KL to the reference policy (0 = no reference model is built)."""
    kl_estimator: str = "k3"
    """k1, k2 or k3."""
    kl_in_reward: bool = False
    """Apply KL as a per-token reward penalty instead of a loss term."""
    ppo_epochs: int = 1
    """Passes over each iteration's rollouts."""
    minibatches: int = 1
    """Optimizer steps per epoch."""


@dataclass
class Train:
    stage: str = "rl"
    """rl or sft (SFT on expert trajectories, loss on assistant tokens only)."""
    steps: int = 10
    """RL iterations (rl) or optimizer steps (sft)."""
    lr: float = 1e-6
    """Policy learning rate."""
    critic_lr: float = 1e-5
    """Critic learning rate."""
    warmup: int = 0
    """Linear warmup in optimizer steps."""
    schedule: str = "constant"
    """constant or cosine (to 10% of lr)."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    grad_clip: float = 1.0
    """Global gradient-norm clip (0 = off)."""
    micro_tokens: int = 8192
    """Tokens per packed micro-batch (gradient accumulation within a mini-batch)."""
    activation_checkpointing: bool = False
    """Recompute each block in backward to save memory."""
    sft_batch: int = 16
    """SFT: conversations per optimizer step."""
    checkpoint_every: int = 1
    """Save a checkpoint every N iterations (and at the end)."""


@dataclass
class Eval:
    every: int = 0
    """Evaluate every N iterations during training (0 = off)."""
    limit: int = 0
    """Evaluate on at most N problems (0 = the whole split)."""
    n: int = 1
    """Samples per problem for pass@k (1 = greedy only)."""
    temperature: float = 1.0
    """Sampling temperature for pass@k."""
    split: str = "test"
    """Split to evaluate."""
    out: str | None = None
    """eval.py: folder for trajectories and the result JSON (default: a temp-free run folder under runs/eval-*)."""


@dataclass
class Log:
    tensorboard: bool = True
    """Write tensorboard event files in run.dir."""
    trajectories: bool = True
    """Save every iteration's trajectories in run.dir/trajectories/."""
    progress: bool = True
    """Show a progress bar with ETA on the console."""


@dataclass
class Config:
    run: Run = field(default_factory=Run)
    model: Model = field(default_factory=Model)
    data: Data = field(default_factory=Data)
    env: Env = field(default_factory=Env)
    rollout: Rollout = field(default_factory=Rollout)
    algo: Algo = field(default_factory=Algo)
    train: Train = field(default_factory=Train)
    eval: Eval = field(default_factory=Eval)
    log: Log = field(default_factory=Log)


CHOICES = {
    "run.device": ["auto", "cpu", "cuda"], "run.dtype": ["auto", "float32", "bfloat16"],
    "model.arch": ["llama", "qwen2", "qwen3"], "data.task": ["synthetic", "gsm8k", "gsm8k_tool"],
    "env.context_policy": ["append", "window", "truncate"],
    "algo.advantage": ["step_gae", "token_gae", "grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline"],
    "algo.reward_level": ["trajectory", "step"], "algo.ratio_level": ["token", "step"],
    "algo.loss_agg": ["token_mean", "seq_mean_token_sum", "seq_mean_token_mean", "step_mean"],
    "algo.kl_estimator": ["k1", "k2", "k3"], "train.stage": ["rl", "sft"], "train.schedule": ["constant", "cosine"],
}


def all_keys() -> list[str]:
    return [f"{s.name}.{f.name}" for s in dataclasses.fields(Config) for f in dataclasses.fields(s.type)]


def _unknown(key: str, where: str) -> ConfigError:
    close = difflib.get_close_matches(key, all_keys(), n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    return ConfigError(f"unknown config key '{key}'{where}{hint}")


def _coerce(key: str, value, tp, where: str):
    """Check/convert one value against a field type; raise ConfigError naming the key."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        tp = next(a for a in args if a is not type(None))
        origin = typing.get_origin(tp)
    bad = ConfigError(f"config key '{key}'{where} expects {getattr(tp, '__name__', tp)}, got {value!r}")
    if origin is list:
        if isinstance(value, str):
            value = [v for v in value.split(",") if v]
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
                value = float(value)
            except ValueError:
                raise bad from None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad
        return float(value)
    if tp is str:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        if not isinstance(value, str):
            raise bad
        if key in CHOICES and value not in CHOICES[key]:
            raise ConfigError(f"config key '{key}'{where} must be one of {', '.join(CHOICES[key])}; got {value!r}")
        return value
    raise bad


def _set(cfg: Config, key: str, value, where: str = ""):
    parts = key.split(".")
    if len(parts) != 2 or parts[0] not in {f.name for f in dataclasses.fields(Config)}:
        raise _unknown(key, where)
    section = getattr(cfg, parts[0])
    types_ = {f.name: f.type for f in dataclasses.fields(section)}
    hints = typing.get_type_hints(type(section))
    if parts[1] not in types_:
        raise _unknown(key, where)
    setattr(section, parts[1], _coerce(key, value, hints[parts[1]], where))


def _flatten(d: dict, prefix: str = "") -> list[tuple[str, object]]:
    out = []
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and not prefix:
            out += _flatten(v, key + ".")
        else:
            out.append((key, v))
    return out


def load_yaml(path: str) -> dict:
    if not os.path.isfile(path):
        raise ConfigError(f"config file not found: {path}")
    try:
        with open(path) as f:
            data = yaml.safe_load(f)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"bad YAML in {path}{line}: {problem}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must be a mapping of sections, got {type(data).__name__}")
    return data


def _parse_override(text: str):
    if "=" not in text:
        raise ConfigError(f"bad override '{text}': expected key=value, e.g. train.steps=4")
    key, raw = text.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw != "" else ""
    except yaml.YAMLError:
        value = raw
    return key.strip(), value


def load_config(path: str | None = None, overrides: list[str] = ()) -> Config:
    """Defaults <- YAML file <- key=value overrides, each validated."""
    cfg = Config()
    if path:
        for key, value in _flatten(load_yaml(path)):
            _set(cfg, key, value, f" in {path}")
    for text in overrides:
        key, value = _parse_override(text)
        _set(cfg, key, value, " (command line)")
    return cfg


def to_dict(cfg: Config) -> dict:
    return dataclasses.asdict(cfg)


def dump(cfg: Config) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)


def save(cfg: Config, path: str):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(dump(cfg))
    os.replace(tmp, path)


def describe() -> str:
    """Every key with its default and docstring (for --help)."""
    lines = []
    for s in dataclasses.fields(Config):
        docs = _field_docs(s.type)
        lines.append(f"{s.name}:")
        for f in dataclasses.fields(s.type):
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            lines.append(f"  {s.name}.{f.name} = {default!r}  # {docs.get(f.name, '')}")
    return "\n".join(lines)


def _field_docs(cls) -> dict:
    """Attribute docstrings (a string literal right after a field) of a dataclass."""
    tree = ast.parse(inspect.getsource(cls))
    body = tree.body[0].body
    docs = {}
    for a, b in zip(body, body[1:]):
        if isinstance(a, ast.AnnAssign) and isinstance(b, ast.Expr) and isinstance(getattr(b, "value", None), ast.Constant):
            docs[a.target.id] = b.value.value
    return docs
