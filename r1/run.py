"""Run set-up shared by RL, SFT and evaluation: dtype, model building, the run folder, tokenizer, lr schedule.

Every entry point starts the same way (r1/trainer.py, r1/sft.py, eval.py):
resolve the dtype, load the run's tokenizer, build a model from model.path
(or the seeded tiny one), check run.dir before anything is built and create
it once everything has loaded. It sits below all three, so none of them
imports another for its set-up.
"""
from __future__ import annotations

import math
import os

import torch

from r1 import checkpoint, distributed
from r1.config import Config, ConfigError
from r1.exits import NodeError, node_error
from r1.model import Transformer, tiny_config
from r1.tokenizer import check_vocab, load_tokenizer


def use_kernels(cfg: Config):
    """The process-wide paths of config section kernels: the elementwise ops and the trained projections
    (r1/model.py OPS) and the attention backends (kernels/attention.py PATHS). The generator's own switches
    travel with it (r1/actor.py). Each process of a run calls it once, before its first forward."""
    from kernels import attention
    from r1.model import use_ops

    k = cfg.kernels
    use_ops(k.compile, k.fuse_train)
    attention.use(k.attention, k.decode, k.chunks, k.fa4, k.fa4_cache, k.paged)


def generator_switches(k) -> dict:
    """A Generator's keyword arguments for config section kernels `k` (None: on where it applies)."""
    return {"fuse": None if k.fuse else False, "overlap": None if k.launch_ahead else False,
            "mix": None if k.mixed_steps else False, "chunk_graphs": k.chunk_graphs,
            "triton_sample": k.sample != "torch"}


def resolve_dtype(cfg: Config, device) -> torch.dtype:
    """The rollout (and export) dtype: rollout.dtype, where auto is bfloat16 on CUDA and float32 elsewhere."""
    if cfg.rollout.dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, cfg.rollout.dtype)


def build_model(path: str, cfg: Config, tok, device, value_head=False, seed=0) -> Transformer:
    """Training copy in float32 (mixed precision comes from autocast/FSDP)."""
    if path == "tiny":
        torch.manual_seed(seed)
        mc = tiny_config(cfg.model.arch, tie=True, vocab_size=len(tok.hf), num_layers=cfg.model.tiny_layers,
                         hidden_size=cfg.model.tiny_hidden, intermediate_size=2 * cfg.model.tiny_hidden,
                         eos_token_id=tok.eos_id)
        with torch.device(device):
            model = Transformer(mc, value_head=value_head)
        for name, p in model.named_parameters():  # HF-style init: small logits, a diverse random policy
            if p.dim() == 2:
                torch.nn.init.normal_(p, std=0.02)
            elif name.endswith("bias"):
                torch.nn.init.zeros_(p)
        return model
    model = Transformer.from_pretrained(path, dtype=torch.float32, device=device, value_head=value_head)
    # the tokenizer meets its model here: every id it can produce needs an embedding row (the model folder's
    # own tokenizer, or the one model.tokenizer names), or the first prompt holding one is an IndexError
    check_vocab(tok, model.cfg.vocab_size, path, own=cfg.model.tokenizer is None)
    # non-finite weights (a reference among them) would make every update skip, silently, until the run ends
    params = dict(model.named_parameters())
    ok = torch.stack([torch.isfinite(p).all() for p in params.values()])  # one host sync, not one a tensor
    bad = None if bool(ok.all()) else list(params)[int((~ok).nonzero()[0])]
    if bad is not None:
        raise ValueError(f"model {path} holds non-finite weights (NaN or inf in {bad}); it cannot be trained or "
                         f"used as a reference")
    return model


# Keys that do not change what a run is (where it lives, how it is logged, how long it goes, how it is split
# into memory-sized pieces): a resume may change them freely. Any other difference needs run.allow_config_change.
RESUME_FREE = ("run.dir", "kernels.", "run.resume", "run.allow_config_change", "run.device", "run.memory_fraction", "run.save",
               "log.", "eval.", "train.steps", "train.time_limit", "train.checkpoint_every", "train.keep_checkpoints", "train.micro_tokens",
               "train.activation_checkpointing", "rollout.slots", "rollout.sync_every")


