"""A run's identity: fingerprints of its training data and of the weights it starts from, recorded at start
(`run.dir/identity.json`) and checked on resume.

The config check of a resume (r1/run.py config_changes) compares keys, not what they point at: the same
`data.path` or `model.path` can hold other files by the time a run resumes, and the run would go on as a
different run under the same name (a reference policy for the KL term that is not the one it started
with). The data is hashed whole (rows as JSON: a few MB for GSM8K); weight files by name, size and the
SHA-256 of their first and last MiB, so a 3B checkpoint costs milliseconds, and a copy of the same files
(other mtimes) is the same run.
"""
import hashlib
import json
import os

EDGE = 1 << 20  # bytes hashed at each end of a weight file


def rows_fingerprint(rows: list) -> str:
    h = hashlib.sha256()
    for row in rows:
        h.update(json.dumps(row, sort_keys=True, default=str).encode("utf-8"))
        h.update(b"\n")
    return h.hexdigest()[:16]


def _file_digest(path: str, h) -> None:
    size = os.path.getsize(path)
    h.update(f"{os.path.basename(path)}:{size}:".encode())
    with open(path, "rb") as f:
        h.update(f.read(EDGE))
        if size > 2 * EDGE:
            f.seek(size - EDGE)
            h.update(f.read(EDGE))


def weights_fingerprint(spec: str | None) -> str | None:
    """model.path-like spec -> a short digest of its weight and config files; None for `tiny`/unset."""
    if spec in (None, "tiny"):
        return None
    from r1.weights import resolve

    path = str(resolve(spec))
    h = hashlib.sha256()
    if os.path.isdir(path):
        for name in sorted(os.listdir(path)):
            full = os.path.join(path, name)
            if os.path.isfile(full) and name.endswith((".safetensors", ".json", ".gguf", ".bin")):
                _file_digest(full, h)
    else:
        _file_digest(path, h)
    return h.hexdigest()[:16]


def run_identity(cfg, train_rows: list) -> dict:
    """What a run is made of beyond its config keys: the train rows and the weights it starts from."""
    paths = {"model.path": cfg.model.path, "model.critic_path": cfg.model.critic_path,
             "model.ref_path": cfg.model.ref_path}
    out = {"data": rows_fingerprint(train_rows)}
    out.update({k: weights_fingerprint(v) for k, v in paths.items() if v is not None})
    return out


def changes(saved: dict, now: dict) -> list:
    """['data', 'model.path', ...]: the parts whose fingerprint differs (a part missing on either side is not
    compared: an older run folder records less)."""
    return [k for k in now if k in saved and saved[k] != now[k]]
