"""The disk plan: what a run will write to run.dir at its fullest, checked against the free space at start-up.

It owns the arithmetic of a run's disk: the bytes of a checkpoint
(r1/checkpoint.py) and of an hf/ export from the model's shape, how many
checkpoints coexist from the config, and the refusal of a run that would
fill the disk before it does any training work, the way r1/memory.py refuses
a plan that does not fit in memory: a run that dies writing a checkpoint has
wasted every minute before it. Everything but `measure()` is arithmetic on
the config; `plan_for` lets rank 0 measure and every rank decide on rank 0's
numbers, so all ranks refuse together with the same line. The estimates are
upper bounds within 0.5% of what tiny runs write (tests/test_disk.py).
"""
import copy
import os
import shutil
from dataclasses import dataclass, field

from r1.config import Config, ConfigError
from r1.memory import GiB, critic_config, lora_param_count, lora_shapes, param_count, roles, rollout_dtype_bytes

ENTRY_BYTES = 2048  # a tensor a rank writes: torch.save's header in the .distcp file (~1.6 KB) and its .metadata entry
STATE_ENTRIES = 20  # an optimizer's parameter-group fields and a scheduler's, stored as byte items by DCP
FILE_BYTES = 16 * 1024  # rng_rank{r}.pt (~7 KB) of each rank; extra.json and manifest.json once
TOKENIZER_BYTES = 128  # hf/'s tokenizer files and configs per vocabulary entry (SmolLM2's: 3.5 MB for 49152)
SAFETENSORS_ENTRY = 256  # a tensor's entry in model.safetensors' JSON header


# ------------------------------------------------------------------ sizes


def tensor_count(mc, value_head: bool = False) -> int:
    """Parameter tensors of a Transformer (r1/model.py): embeddings, per block 4 projections, 3 MLP
    matrices and 2 norms (+ q/k/v biases, + q/k norms), the final norm, and the LM head when untied,
    or the critic's scalar head (weight and bias) instead of any LM head."""
    per_block = 9 + (3 if mc.qkv_bias else 0) + (2 if mc.qk_norm else 0)
    body = 1 + mc.num_layers * per_block + 1
    if value_head:
        return body + 2
    return body + (0 if mc.tie_embeddings else 1)


def model_checkpoint_bytes(mc, world: int, value_head: bool = False) -> int:
    """One trained model in a checkpoint: float32 parameters and AdamW's exp_avg and exp_avg_sq
    (12 bytes a parameter), a float32 step per tensor, and the per-entry overhead of every tensor
    (model and optimizer: 4 per parameter tensor) written by each of `world` ranks."""
    t = tensor_count(mc, value_head)
    return 12 * param_count(mc, value_head) + 4 * t + ENTRY_BYTES * (4 * t * world + STATE_ENTRIES)


def lora_checkpoint_bytes(mc, rank: int, targets, world: int, value_head: bool = False) -> int:
    """One LoRA model in a checkpoint (r1/checkpoint.py saves what trains): its adapters (and the critic's
    value head: weight and bias), 12 bytes a parameter and the same per-tensor costs as above."""
    t = 2 * mc.num_layers * len(lora_shapes(mc, targets)) + (2 if value_head else 0)
    n = lora_param_count(mc, rank, targets) + (mc.hidden_size + 1 if value_head else 0)
    return 12 * n + 4 * t + ENTRY_BYTES * (4 * t * world + STATE_ENTRIES)


def checkpoint_bytes(cfg: Config, mc, world: int) -> int:
    """Bytes of one checkpoint folder of this run: the policy, the critic if the run trains one."""
    m = cfg.model
    if m.lora_rank:
        n = lora_checkpoint_bytes(mc, m.lora_rank, m.lora_targets, world)
        if roles(cfg)["critic"]:
            n += lora_checkpoint_bytes(critic_config(cfg, mc), m.lora_rank, m.lora_targets, world, value_head=True)
        return n + FILE_BYTES * (world + 1)
    n = model_checkpoint_bytes(mc, world)
    if roles(cfg)["critic"]:
        n += model_checkpoint_bytes(critic_config(cfg, mc), world, value_head=True)
    return n + FILE_BYTES * (world + 1)