def config_changes(cfg: Config, saved_path: str, free=RESUME_FREE) -> list:
    """["key old -> new", ...] between a run's saved config.yaml and `cfg`, ignoring keys in `free`
    (a key the saved file lacks is compared with its default). Read with yaml.safe_load: no code."""
    import yaml

    from r1.config import Config as Defaults, to_dict
    from r1.config_load import upgrade

    try:
        with open(saved_path, encoding="utf-8") as f:
            old = yaml.safe_load(f)
        if not isinstance(old, dict):
            raise ValueError("not a mapping of sections")
    except (OSError, ValueError, yaml.YAMLError) as e:
        raise ValueError(f"cannot read the run's saved config {saved_path}: {str(e).splitlines()[0][:120]}") from None
    old = upgrade(old)  # an older run's removed keys, under the keys that replaced them
    new, default = to_dict(cfg), to_dict(Defaults())
    # a run folder that was moved: a path inside its old run.dir (an RL run's own sft/hf) is the same path
    # inside the new one
    old_dir = (old.get("run") or {}).get("dir") if isinstance(old.get("run"), dict) else None
    moved = isinstance(old_dir, str) and os.path.normpath(old_dir) != os.path.normpath(cfg.run.dir)
    out = []
    for section, fields in new.items():
        before = old.get(section) if isinstance(old.get(section), dict) else {}
        for name, value in fields.items():
            key = f"{section}.{name}"
            if any(key == f or (f.endswith(".") and key.startswith(f)) for f in free):
                continue
            was = before.get(name, default[section][name])
            if key == "env.rewards" and isinstance(was, dict):  # a zero weight pays nothing
                was, value = ({term: w for term, w in d.items() if w} for d in (was, value))
            if moved and isinstance(was, str) and isinstance(value, str):
                inside = os.path.relpath(os.path.normpath(was), os.path.normpath(old_dir))
                if not inside.startswith(os.pardir) and os.path.normpath(value) == os.path.normpath(
                        os.path.join(cfg.run.dir, inside)):
                    continue
            if was != value:
                out.append(f"{key} {was!r} -> {value!r}")
    return out


def check_paths(cfg: Config):
    """The config's paths exist, before anything is loaded: one line naming the key, with the closest short
    model names (`smollm2-135m` -> smollm2-135m-instruct) for a model key."""
    import difflib

    from r1.weights import SHORT_NAMES

    keys = [("model.path", cfg.model.path), ("model.tokenizer", cfg.model.tokenizer),
            ("model.critic_path", cfg.model.critic_path), ("model.ref_path", cfg.model.ref_path),
            ("data.path", cfg.data.path)]
    for key, value in keys:
        if not value or (key == "model.path" and value == "tiny") or (key != "data.path" and value in SHORT_NAMES):
            continue
        if os.path.exists(os.path.expanduser(value)):
            continue
        hint = ""
        if key.startswith("model."):
            close = difflib.get_close_matches(value, list(SHORT_NAMES) + (["tiny"] if key == "model.path" else []),
                                              n=2, cutoff=0.5)
            close += [n for n in SHORT_NAMES if value.lower() in n and n not in close]
            names = ", ".join(list(SHORT_NAMES) + (["tiny"] if key == "model.path" else []))
            hint = (f"; did you mean {' or '.join(close)}?" if close else "") + \
                   f" (a model key takes an HF folder, a .gguf file or a short name: {names})"
        raise NodeError(f"config key {key}={value}: not found{hint}")


