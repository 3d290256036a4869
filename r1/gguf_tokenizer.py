"""GGUF tokenizers: transformers' conversion, its special tokens fixed, cached on disk.

Converting a GGUF's vocabulary costs about 20 s of a laptop core for SmolLM2, paid by every command that
loads it; the converted tokenizer is saved once under the cache (`cache_root`: R1_CACHE, else
~/.cache/r1) and read back in under a second. An entry is keyed by the hash of the file's metadata
bytes, the cache format and transformers' version, so a changed file or another converter never meets
an old entry. It is written to a temporary folder with a manifest of its files' hashes, read back and
compared with the conversion (tokenizer spec, added and special tokens, template, a probe's ids both
ways), then renamed into place: a half-written or inexact entry is never read, one changed later fails
its manifest and is rebuilt. Nothing here may change an id (tests/test_gguf_tokenizer.py).
transformers 5.x sets a GGUF tokenizer's `eos_token` to the BOS token (`integrations/ggml.py`), so
bos/eos/pad are reset from the GGUF metadata r1/weights.py read (`_fix_gguf_special_tokens`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from r1.bounded import open_regular, read_json

MANIFEST = "r1-manifest.json"
GGUF_CACHE_FORMAT = 1  # bump when what an entry holds changes: older entries are then never read
GGUF_PROBE = ("Hello, world! 12*7 = 84.\n\t  \u65e5\u672c\u8a9e \u200b caf\u00e9 <|im_start|>assistant\n"
              '<tool_call>\n{"name": "calc", "arguments": {"x": "3 / 4"}}\n</tool_call><|im_end|>\n')


def cache_root():
    """Where r1 keeps what it can rebuild (converted GGUF tokenizers): R1_CACHE, else $XDG_CACHE_HOME/r1, else
    ~/.cache/r1. R1_CACHE=off (or empty): no cache, every load converts."""
    v = os.environ.get("R1_CACHE")
    if v is not None:
        return None if v.strip().lower() in ("", "0", "off", "none") else v
    return os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "r1")


def gguf_cache_key(path, metadata_end: int) -> str:
    """The hash of a GGUF's first metadata_end bytes (its header and key-values: r1/weights.py gguf_header), the
    cache format and transformers' version: a file whose tokenizer changed, or another converter, never meets
    an old entry. Reads about 3 MB for SmolLM2, not the weights."""
    import transformers

    h = hashlib.sha256(f"r1 gguf tokenizer {GGUF_CACHE_FORMAT} transformers {transformers.__version__}\n".encode())
    return _hash(path, "GGUF file", h, metadata_end)[:32]


def _hash(path, what: str, h=None, limit: int | None = None) -> str:
    """sha256 (or `h` continued) of a regular file's first `limit` bytes (all of them: None), read 1 MiB at a
    time: an entry's file grown huge by accident is hashed, not loaded into memory."""
    h = h or hashlib.sha256()
    with open_regular(path, what) as f:
        left = float("inf") if limit is None else limit
        while left > 0 and (chunk := f.read(int(min(left, 1 << 20)))):
            h.update(chunk)
            left -= len(chunk)
    return h.hexdigest()


def gguf_tokenizer(p: Path, header: dict):
    """The GGUF's tokenizer as transformers converts it (special tokens set from the metadata), through the
    cache: an entry that fails to load is converted again and replaced; a cache that cannot be written costs
    only the time."""
    from transformers import AutoTokenizer

    root = cache_root()
    entry = os.path.join(root, "gguf-tokenizers", gguf_cache_key(p, header["metadata_end"])) if root else None
    if entry and os.path.isdir(entry):
        try:
            if _manifest(entry) != read_json(os.path.join(entry, MANIFEST), 1 << 20, "tokenizer cache manifest"):
                raise ValueError("an entry's file changed since it was written")
            hf = AutoTokenizer.from_pretrained(entry)
            _fix_gguf_special_tokens(hf, header["kv"])
            return hf
        except Exception:  # noqa: BLE001 - a damaged entry (a file edited, truncated by a full disk): rebuilt
            shutil.rmtree(entry, ignore_errors=True)
    hf = _convert(p, header["kv"])
    if entry:
        _save_entry(hf, header["kv"], entry)
    return hf


def _convert(p: Path, kv: dict):
    """transformers' own conversion of a GGUF's tokenizer (the slow step the cache saves), special tokens fixed."""
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name)
    _fix_gguf_special_tokens(hf, kv)
    return hf


def _save_entry(hf, kv: dict, entry: str) -> None:
    """Save `hf` as the cache entry: into a temporary folder beside it with a manifest of its files' hashes,
    read back, kept only if the read-back tokenizer is the same (same_tokenizer), then renamed into place
    (another process that got there first keeps its entry)."""
    from transformers import AutoTokenizer

    tmp = None
    try:
        os.makedirs(os.path.dirname(entry), exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=".tmp-", dir=os.path.dirname(entry))
        os.chmod(tmp, 0o755)  # mkdtemp's 0700 would keep a shared R1_CACHE to its first writer
        hf.save_pretrained(tmp)
        with open(os.path.join(tmp, MANIFEST), "w") as f:
            json.dump(_manifest(tmp), f)
        back = AutoTokenizer.from_pretrained(tmp)
        _fix_gguf_special_tokens(back, kv)
        if same_tokenizer(hf, back):
            os.rename(tmp, entry)
            tmp = None
    except Exception:  # noqa: BLE001 - a read-only or full cache, a lost race: the conversion serves as it is
        pass
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


def _manifest(folder: str) -> dict:
    """{file name: sha256} of an entry's files (its manifest aside): checked before an entry is read, so one
    edited or damaged after it was written is rebuilt, not trusted (about 10 ms for SmolLM2's 3.5 MB)."""
    out = {}
    for name in sorted(os.listdir(folder)):
        if name != MANIFEST:
            out[name] = _hash(os.path.join(folder, name), "tokenizer cache file")
    return out


def same_tokenizer(a, b) -> bool:
    """Whether two transformers tokenizers give the same ids: the whole backend spec (normalizer, pre-tokenizer,
    vocabulary and merges, decoder), added and special tokens, chat template, and a probe's ids both ways."""
    def added(t):
        return {i: (x.content, x.special) for i, x in t.added_tokens_decoder.items()}

    def special(t):
        return (t.bos_token_id, t.eos_token_id, t.pad_token_id, t.unk_token_id)

    spec = [getattr(t, "backend_tokenizer", None) for t in (a, b)]
    if None in spec or spec[0].to_str() != spec[1].to_str():
        return False
    ids = a(GGUF_PROBE, add_special_tokens=False)["input_ids"]
    return (type(a) is type(b) and added(a) == added(b) and special(a) == special(b)
            and a.chat_template == b.chat_template and len(a) == len(b)
            and ids == b(GGUF_PROBE, add_special_tokens=False)["input_ids"]
            and a.decode(ids, clean_up_tokenization_spaces=False)
            == b.decode(ids, clean_up_tokenization_spaces=False))


def _fix_gguf_special_tokens(hf, kv: dict) -> None:
    """bos/eos/pad from the GGUF's key-values as r1/weights.py gguf_header read them (and checked: each id one of
    the vocabulary's), not from a second read of the file."""
    for key, attr in (("bos", "bos_token"), ("eos", "eos_token"), ("padding", "pad_token")):
        token_id = kv.get(f"tokenizer.ggml.{key}_token_id")
        if token_id is not None:
            setattr(hf, attr, hf.convert_ids_to_tokens(int(token_id)))
