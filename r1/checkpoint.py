"""Checkpoints of a run (RL and SFT): atomic, checksummed, never unpickling code.

It owns RUN_DIR/checkpoints/: per saved iteration a torch.distributed.checkpoint
(DCP) folder, iter_000004/ (models, optimizers, schedulers), with extra.json
(what the caller passes as `extra`: DCP only loads keys the caller already
knows, so these plain values live beside it), rng_rank{r}.pt per rank and
manifest.json (size and sha256 of every other file); and `latest`, naming the
newest verified one. A resume must never read half a checkpoint nor run code
from one: `save` verifies before it publishes, `resume` before it reads.
"""
import contextlib
import hashlib
import io
import json
import logging
import os
import pickle
import re
import shutil
import warnings
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from r1.atomic import describe_os_error, fsync_dir, fsync_file, write_text
from r1.distributed import all_max, barrier

MANIFEST = "manifest.json"
NAME_RE = re.compile(r"iter_(\d{6,})")


class CheckpointError(RuntimeError):
    """A checkpoint could not be written or no usable one could be read: one line, naming the folder."""


def ckpt_dir(run_dir: str) -> str:
    return os.path.join(run_dir, "checkpoints")


def latest(run_dir: str) -> str | None:
    """The folder `latest` names, if it names a checkpoint folder that exists (not yet verified)."""
    p = os.path.join(ckpt_dir(run_dir), "latest")
    if not os.path.isfile(p):
        return None
    try:
        with open(p) as f:
            name = f.read(64).strip()
    except (OSError, UnicodeDecodeError):
        return None
    if not NAME_RE.fullmatch(name):  # never a path: `latest` cannot send a resume outside checkpoints/
        return None
    path = os.path.join(ckpt_dir(run_dir), name)
    return path if os.path.isdir(path) else None


def complete(run_dir: str) -> list:
    """Finished checkpoint folders (iter_N, not .tmp), newest first, the one `latest` names leading."""
    root = ckpt_dir(run_dir)
    if not os.path.isdir(root):
        return []
    found = sorted((n for n in os.listdir(root) if NAME_RE.fullmatch(n) and os.path.isdir(os.path.join(root, n))),
                   key=lambda n: int(NAME_RE.fullmatch(n).group(1)), reverse=True)
    paths = [os.path.join(root, n) for n in found]
    head = latest(run_dir)
    if head in paths:
        paths.remove(head)
        paths.insert(0, head)
    return paths


@contextlib.contextmanager
def _quiet():
    """DCP warns on every single-process save/load that it assumes one process, which is the point; and it
    logs its own tracebacks for a failure that reaches the caller anyway (then said in one line)."""
    before = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="torch.distributed is (disabled, )?unavailable or uninitialized")
            yield
    finally:
        logging.disable(before)


def _options(model) -> StateDictOptions | None:
    """A model with frozen parameters (LoRA's shared base, r1/lora.py) saves and loads only what trains:
    the base is model.path's, read again at start-up; nothing to do with it here."""
    if all(p.requires_grad for p in model.parameters()):
        return None
    return StateDictOptions(ignore_frozen_params=True, strict=False)


def _state(models: dict, optims: dict, scheds: dict) -> dict:
    state = {"extra": {}}
    for name, model in models.items():
        opt = optims.get(name)
        if opt is not None:
            msd, osd = get_state_dict(model, opt, options=_options(model))
            state[f"optim.{name}"] = osd
        else:
            msd, _ = get_state_dict(model, [], options=_options(model))
        state[f"model.{name}"] = msd
    for name, s in scheds.items():
        state["extra"][f"sched.{name}"] = s.state_dict()
    return state


# ------------------------------------------------------------------ integrity


def _sha256(path: str) -> tuple:
    h, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
            size += len(chunk)
    return size, h.hexdigest()


def _files(folder: str) -> list:
    return sorted(n for n in os.listdir(folder) if n != MANIFEST and os.path.isfile(os.path.join(folder, n)))


def write_manifest(folder: str, iteration: int):
    """fsync and hash every file of `folder` (the bytes as read back), then write manifest.json durably."""
    names = _files(folder)
    for n in names:
        fsync_file(os.path.join(folder, n))
    with ThreadPoolExecutor(max_workers=4) as pool:  # hashlib releases the GIL on large buffers
        sums = list(pool.map(lambda n: _sha256(os.path.join(folder, n)), names))
    files = {n: {"size": size, "sha256": digest} for n, (size, digest) in zip(names, sums)}
    write_text(os.path.join(folder, MANIFEST), json.dumps({"format": 1, "iteration": iteration, "files": files},
                                                          indent=1))
    fsync_dir(folder)