def adapter_bytes(mc, rank: int, targets) -> int:
    """Bytes of a LoRA run's adapter/ export (r1/lora.py save_peft): float32 adapters, the safetensors
    header, adapter_config.json."""
    return 4 * lora_param_count(mc, rank, targets) + \
        SAFETENSORS_ENTRY * 2 * mc.num_layers * len(lora_shapes(mc, targets)) + FILE_BYTES


def hf_bytes(mc, dtype_size: int) -> int:
    """Bytes of an hf/ export (r1/weights.py save_hf): the policy's parameters in the export dtype
    (a tied LM head is the embedding, saved once), the safetensors header, the tokenizer files."""
    return dtype_size * param_count(mc) + SAFETENSORS_ENTRY * tensor_count(mc) + TOKENIZER_BYTES * mc.vocab_size


# ------------------------------------------------------------------ counts


def saves(steps: int, every: int, start: int = 0, stop: int | None = None) -> int:
    """Checkpoints a run writes going from iteration `start` to `steps`: after every `every`-th
    iteration and after the last (r1/trainer.py fit, r1/sft.py). `stop`: the iteration after which a
    time limit ends the run (it saves there too); never more saves than running to the end."""
    end = steps if stop is None else min(stop, steps)
    if end <= start:
        return 0
    return end // every - start // every + (1 if end % every else 0)


def coexisting(n_saves: int, keep: int, existing: int = 0) -> int:
    """Most checkpoints on disk at once: `existing` ones already there, each new one written whole
    before those beyond `keep` are pruned (r1/checkpoint.py save)."""
    if n_saves == 0:
        return existing
    return max(existing + 1, min(keep + 1, existing + n_saves))


# ------------------------------------------------------------------ the plan


@dataclass
class Found:
    """What the disk holds now (measure()): where run.dir's file system was asked, its free bytes,
    and per run folder its complete checkpoints: (count, bytes, newest iteration)."""
    where: str
    free: int
    checkpoints: dict = field(default_factory=dict)


@dataclass
class Phase:
    """One run's (or one phase's) disk at its fullest."""
    label: str  # "" for a run of one phase, "SFT " / "RL " for the two phases of one command
    checkpoint: int  # bytes of one checkpoint
    count: int  # checkpoints on disk at once, at most
    hf: int  # bytes of its hf/ export
    hf_name: str  # "hf/" or "sft/hf/"
    carried: int = 0  # bytes an earlier phase leaves on disk meanwhile (the SFT phase's sft/hf/)

    @property
    def total(self) -> int:
        return self.carried + self.count * self.checkpoint + self.hf


