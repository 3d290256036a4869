"""Process group, FSDP2 wrapping and the small collectives the trainer needs.

torchrun is the distributed engine (rendezvous, multi-node); this file only reads its environment.
`parallelize()` follows torchtitan's order: activation checkpointing -> `fully_shard` per block ->
`fully_shard` root, with `MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)` on CUDA. A plain
`python train.py` on a CPU is world size 1 with no wrapping, so the laptop run and the multi-GPU run are
the same code path above this file.

Leaving a gloo group (CPU ranks): `init()` registers `close()` to run at exit, and `leave(code)`, which
`run_main` calls when a command ends, destroys the group, flushes and leaves with `os._exit(code)`, so
gloo's worker threads never meet the interpreter's teardown (they aborted ranks with SIGABRT: docs/
decisions.md, "Leaving a gloo group"). NCCL is left to its destructor: destroying it while another rank
is stuck in a collective (a failed run) can hang.
"""
import atexit
import os
import sys
import traceback
from dataclasses import dataclass

import torch
import torch.distributed as dist


_gloo = False  # init() opened a gloo group in this process: leave() ends it with os._exit


@dataclass
class Dist:
    rank: int
    world: int
    local_rank: int
    device: torch.device

    @property
    def main(self) -> bool:
        return self.rank == 0


def init(device: str = "auto") -> Dist:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = torch.cuda.is_available() if device == "auto" else device == "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("run.device=cuda but CUDA is not available on this machine")
    dev = torch.device("cuda", local) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(dev)
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if use_cuda else "gloo", device_id=dev if use_cuda else None)
        if not use_cuda:
            global _gloo
            _gloo = True
            atexit.register(close)
    return Dist(rank, world, local, dev)


def parallelize(model, d: Dist, activation_checkpointing: bool = False, dtype=torch.bfloat16, ignored=None):
    """Wrap for training: checkpointing, then FSDP2 per block and root (world > 1 only). `ignored`: parameters
    FSDP leaves whole and untouched on every rank (LoRA's frozen base, which two models share: r1/lora.py)."""
    if activation_checkpointing:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

        for i, block in enumerate(model.model.layers):
            model.model.layers[i] = checkpoint_wrapper(block)
    if d.world == 1:
        return model
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32) if d.device.type == "cuda" else None
    kw = {"mp_policy": mp} if mp is not None else {}
    if ignored:
        kw["ignored_params"] = ignored
    for block in model.model.layers:
        fully_shard(block, **kw)
    fully_shard(model, **kw)
    return model


def full_state_dict(model) -> dict:
    """Full (unsharded) tensors of a possibly FSDP-wrapped model, on every rank."""
    sd = model.state_dict()
    out = {}
    for k, v in sd.items():
        k = k.replace("_checkpoint_wrapped_module.", "")
        out[k] = v.full_tensor() if hasattr(v, "full_tensor") else v
    return out


def all_sum(x: float | torch.Tensor, d: Dist, device=None) -> torch.Tensor:
    t = torch.as_tensor(x, dtype=torch.float64, device=device or d.device).clone()
    if d.world > 1:
        dist.all_reduce(t)
    return t


def all_max(x: float, d: Dist) -> float:
    t = torch.tensor(float(x), dtype=torch.float64, device=d.device)
    if d.world > 1:
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def gather_objects(obj, d: Dist) -> list:
    if d.world == 1:
        return [obj]
    out = [None] * d.world
    dist.all_gather_object(out, obj)
    return out


def barrier(d: Dist):
    if d.world > 1:
        dist.barrier()


def close():
    """Destroy the process group, if one is up (a no-op the second time, and at world size 1)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def leave(code: int, print_error: bool = False) -> None:
    """End this process now with `code` if init() opened a gloo group here: the exception being handled's
    traceback if `print_error`, destroy the group, flush stdout and stderr, os._exit (the module docstring
    says why). Otherwise return, and the caller exits as usual."""
    if not _gloo:
        return
    if print_error:
        traceback.print_exc()
    close()
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except (OSError, ValueError):  # a closed pipe or file: nothing more can be said there
            pass
    os._exit(code)