def check_run_dir(cfg: Config):
    """Refuse to overwrite a run, or to resume it as something else. Every rank checks before any rank writes
    (see create_run_dir); nothing here writes. What run.dir holds is a NodeError (said once a node)."""
    d = cfg.run.dir
    if not d.strip():
        raise ConfigError("run.dir is empty; name a folder for the run")
    if os.path.exists(d) and not os.path.isdir(d):
        raise NodeError(f"run.dir {d} exists and is not a folder")
    # an RL run's own SFT phase (train.sft_steps) lives in run.dir/sft and is not another run
    has_files = os.path.isdir(d) and bool(set(os.listdir(d)) - ({"sft"} if cfg.train.sft_steps else set()))
    if has_files and not cfg.run.resume:
        raise node_error(f"run.dir {d} exists and is not empty; pass run.resume=true to continue it "
                         f"or choose another run.dir (nothing was overwritten)")
    parent = os.path.abspath(d)
    while not os.path.exists(parent) and os.path.dirname(parent) != parent:
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise NodeError(f"cannot create run.dir {d}: {parent} is a file, not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise NodeError(f"cannot write run.dir {d}: {parent} is not writable")
    if not cfg.run.resume:
        return
    if not checkpoint.complete(d):
        metrics = os.path.join(d, "metrics.jsonl")
        if os.path.isfile(metrics) and os.path.getsize(metrics) > 0:
            raise SystemExit(f"error: run.resume=true but {d} has no complete checkpoint to resume from")
        if int(os.environ.get("RANK", "0")) == 0:
            print(f"run.resume=true: {d} has no checkpoint yet, so the run starts at iteration 0", flush=True)
        return
    saved = os.path.join(d, "config.yaml")
    if not os.path.isfile(saved) and not cfg.run.allow_config_change:
        raise NodeError(f"run.resume=true but {d} has checkpoints and no config.yaml, so this resume cannot be "
                        f"checked to be the same run; put the run's config.yaml back, or pass "
                        f"run.allow_config_change=true to go on with this config")
    if os.path.isfile(saved):
        # the cosine schedule is drawn over train.steps: changing it reshapes the learning rate of the rest
        free = RESUME_FREE if cfg.train.schedule != "cosine" else tuple(k for k in RESUME_FREE if k != "train.steps")
        changes = config_changes(cfg, saved, free=free)
        if changes and not cfg.run.allow_config_change:
            raise NodeError(f"run.resume=true with a config that changes the run saved in {saved}: "
                            f"{'; '.join(changes)}; resume with the same settings, or pass "
                            f"run.allow_config_change=true to go on anyway")


def create_run_dir(cfg: Config, dist_info, identity: dict | None = None):
    """(rank 0) create the folder and save the resolved config, once everything has loaded.

    Called after the models, tokenizer and data loaded, so a run that fails to
    start leaves nothing behind and the corrected command can reuse run.dir.
    The barrier keeps rank 1 from seeing rank 0's fresh folder as another run.
    A resumed run's config.yaml is never overwritten silently: when the new
    config differs at all, the old file is kept as config.<n>.yaml and one
    line says what changed. `identity` (r1/identity.py: fingerprints of the
    data and the starting weights) is recorded in identity.json; a resume
    whose fingerprints differ is refused unless run.allow_config_change.
    """
    from r1.atomic import describe_os_error, lock_folder, refuse_links, write_text
    from r1.config import dump

    distributed.barrier(dist_info)
    if dist_info.main:
        path = os.path.join(cfg.run.dir, "config.yaml")
        try:
            if os.path.lexists(cfg.run.dir):
                refuse_links(cfg.run.dir)  # a resumed folder: nothing in it may lead outside
            os.makedirs(cfg.run.dir, exist_ok=True)
            lock_folder(cfg.run.dir)  # one process writes a run folder at a time
            os.makedirs(os.path.join(cfg.run.dir, "checkpoints"), exist_ok=True)
            os.makedirs(os.path.join(cfg.run.dir, "trajectories"), exist_ok=True)
            text = dump(cfg)
            changes = config_changes(cfg, path, free=("run.resume",)) if os.path.isfile(path) else None
            if changes == []:
                text = None  # the same run: the saved file stays as it is
            elif changes:
                n = 1
                while os.path.exists(os.path.join(cfg.run.dir, f"config.{n}.yaml")):
                    n += 1
                keep = os.path.join(cfg.run.dir, f"config.{n}.yaml")
                os.replace(path, keep)
                what = "run.allow_config_change=true: " if cfg.run.allow_config_change else ""
                print(f"{what}config.yaml updated ({'; '.join(changes)}); the previous one is kept as {keep}",
                      flush=True)
            if text is not None:
                write_text(path, text)
            if identity is not None:
                _record_identity(cfg, identity, write_text)
        except OSError as e:
            raise ConfigError(f"cannot write run.dir {cfg.run.dir}: {describe_os_error(e)}") from None
    distributed.barrier(dist_info)


def _record_identity(cfg: Config, identity: dict, write_text):
    """Check a resumed run's fingerprints against the ones it recorded, then record the current ones."""
    import json

    from r1.identity import changes

    path = os.path.join(cfg.run.dir, "identity.json")
    if os.path.isfile(path):
        from r1.bounded import read_json

        saved = read_json(path, 1 << 20, "run identity")
        changed = changes(saved if isinstance(saved, dict) else {}, identity)
        if changed and not cfg.run.allow_config_change:
            raise NodeError(f"run.resume=true but {', '.join(changed)} no longer holds what the run started from "
                            f"(fingerprints in {path}); restore it, or pass run.allow_config_change=true to go on")
    write_text(path, json.dumps(identity, indent=1) + "\n")


def run_tokenizer(cfg: Config):
    """The run's tokenizer (model.tokenizer, else model.path; the tiny model borrows SmolLM2's)."""
    src = cfg.model.tokenizer or (cfg.model.path if cfg.model.path != "tiny" else "smollm2-135m-instruct")
    tok = load_tokenizer(src, thinking=cfg.model.thinking)
    if tok.hf.chat_template is None:
        raise ValueError(f"tokenizer {src} has no chat template; set model.tokenizer to one that has")
    return tok


def lr_lambda(cfg: Config, total: int):
    """The learning-rate factor of optimizer step `step` out of `total`: linear warm-up over train.warmup
    steps, then constant or (train.schedule=cosine) cosine down to 10%."""
    def f(step):
        if cfg.train.warmup and step < cfg.train.warmup:
            return (step + 1) / cfg.train.warmup
        if cfg.train.schedule == "cosine":
            p = min(1.0, (step - cfg.train.warmup) / max(1, total - cfg.train.warmup))
            return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p))
        return 1.0
    return f