def phase(cfg: Config, mc, world: int, device_type: str, found: Found, label: str = "", hf_name: str = "hf/",
          carried: int = 0) -> Phase:
    """The disk of a run with this config (train.stage rl or sft), given what run.dir holds already.

    At its fullest, run.dir holds:
    - checkpoints (r1/checkpoint.py `save`, a DCP folder): for every trained
      model (the policy; the critic when the advantage estimator needs one,
      r1/memory.py `roles`) its float32 parameters and AdamW's two float32
      moments, 12 bytes a parameter whatever the world size (the shards add up
      to the whole), plus a 4-byte step per tensor, torch.save's header of each
      tensor a rank writes, the scheduler and parameter-group fields, each
      rank's RNG file, extra.json and manifest.json;
    - how many at once: a new checkpoint is written whole and verified before
      the ones beyond `keep` are pruned, so up to keep + 1 coexist, but never
      more than the run writes (every `checkpoint_every`-th iteration and the
      last; a time limit ends the run with one save, never more than running
      to the end would write) plus those already there (a resume prunes them
      only after its first save). The SFT phase keeps train.keep_checkpoints
      too and, as the warm-up of an RL run, saves every 10 x checkpoint_every
      steps (r1/sft.py `warmup_config`);
    - with model.lora_rank > 0 the checkpoint holds what trains only: the
      adapters (and the critic's value head) with their AdamW moments; the
      export adds adapter/ (float32 adapters) beside the merged hf/, and
      base/ (the frozen base) where model.path is not an HF folder;
    - hf/: the policy in the export dtype (the rollout dtype for RL, float32
      for SFT) and the tokenizer files. The SFT phase of an RL run leaves its
      sft/hf/ for the RL phase (its checkpoints are removed), so the RL phase
      needs that on top of its own (`carried`).
    With run.save=false nothing of this is written (a benchmark).
    Not counted: metrics.jsonl, tensorboard events and trajectories (megabytes
    an iteration).
    """
    sft = cfg.train.stage == "sft"
    keep = cfg.train.keep_checkpoints
    dtype_size = 4 if sft else rollout_dtype_bytes(cfg, device_type)  # r1/sft.py exports float32
    existing, _, newest = found.checkpoints.get(cfg.run.dir, (0, 0, 0))
    start = newest if cfg.run.resume else 0
    n = coexisting(saves(cfg.train.steps, cfg.train.checkpoint_every, start) if cfg.run.save else 0, keep, existing)
    export = hf_bytes(mc, dtype_size) if start < cfg.train.steps and cfg.run.save else 0  # a finished run's hf/ is on disk already
    if export and cfg.model.lora_rank:  # and adapter/ beside the merged hf/
        export += adapter_bytes(mc, cfg.model.lora_rank, cfg.model.lora_targets)
        if not os.path.isfile(os.path.join(os.path.expanduser(cfg.model.path), "config.json")):
            export += hf_bytes(mc, dtype_size)  # base/: a base that is not an HF folder, for adapter/ (r1/lora.py)
    return Phase(label, checkpoint_bytes(cfg, mc, world), n, export, hf_name, carried)


def phases(cfg: Config, mc, world: int, device_type: str, found: Found, sft_of=None) -> list:
    """[the run], or with `sft_of` (cfg -> the config of its SFT phase, r1/sft.py warmup_config)
    [the SFT phase, the RL phase with sft/hf/ on disk]."""
    if sft_of is None:
        return [phase(cfg, mc, world, device_type, found)]
    first = phase(sft_of(cfg), mc, world, device_type, found, "SFT ", "sft/hf/")
    return [first, phase(cfg, mc, world, device_type, found, "RL ", carried=first.hf)]


def plan(cfg: Config, mc, world: int, device_type: str, found: Found, sft_of=None) -> str:
    """The disk plan in one line, or ConfigError (one line with the numbers, naming the keys that
    would make it fit) when the run's fullest moment needs more than is free plus the checkpoints
    it will prune. cfg: the config the user gave (the RL config when `sft_of` adds its SFT phase)."""
    def need(c):
        return max(p.total for p in phases(c, mc, world, device_type, found, sft_of))

    ps = phases(cfg, mc, world, device_type, found, sft_of)
    held = sum(b for _, b, _ in found.checkpoints.values())
    available = found.free + held
    peak = max(ps, key=lambda p: p.total)
    room = f"{_gib(available)} free" if not held else \
        f"{_gib(available)} ({_gib(found.free)} free + {_gib(held)} of earlier checkpoints)"
    if peak.total <= available:
        parts = [f"{p.label}checkpoint {_gib(p.checkpoint)} x {p.count} + {p.hf_name} {_gib(p.hf)}"
                 + (" + sft/hf/ " + _gib(p.carried) if p.carried else "") + f" = {_gib(p.total)}" for p in ps]
        total = f"; peak {_gib(peak.total)}" if len(ps) > 1 else ""
        return f"disk plan: {', then '.join(parts)}{total} of {room} under {found.where}"
    what = (f"{peak.count} {peak.label}checkpoint{'s' if peak.count != 1 else ''} of {_gib(peak.checkpoint)} + "
            f"{peak.hf_name} {_gib(peak.hf)}" + (f" + sft/hf/ {_gib(peak.carried)}" if peak.carried else ""))
    fixes = _fixes(cfg, need, available)
    missing = _gib(peak.total - available)
    short = f"{missing} short"
    if held and cfg.run.resume:  # its checkpoints are in this run.dir: moving away would start over
        fix = f"free {missing} under {found.where}" + (f" or set {' or '.join(fixes)}" if fixes else "")
    else:
        fix = (f"set {' or '.join(fixes)}, or use a run.dir" if fixes else "use a run.dir") + " on a larger disk"
    raise ConfigError(f"disk: {what} need {_gib(peak.total)} under {found.where} ({room}, {short}); {fix}")