def verify(folder: str) -> str | None:
    """None if every file matches manifest.json; else the reason, naming the file. Reads nothing else first."""
    path = os.path.join(folder, MANIFEST)
    if not os.path.isfile(path):
        return "no manifest.json"
    try:
        with open(path, encoding="utf-8") as f:
            manifest = json.load(f)
        files = manifest["files"]
        if not isinstance(files, dict) or not all(isinstance(v, dict) for v in files.values()):
            raise ValueError("'files' is not a mapping")
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"unreadable manifest.json ({str(e)[:80]})"
    present = set(_files(folder))
    for name in sorted(present - set(files)):
        return f"{name} is not listed in manifest.json"
    for name, want in sorted(files.items()):
        if "/" in name or name.startswith(".."):
            return f"manifest.json lists a path outside the folder: {name!r:.60}"
        if name not in present:
            return f"{name} is missing"
        size = os.path.getsize(os.path.join(folder, name))
        if size != want.get("size"):
            return f"{name} has {size} bytes, manifest.json says {want.get('size')}"
        if _sha256(os.path.join(folder, name))[1] != want.get("sha256"):
            return f"{name} does not match its sha256 in manifest.json (corrupted)"
    return None


# ------------------------------------------------------------------ safe readers

# Everything a DCP .metadata pickle of r1's state may reference; anything else is refused unbuilt.
_DCP_META = {"Metadata", "MetadataIndex", "StorageMeta", "TensorProperties", "TensorStorageMetadata",
             "BytesStorageMetadata", "ChunkStorageMetadata", "_MEM_FORMAT_ENCODING"}
_ALLOWED = {("torch.distributed.checkpoint.metadata", n) for n in _DCP_META} | {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"), ("torch", "Size"),
    ("torch.serialization", "_get_layout"), ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"),
    ("pathlib", "WindowsPath"), ("pathlib", "PureWindowsPath"), ("collections", "OrderedDict")}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if (module, name) in _ALLOWED or (module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f".metadata references {module}.{name}, which a DCP checkpoint never holds "
                                     f"(refused: unpickling it could run code)")


class _SafeReader(dcp.FileSystemReader):
    def read_metadata(self, *args, **kwargs):
        path = self._get_metadata_path(kwargs.get("rank"))
        with self.fs.create_stream(path, "rb") as f:
            metadata = _MetadataUnpickler(f).load()
        from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

        if not isinstance(metadata, Metadata):
            raise pickle.UnpicklingError(f".metadata holds a {type(metadata).__name__}, not DCP Metadata")
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class _SafePlanner(DefaultLoadPlanner):
    """DCP's non-tensor items (optimizer hyper-parameters, scheduler state) with weights_only=True."""

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        obj = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj


# ------------------------------------------------------------------ save / load


