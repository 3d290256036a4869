"""Checkpoints with torch.distributed.checkpoint, written atomically.

Layout: RUN_DIR/checkpoints/iter_000004/ (a DCP folder: models, optimizers,
schedulers) plus extra.json (iteration, data cursor: what the caller passes
as `extra`; DCP only loads keys the caller already knows, so these plain
values live beside it) and rng_rank{r}.pt per rank, and
RUN_DIR/checkpoints/latest naming the newest complete one. A checkpoint is
written into `iter_N.tmp/` and renamed only when every rank has finished,
then `latest` is replaced atomically: a process killed mid-write leaves the
previous checkpoint and `latest` untouched, and `run.resume=true` goes on
from there. The two newest complete checkpoints are kept.
"""
import contextlib
import json
import os
import shutil
import warnings

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from r1.distributed import barrier


def ckpt_dir(run_dir: str) -> str:
    return os.path.join(run_dir, "checkpoints")


def latest(run_dir: str) -> str | None:
    p = os.path.join(ckpt_dir(run_dir), "latest")
    if not os.path.isfile(p):
        return None
    with open(p) as f:
        name = f.read().strip()
    path = os.path.join(ckpt_dir(run_dir), name)
    return path if os.path.isdir(path) else None


@contextlib.contextmanager
def _quiet():
    """DCP warns on every single-process save/load that it assumes one process, which is the point."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is (disabled, )?unavailable or uninitialized")
        yield


def _state(models: dict, optims: dict, scheds: dict) -> dict:
    state = {"extra": {}}
    for name, model in models.items():
        opt = optims.get(name)
        if opt is not None:
            msd, osd = get_state_dict(model, opt)
            state[f"optim.{name}"] = osd
        else:
            msd, _ = get_state_dict(model, [])
        state[f"model.{name}"] = msd
    for name, s in scheds.items():
        state["extra"][f"sched.{name}"] = s.state_dict()
    return state


def save(run_dir: str, iteration: int, models: dict, optims: dict, scheds: dict, extra: dict, d, keep: int = 2):
    name = f"iter_{iteration:06d}"
    root = ckpt_dir(run_dir)
    final, tmp = os.path.join(root, name), os.path.join(root, name + ".tmp")
    if d.main:
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
    barrier(d)
    with _quiet():
        dcp.save(_state(models, optims, scheds), checkpoint_id=tmp, no_dist=d.world == 1)
    if d.main:
        with open(os.path.join(tmp, "extra.json"), "w") as f:
            json.dump(extra, f)
    torch.save({"torch": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None},
               os.path.join(tmp, f"rng_rank{d.rank}.pt"))
    barrier(d)
    if d.main:
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        with open(os.path.join(root, "latest.tmp"), "w") as f:
            f.write(name)
        os.replace(os.path.join(root, "latest.tmp"), os.path.join(root, "latest"))
        done = sorted(n for n in os.listdir(root) if n.startswith("iter_") and not n.endswith(".tmp"))
        for old in done[:-keep]:
            shutil.rmtree(os.path.join(root, old), ignore_errors=True)
    barrier(d)


def load(path: str, models: dict, optims: dict, scheds: dict, d) -> dict:
    """Restore in place; returns the `extra` dict (iteration, cursor, ...)."""
    state = _state(models, optims, scheds)
    with _quiet():
        dcp.load(state, checkpoint_id=path, no_dist=d.world == 1)
    for name, model in models.items():
        opt = optims.get(name)
        set_state_dict(model, opt if opt is not None else [], model_state_dict=state[f"model.{name}"],
                       optim_state_dict=state.get(f"optim.{name}", {}))
    for name, s in scheds.items():
        s.load_state_dict(state["extra"][f"sched.{name}"])
    rng = os.path.join(path, f"rng_rank{d.rank}.pt")
    if os.path.isfile(rng):
        r = torch.load(rng, weights_only=False)
        torch.set_rng_state(r["torch"])
        if r["cuda"] is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(r["cuda"])
    with open(os.path.join(path, "extra.json")) as f:
        return json.load(f)