def _fixes(cfg: Config, need, available: int) -> list:
    """The keys that alone would make the run fit: the most checkpoints to keep, the least spacing."""
    def with_(key, value):
        c = copy.deepcopy(cfg)
        setattr(c.train, key, value)
        return c

    out = []
    keep = cfg.train.keep_checkpoints
    if keep > 1 and need(with_("keep_checkpoints", 1)) <= available:  # fewer kept never needs more
        lo, hi = 1, keep  # fits at lo, not at hi
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if need(with_("keep_checkpoints", mid)) <= available else (lo, mid)
        out.append(f"train.keep_checkpoints={lo}")
    every = cfg.train.checkpoint_every
    most = max(cfg.train.steps, cfg.train.sft_steps, every + 1)  # one save a phase, at its end
    if need(with_("checkpoint_every", most)) <= available:
        lo, hi = every, most  # not at lo, fits at hi
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if need(with_("checkpoint_every", mid)) <= available else (mid, hi)
        out.append(f"train.checkpoint_every={hi}")
    return out


def _gib(b: int) -> str:
    """Bytes for people: GiB with one decimal, MiB below 1 GiB (a tiny run's plan is not all zeros)."""
    return f"{b / GiB:.1f} GiB" if b >= GiB else f"{b / 2**20:.1f} MiB"


# ------------------------------------------------------------------ the machine


def measure(where_dir: str, run_dirs: list) -> Found:
    """Free bytes of the file system that will hold `where_dir` (its nearest existing ancestor) and
    the complete checkpoints in each of `run_dirs` (r1/checkpoint.py complete)."""
    from r1 import checkpoint

    where = os.path.abspath(where_dir)
    while not os.path.exists(where) and os.path.dirname(where) != where:
        where = os.path.dirname(where)
    found = Found(where, shutil.disk_usage(where).free)
    for run_dir in run_dirs:
        done = checkpoint.complete(run_dir)
        if done:
            size = sum(os.path.getsize(os.path.join(root, f)) for p in done for root, _, files in os.walk(p)
                       for f in files)
            newest = int(checkpoint.NAME_RE.fullmatch(os.path.basename(done[0])).group(1))
            found.checkpoints[run_dir] = (len(done), size, newest)
    return found


def plan_for(cfg: Config, mc, d, then_rl: Config | None = None, sft_of=None) -> str | None:
    """plan() for this run (d: r1.distributed.Dist), printed as one line on rank 0. Rank 0 measures
    the disk; every rank plans with its numbers, so all refuse together. None when nothing is saved
    (train.steps=0: eval.py). `then_rl`: cfg is the SFT phase of this RL config (train.sft_steps), which
    `sft_of` derives from it (r1/sft.py warmup_config; passed in, as this module sits below r1/sft.py)."""
    from r1 import distributed

    if cfg.train.steps == 0:
        return None
    user, sft_of = (cfg, None) if then_rl is None else (then_rl, sft_of)
    dirs = [cfg.run.dir] + ([then_rl.run.dir] if then_rl is not None else [])
    mine = None
    if d.main:
        try:
            mine = measure(user.run.dir, dirs)
        except OSError as e:  # every rank must hear of it, or the others wait in the gather forever
            mine = f"disk: could not measure the free space for run.dir {user.run.dir}: {e}"
    found = distributed.gather_objects(mine, d)[0]
    if isinstance(found, str):
        raise ConfigError(found)
    line = plan(user, mc, d.world, d.device.type, found, sft_of)
    if d.main:
        print(line, flush=True)
    return line