def save(run_dir: str, iteration: int, models: dict, optims: dict, scheds: dict, extra: dict, d, keep: int = 2):
    """Write checkpoint `iteration`, verify it, point `latest` at it, then prune beyond `keep` (>= 1).

    Everything goes into `iter_N.tmp/`; once every rank has finished, rank 0
    fsyncs and hashes each file (reading the bytes back from disk), writes the
    manifest (temp, fsync, rename), renames the folder to `iter_N`, fsyncs the
    parent and only then points `latest` at it and prunes older checkpoints
    beyond `keep` (the new, verified one is never pruned, so the last good one
    always survives). A process killed mid-write, or a full disk, leaves the
    previous checkpoint and `latest` untouched; a write error is one line
    (CheckpointError) naming the cause ("no space left on device").
    """
    name = f"iter_{iteration:06d}"
    root = ckpt_dir(run_dir)
    final, tmp = os.path.join(root, name), os.path.join(root, name + ".tmp")
    failed = None
    try:
        if d.main:
            shutil.rmtree(tmp, ignore_errors=True)
            os.makedirs(tmp)
        barrier(d)
        with _quiet():
            dcp.save(_state(models, optims, scheds), checkpoint_id=tmp, no_dist=d.world == 1)
        if d.main:
            write_text(os.path.join(tmp, "extra.json"), json.dumps(extra))
        buf = io.BytesIO()
        torch.save({"torch": torch.get_rng_state(),
                    "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}, buf)
        with open(os.path.join(tmp, f"rng_rank{d.rank}.pt"), "wb") as f:
            f.write(buf.getvalue())
    except (Exception, CheckpointException) as e:  # noqa: BLE001 - any write failure: one line below, every rank
        failed = e
    if all_max(float(failed is not None), d) > 0:
        if d.main:
            shutil.rmtree(tmp, ignore_errors=True)
        prev = latest(run_dir)
        why = describe_os_error(failed) if failed is not None else "another rank failed to write its part"
        raise CheckpointError(f"could not write checkpoint {final}: {why}; "
                              + (f"{prev} is intact: free space and resume with run.resume=true"
                                 if prev else "no earlier checkpoint exists")) from failed
    barrier(d)
    if d.main:
        try:
            write_manifest(tmp, iteration)
            shutil.rmtree(final, ignore_errors=True)
            os.replace(tmp, final)
            fsync_dir(root)
            write_text(os.path.join(root, "latest"), name)
        except OSError as e:
            shutil.rmtree(tmp, ignore_errors=True)
            raise CheckpointError(f"could not write checkpoint {final}: {describe_os_error(e)}; the previous "
                                  f"checkpoint is intact: free space and resume with run.resume=true") from e
        # prune only now that `final` is complete, hashed from disk and named by `latest`
        done = [p for p in complete(run_dir) if p != final]
        for old in done[max(0, keep - 1):]:
            shutil.rmtree(old, ignore_errors=True)
    barrier(d)


def _load_rng(path: str):
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's note on the pickle protocol of a refused file
            r = torch.load(path, weights_only=True)  # tensors, lists and None only: no code
    except pickle.UnpicklingError:
        raise ValueError(f"{os.path.basename(path)} holds more than tensors (refused: unpickling it could run "
                         f"code)") from None
    if not isinstance(r, dict) or not torch.is_tensor(r.get("torch")) or r["torch"].dtype != torch.uint8:
        raise ValueError(f"{path}: not an RNG state")
    torch.set_rng_state(r["torch"])
    if r.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(r["cuda"])


def load(path: str, models: dict, optims: dict, scheds: dict, d, verified: bool = False) -> dict:
    """Restore in place from one checkpoint folder; returns the `extra` dict (iteration, cursor, ...).

    Verifies the folder first (unless the caller just did); a damaged one raises CheckpointError.
    No code runs on load, even for a checkpoint whose author also forged the
    manifest: DCP's `.metadata` is a pickle, so it is read with an unpickler
    that only builds DCP's own metadata classes, torch dtypes/sizes/layouts and
    paths (anything else is refused by name); DCP's non-tensor items and the
    RNG files go through `torch.load(weights_only=True)`; extra.json and the
    manifest are JSON. A checkpoint without a manifest (written before
    checkpoints were checksummed) is loaded with the same safe readers and a
    warning that it cannot be verified.
    """
    if not verified:
        problem = verify(path) if d.main else None
        if all_max(float(problem is not None), d) > 0:
            raise CheckpointError(f"checkpoint {path} is damaged: {problem or 'rank 0 found it damaged'}")
    with open(os.path.join(path, "extra.json"), encoding="utf-8") as f:
        extra = json.load(f)
    if not isinstance(extra, dict) or not isinstance(extra.get("iteration"), int) or extra["iteration"] < 0:
        raise ValueError(f"{path}/extra.json: 'iteration' is not a non-negative integer")
    state = _state(models, optims, scheds)
    with _quiet():
        dcp.load(state, storage_reader=_SafeReader(path), planner=_SafePlanner(), no_dist=d.world == 1)
    for name, model in models.items():
        opt = optims.get(name)
        set_state_dict(model, opt if opt is not None else [], model_state_dict=state[f"model.{name}"],
                       optim_state_dict=state.get(f"optim.{name}", {}), options=_options(model))
    for name, s in scheds.items():
        s.load_state_dict(state["extra"][f"sched.{name}"])
    rng = os.path.join(path, f"rng_rank{d.rank}.pt")
    if os.path.isfile(rng):
        _load_rng(rng)
    return extra


def _reason(e: BaseException) -> str:
    """One line for a failed load; DCP wraps the real error of each rank in a CheckpointException."""
    refused = re.search(r"[^;:]* references [^;]*?\(refused: unpickling it could run code\)", str(e))
    if refused:
        text = refused.group(0).strip()
    elif isinstance(e, CheckpointException):
        inner = [f for f in getattr(e, "failures", {}).values() if isinstance(f, BaseException)]
        text = str(inner[0]) if inner else str(e)
        lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith((" ", "Traceback"))]
        text = lines[-1] if lines else text
    else:
        text = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return text[:200]


def resume(run_dir: str, models: dict, optims: dict, scheds: dict, d) -> tuple:
    """Load the newest usable checkpoint: (path, extra). A damaged one is skipped loudly for an older one;
    CheckpointError when there is none (listing what was wrong with each).

    Candidates come newest first (`latest` first; a `latest` naming a missing
    folder falls back to the others). Each is verified before any of it is
    read: every file listed with the right size and sha256, no file unlisted.
    """
    tried = []
    for path in complete(run_dir):
        problem = verify(path) if d.main else None
        if problem == "no manifest.json":
            warnings.warn(f"checkpoint {path} has no manifest.json (written before checkpoints were checksummed): "
                          f"loading it unverified")
            problem = None
        bad = all_max(float(problem is not None), d) > 0
        if not bad:
            try:
                return path, load(path, models, optims, scheds, d, verified=True)
            except (Exception, CheckpointException) as e:  # noqa: BLE001 - refused by a safe reader, not this model
                problem = _reason(e)
        tried.append(f"{os.path.basename(path)}: {problem or 'damaged on another rank'}")
        warnings.warn(f"checkpoint {path} is not usable ({tried[-1].split(': ', 1)[1]}); trying the previous one")
    if not tried:
        raise CheckpointError(f"run.resume=true but {run_dir} has no complete checkpoint to resume from")
    raise CheckpointError(f"run.resume=true but no checkpoint in {ckpt_dir(run_dir)} is usable: " + "; ".join(tried))
