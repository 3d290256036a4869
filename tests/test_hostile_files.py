"""What a model folder, a data file or a config path can do to a run.

Classes: model folders that point outside themselves; reads without a bound (inflating gzip files,
huge metrics files, damaged GGUF headers, a FIFO or /dev/zero as a config); failures that would come
late or as tracebacks at start (tokenizer ids past the embedding, 0 heads, damaged safetensors
headers); private-use characters in text rewritten before the model saw them.

Processes that would exhaust memory without the bounds run in a subprocess under RLIMIT_AS (3 GiB:
torch's CPU import peaks under 1 GiB of address space), so a regression ends in a MemoryError there
instead of taking the machine's memory; ones that would hang have a subprocess timeout. No test
asserts on wall time: reads are bounded by byte, line and row counts.
"""
import gzip
import json
import os
import random
import resource
import struct
import subprocess
import sys

import pytest
import torch

from byte_tokenizer import CHATML, save_byte_tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMOKE = os.path.join(ROOT, "configs", "smoke.yaml")
GiB = 1 << 30


def run(args, memory=None, timeout=300):
    """A command as a user runs it (in the repo root); `memory` caps its address space (bytes)."""
    def limit():
        if memory:
            resource.setrlimit(resource.RLIMIT_AS, (memory, memory))

    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="2")
    return subprocess.run([sys.executable, *map(str, args)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout, preexec_fn=limit)


def one_error_line(proc, *culprits, status=2):
    assert "Traceback" not in proc.stderr and "MemoryError" not in proc.stderr, proc.stderr[-800:]
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == status, f"exit {proc.returncode}: {proc.stderr[-600:]}"
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-600:]
    for c in culprits:
        assert str(c) in lines[0], f"{c!r} not in {lines[0]!r}"
    return lines[0]


def gzip_bomb(path, gib=3, byte=b"0"):
    """About 1 MB per GiB: a gzip of `gib` GiB of one byte, as repeated members (what gzip reads as one stream)."""
    member = gzip.compress(byte * (64 << 20), 9)
    with open(path, "wb") as f:
        for _ in range(gib * 16):
            f.write(member)
    return path


def tiny_hf(path, vocab=96, **overrides):
    """A random transformers llama saved as an HF folder (model.safetensors + config.json)."""
    import transformers

    config = transformers.LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(path)
    if overrides:
        cfg = json.loads((path / "config.json").read_text())
        cfg.update(overrides)
        (path / "config.json").write_text(json.dumps(cfg))
    return path


# ================================================================== 1. model folders stay inside themselves

def sharded(tmp_path):
    """A model saved in shards, and a copy of one shard outside the folder (what an escaping index would load)."""
    import transformers

    folder = tmp_path / "model"
    config = transformers.LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(folder, max_shard_size="20KB")
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    first = sorted(set(index["weight_map"].values()))[0]
    (tmp_path / "outside").mkdir()
    os.replace(folder / first, tmp_path / "outside" / first)
    return folder, index, first


@pytest.mark.parametrize("how", ["dotdot", "absolute", "subfolder"])
def test_index_shard_names_cannot_leave_the_folder(tmp_path, how):
    """Before the fix: an index naming `../outside/x.safetensors` (or an absolute path) loaded tensors from there."""
    from r1.weights import load_checkpoint

    folder, index, first = sharded(tmp_path)
    name = {"dotdot": f"../outside/{first}", "absolute": str(tmp_path / "outside" / first),
            "subfolder": f"sub/{first}"}[how]
    if how == "subfolder":
        (folder / "sub").mkdir()
        os.replace(tmp_path / "outside" / first, folder / "sub" / first)
    index["weight_map"] = {k: (name if v == first else v) for k, v in index["weight_map"].items()}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match="not a plain file name inside the folder") as e:
        load_checkpoint(folder)
    assert "model.safetensors.index.json" in str(e.value) and name in str(e.value)


@pytest.mark.parametrize("what", ["shard", "single_file", "config"])
def test_links_out_of_the_model_folder_are_refused(tmp_path, what):
    """Before the fix: a shard, model.safetensors or config.json linking outside the folder was followed."""
    from r1.weights import load_checkpoint

    if what == "shard":
        folder, _, first = sharded(tmp_path)
        os.symlink(tmp_path / "outside" / first, folder / first)
        name = first
    else:
        folder = tiny_hf(tmp_path / "model")
        name = "model.safetensors" if what == "single_file" else "config.json"
        (tmp_path / "elsewhere").mkdir()
        os.replace(folder / name, tmp_path / "elsewhere" / name)
        os.symlink(tmp_path / "elsewhere" / name, folder / name)
    with pytest.raises(ValueError, match="outside the folder") as e:
        load_checkpoint(folder)
    assert str(folder / name) in str(e.value)


def test_links_inside_the_folder_and_the_hf_cache_layout_still_load(tmp_path):
    """Not a failure before the fix either: a link to a file inside the folder, and a Hugging Face cache snapshot (every
    file a link to ../../blobs/<sha>) load as before, with the same tensors."""
    from r1.weights import load_checkpoint

    plain = tiny_hf(tmp_path / "plain")
    ref_config, ref = load_checkpoint(plain)
    linked = tiny_hf(tmp_path / "linked")
    (linked / "real").mkdir()
    os.replace(linked / "model.safetensors", linked / "real" / "weights.bin")
    os.symlink("real/weights.bin", linked / "model.safetensors")
    repo = tmp_path / "hub" / "models--org--tiny"
    (repo / "blobs").mkdir(parents=True)
    snapshot = repo / "snapshots" / "0123abc"
    snapshot.mkdir(parents=True)
    for name in ("config.json", "model.safetensors"):
        blob = repo / "blobs" / f"sha-{name}"
        blob.write_bytes((plain / name).read_bytes())
        os.symlink(f"../../blobs/sha-{name}", snapshot / name)
    for folder in (linked, snapshot):
        config, sd = load_checkpoint(folder)
        assert config == ref_config and sorted(sd) == sorted(ref)
        assert all(torch.equal(sd[k], ref[k]) for k in ref)


def test_an_index_shard_that_is_missing_is_named(tmp_path):
    """Already one line before the fix (a FileNotFoundError naming the shard; the test failed only on the
    wording): now the index that names it is in the message too, and every missing shard is listed."""
    from r1.weights import load_checkpoint

    folder, _, first = sharded(tmp_path)
    with pytest.raises(FileNotFoundError, match=f"names shards that are not in {folder}: \\[{first}\\]"):
        load_checkpoint(folder)


def test_train_refuses_an_escaping_index_with_one_line(tmp_path):
    """End to end: train.py on a model folder whose index leaves it is one `error:` line, exit 2 (the old code loaded
    the outside shard and trained)."""
    folder, index, first = sharded(tmp_path)
    index["weight_map"] = {k: (f"../outside/{first}" if v == first else v) for k, v in index["weight_map"].items()}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    save_byte_tokenizer(tmp_path / "tok", CHATML)
    proc = run(["train.py", "--config", SMOKE, f"model.path={folder}", f"model.tokenizer={tmp_path / 'tok'}",
                f"run.dir={tmp_path / 'run'}", "train.steps=1"])
    one_error_line(proc, folder / "model.safetensors.index.json", f"../outside/{first}")
    assert not (tmp_path / "run").exists()


# ================================================================== 2. reads with a bound

@pytest.fixture(scope="module")
def bomb(tmp_path_factory):
    """3 MB of gzip that inflates to 3 GiB of '0' (no newline): a data file that fills memory if read whole."""
    return gzip_bomb(tmp_path_factory.mktemp("bomb") / "bomb.jsonl.gz")


def test_trajectory_show_on_an_inflating_file_is_one_line(tmp_path, bomb):
    """Before the fix: MemoryError (traceback) after inflating gigabytes; now the line cap stops it at 256 MiB."""
    (tmp_path / "run" / "trajectories").mkdir(parents=True)
    path = tmp_path / "run" / "trajectories" / "iter_000001.jsonl.gz"
    os.symlink(bomb, path)
    proc = run(["-m", "r1.trajectory", "show", tmp_path / "run", "--iter", "1"], memory=3 * GiB)
    one_error_line(proc, path, "256 MiB")


def test_compare_on_an_inflating_file_is_one_line(tmp_path, bomb):
    """Before the fix: MemoryError (traceback) in r1.compare, which reads eval trajectories the same way."""
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
        os.symlink(bomb, tmp_path / d / "eval_trajectories.jsonl.gz")
    proc = run(["-m", "r1.compare", tmp_path / "a", tmp_path / "b"], memory=3 * GiB)
    one_error_line(proc, tmp_path / "a" / "eval_trajectories.jsonl.gz", "256 MiB")


def test_gsm8k_data_that_inflates_is_one_line(tmp_path):
    """Before the fix: train.py with data.path holding a 3 MB train.jsonl.gz bomb ended in MemoryError (a traceback)."""
    (tmp_path / "gsm").mkdir()
    gzip_bomb(tmp_path / "gsm" / "train.jsonl.gz")  # a copy: a link to the module's bomb would leave data.path
    save_byte_tokenizer(tmp_path / "tok", CHATML)
    proc = run(["train.py", "--config", SMOKE, "data.task=gsm8k", f"data.path={tmp_path / 'gsm'}",
                f"model.tokenizer={tmp_path / 'tok'}", f"run.dir={tmp_path / 'run'}"], memory=3 * GiB)
    one_error_line(proc, tmp_path / "gsm" / "train.jsonl.gz", "longer than 1 MiB")
    assert not (tmp_path / "run").exists()


def test_gsm8k_text_and_row_caps(tmp_path, monkeypatch):
    """Many short lines: the text cap (decompressed bytes) and the row cap each stop the read with a message
    naming the file. The caps are lowered here so the test reads kilobytes (the old code had neither cap)."""
    from r1.tasks import gsm8k

    row = json.dumps({"question": "Tom has 3 apples. How many?", "answer": "#### 3"}) + "\n"
    with gzip.open(tmp_path / "train.jsonl.gz", "wt") as f:
        f.write(row * 2000)
    monkeypatch.setattr(gsm8k, "MAX_FILE", 10_000)
    with pytest.raises(ValueError, match=r"train.jsonl.gz holds more than 9.77 KiB of text decompressed"):
        gsm8k.load_split(tmp_path, "train")
    monkeypatch.setattr(gsm8k, "MAX_FILE", 256 << 20)
    monkeypatch.setattr(gsm8k, "MAX_ROWS", 1000)
    with pytest.raises(ValueError, match=r"train.jsonl.gz has more than 1000 rows"):
        gsm8k.load_split(tmp_path, "train")
    monkeypatch.setattr(gsm8k, "MAX_ROWS", 2000)
    assert len(gsm8k.load_split(tmp_path, "train")) == 2000


def test_gsm8k_files_linked_from_outside_data_path_are_refused(tmp_path):
    """Before the fix: data.path/train.jsonl linking to any file on the machine was read."""
    from r1.tasks import gsm8k

    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "rows.jsonl").write_text(json.dumps({"question": "q?", "answer": "#### 1"}) + "\n")
    (tmp_path / "gsm").mkdir()
    os.symlink(tmp_path / "elsewhere" / "rows.jsonl", tmp_path / "gsm" / "train.jsonl")
    with pytest.raises(ValueError, match="outside the folder"):
        gsm8k.load_split(tmp_path / "gsm", "train")
    assert len(gsm8k.load_split(tmp_path / "elsewhere" / "rows.jsonl", "train")) == 1  # named directly: read


def test_trajectory_total_and_count_caps(tmp_path, monkeypatch):
    """Short valid lines that add up: the file's text cap (at least MAX_TEXT, MAX_RATIO times the compressed
    size) and the trajectory count cap stop the read, naming the file (caps lowered to read kilobytes)."""
    from r1 import trajectory
    from r1.trajectory import Step, Trajectory, read, save

    trajs = [Trajectory(f"u{i}", i, "s", [Step([1, 2], [3], [-0.5])]) for i in range(3000)]
    path = str(tmp_path / "iter_000001.jsonl.gz")
    save(trajs, path)
    monkeypatch.setattr(trajectory, "MAX_TEXT", 20_000)
    monkeypatch.setattr(trajectory, "MAX_RATIO", 0)
    with pytest.raises(ValueError, match="iter_000001.jsonl.gz holds more than 19.5 KiB of text decompressed"):
        read(path)
    monkeypatch.setattr(trajectory, "MAX_TEXT", 1 << 30)
    monkeypatch.setattr(trajectory, "MAX_TRAJECTORIES", 2000)
    with pytest.raises(ValueError, match="iter_000001.jsonl.gz holds more than 2000 trajectories"):
        read(path)
    monkeypatch.setattr(trajectory, "MAX_TRAJECTORIES", 3000)
    assert len(read(path)[1]) == 3000


def test_plot_of_a_huge_metrics_file_is_one_line(tmp_path):
    """Before the fix: r1.plot read a 2 GiB metrics.jsonl whole (MemoryError under 2 GiB of address space); the file is
    sparse, so it takes no disk."""
    (tmp_path / "run").mkdir()
    with open(tmp_path / "run" / "metrics.jsonl", "wb") as f:
        f.truncate(2 * GiB)
    proc = run(["-m", "r1.plot", tmp_path / "run", "--out", tmp_path / "p.png", "--keys", "reward_mean"],
               memory=2 * GiB)
    one_error_line(proc, tmp_path / "run" / "metrics.jsonl", "256 MiB")


def test_plot_refuses_more_lines_than_a_run_writes(tmp_path):
    """1,000,001 one-key lines (12 MB, under the size cap, but 1.5 GB as dicts): refused before parsing."""
    from r1.plot import read_metrics

    (tmp_path / "metrics.jsonl").write_text('{"iter": 1}\n' * 1_000_001)
    with pytest.raises(SystemExit, match="metrics file .*metrics.jsonl has more than 1000000 lines"):
        read_metrics(str(tmp_path / "metrics.jsonl"))


@pytest.mark.parametrize("kind", ["fifo", "dev_zero"])
def test_config_that_is_a_fifo_or_a_device_is_refused(tmp_path, kind):
    """Before the fix: `--config fifo` blocked forever in open(); `--config /dev/zero` read until memory ran out."""
    path = "/dev/zero"
    if kind == "fifo":
        path = tmp_path / "config.yaml"
        os.mkfifo(path)
    proc = run(["train.py", "--config", path], memory=3 * GiB, timeout=120)
    one_error_line(proc, path, "not a regular file")


def test_trajectory_show_with_a_fifo_config_prints_ids(tmp_path):
    """Before the fix: `show` opened the run's config.yaml to find its tokenizer; a FIFO there blocked forever. Now the
    FIFO is refused and ids are printed (the fallback for a tokenizer that cannot be loaded)."""
    from r1.trajectory import Step, Trajectory, iter_path, save

    save([Trajectory("u0", 0, "s", [Step([1, 2], [3, 4], [-0.5, -0.25])])], iter_path(str(tmp_path), 1))
    os.mkfifo(tmp_path / "config.yaml")
    proc = run(["-m", "r1.trajectory", "show", tmp_path, "--iter", "1"], timeout=120)
    assert proc.returncode == 0, proc.stderr[-600:]
    assert "printing token ids" in proc.stdout and "FIFO" in proc.stdout and "3 4" in proc.stdout


@pytest.mark.parametrize("name", ["chat_template.jinja", "model.safetensors"])
def test_a_fifo_inside_a_model_folder_is_refused(tmp_path, name):
    """Before the fix: transformers skips a file that is not regular as if it were absent, so a FIFO named
    chat_template.jinja gave a tokenizer without its chat template, silently; a FIFO named model.safetensors
    was `no model.safetensors ... in <dir>`, which hides the cause. In a subprocess, with a timeout, in case
    an open blocks."""
    folder = tiny_hf(tmp_path / "model", vocab=259)
    save_byte_tokenizer(folder, CHATML)
    os.remove(folder / name)
    os.mkfifo(folder / name)
    load = "load_checkpoint" if name.endswith(".safetensors") else "load_tokenizer"
    code = (f"import sys; from r1.tokenizer import load_tokenizer; from r1.weights import load_checkpoint\n"
            f"try:\n    {load}(sys.argv[1])\nexcept ValueError as e:\n    sys.exit(f'error: {{e}}')")
    proc = run(["-c", code, folder], timeout=120)
    one_error_line(proc, folder / name, "is a FIFO (named pipe), not a regular file", status=1)


def test_bounded_reader_refuses_devices_and_fifos(tmp_path):
    """The helper every read goes through: no open() that blocks, no read without an end."""
    from r1.bounded import read_text, text_lines

    os.mkfifo(tmp_path / "pipe")
    for path, kind in ((tmp_path / "pipe", "FIFO"), ("/dev/zero", "character device"), (tmp_path, "folder")):
        with pytest.raises(ValueError, match=f"is a {kind}"):
            read_text(path, 1 << 20, "file")
        with pytest.raises(ValueError, match=f"is a {kind}"):
            list(text_lines(path, 100, 1000, "file"))
    (tmp_path / "big").write_bytes(b"x" * 1001)
    with pytest.raises(ValueError, match="larger than 1000 bytes"):
        read_text(tmp_path / "big", 1000, "file")
    (tmp_path / "lines").write_text("a" * 100 + "\n" + "b" * 101 + "\n")
    assert next(text_lines(tmp_path / "lines", 100, 1000, "file")) == (1, "a" * 100 + "\n")
    with pytest.raises(ValueError, match=r"lines:2: line longer than 100 bytes"):
        list(text_lines(tmp_path / "lines", 100, 1000, "file"))


# ------------------------------------------------------------------ GGUF headers

def tiny_gguf(path, heads=None, tokens=None, token_types=None):
    """A tiny qwen2 GGUF as llama.cpp writes it (tests/test_weights.py), optionally with 0 heads or tokenizer
    arrays."""
    import gguf
    import numpy as np
    from test_weights import GGUF_NAMES, hf_state_dict, tiny_model

    model = tiny_model("qwen2", True)
    c = model.config
    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads if heads is None else heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    if tokens is not None:
        w.add_tokenizer_model("gpt2")
        w.add_token_list(tokens)
        w.add_token_types(token_types if token_types is not None else [1] * len(tokens))
    for name, t in hf_state_dict(model).items():
        if name == "model.embed_tokens.weight":
            gname = "token_embd.weight"
        elif name == "model.norm.weight":
            gname = "output_norm.weight"
        else:
            _, _, layer, *module, leaf = name.split(".")
            gname = f"blk.{layer}.{GGUF_NAMES['.'.join(module)]}.{leaf}"
        w.add_tensor(gname, np.ascontiguousarray(t.numpy()))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def gguf_bytes(tmp_path_factory):
    return tiny_gguf(tmp_path_factory.mktemp("gguf") / "m.gguf").read_bytes()


@pytest.mark.parametrize("case", ["tensor_count_2e62", "kv_count_2e62", "kv_count_1000", "cut_at_300",
                                  "cut_at_half", "not_gguf"])
def test_damaged_gguf_headers_are_one_error_naming_the_file(tmp_path, gguf_bytes, case):
    """Before the fix: IndexError ('index 0 is out of bounds for axis 0 with size 0') from numpy for the counts and the
    cut header; a file cut in its tensor data was a numpy reshape error (a ValueError, but not naming the file)."""
    from r1.weights import load_checkpoint

    b = gguf_bytes
    blob = {"tensor_count_2e62": b[:8] + struct.pack("<Q", 2**62) + b[16:],
            "kv_count_2e62": b[:16] + struct.pack("<Q", 2**62) + b[24:],
            "kv_count_1000": b[:16] + struct.pack("<Q", 1000) + b[24:],
            "cut_at_300": b[:300], "cut_at_half": b[:len(b) // 2], "not_gguf": b"GGML" + b[4:]}[case]
    path = tmp_path / "m.gguf"
    path.write_bytes(blob)
    with pytest.raises(ValueError, match=f"GGUF file {path} is damaged") as e:
        load_checkpoint(path)
    print(e.value)


def test_gguf_with_zero_heads_is_one_line(tmp_path):
    """Before the fix: ZeroDivisionError computing head_dim."""
    from r1.weights import load_checkpoint

    path = tiny_gguf(tmp_path / "m.gguf", heads=0)
    with pytest.raises(ValueError, match=r"m.gguf: qwen2.attention.head_count 0 does not divide"):
        load_checkpoint(path)


def test_gguf_tokenizer_arrays_are_checked(tmp_path):
    """A token_type array shorter than the tokens, and more tokens than the embedding has rows: refused when
    the file is read (the old code loaded both; the second fails in the first rollout)."""
    from r1.weights import load_checkpoint

    tokens = [f"t{i}" for i in range(96)]
    short = tiny_gguf(tmp_path / "short.gguf", tokens=tokens, token_types=[1] * 95)
    with pytest.raises(ValueError, match="tokenizer.ggml.token_type is not an array of 96 int32 values"):
        load_checkpoint(short)
    more = tiny_gguf(tmp_path / "more.gguf", tokens=tokens + ["extra"])
    with pytest.raises(ValueError, match="its tokenizer has 97 tokens but token_embd.weight has 96 rows"):
        load_checkpoint(more)
    config, _ = load_checkpoint(tiny_gguf(tmp_path / "ok.gguf", tokens=tokens))
    assert config["vocab_size"] == 96


def test_a_truncated_gguf_tokenizer_is_one_error(tmp_path):
    """Before the fix: the real SmolLM2 GGUF cut inside its tokenizer arrays gave `struct.error: unpack_from requires a
    buffer of at least 1048590 bytes` from transformers' reader (a traceback from train.py)."""
    from r1.tokenizer import load_tokenizer
    from r1.weights import resolve

    with open(resolve("smollm2-135m-instruct"), "rb") as f:
        (tmp_path / "cut.gguf").write_bytes(f.read(1 << 20))
    with pytest.raises(ValueError, match=r"cut.gguf is damaged: tokenizer.ggml.\w+: an array of \d+ \w+ runs past"):
        load_tokenizer(tmp_path / "cut.gguf")


# ================================================================== 3. failures at start, not later

def test_tokenizer_with_more_ids_than_the_embedding_is_refused_at_load(tmp_path):
    """Before the fix: a model folder whose tokenizer has 259 ids and whose embedding 96 rows loaded; the first prompt
    holding an id >= 96 ended the run with IndexError in the first rollout."""
    from r1.config import load_config
    from r1.run import build_model, run_tokenizer

    folder = tiny_hf(tmp_path / "model")
    save_byte_tokenizer(folder, CHATML)
    cfg = load_config(SMOKE, [f"model.path={folder}", "model.tokenizer=null"])
    with pytest.raises(ValueError, match=r"model folder .*model holds a tokenizer with 259 token ids but its "
                                         r"embedding has 96 rows"):
        build_model(str(folder), cfg, run_tokenizer(cfg), torch.device("cpu"))
    folder2 = tiny_hf(tmp_path / "model2", vocab=259)
    save_byte_tokenizer(folder2, CHATML)
    cfg = load_config(SMOKE, [f"model.path={folder2}", "model.tokenizer=null"])
    assert build_model(str(folder2), cfg, run_tokenizer(cfg), torch.device("cpu")).cfg.vocab_size == 259


def test_check_vocab_for_a_tokenizer_from_elsewhere(tmp_path):
    """The check a trainer makes when model.tokenizer names another folder than model.path."""
    from r1.tokenizer import check_vocab, load_tokenizer

    tok = load_tokenizer(save_byte_tokenizer(tmp_path / "tok", CHATML))
    check_vocab(tok, 259, "m")
    check_vocab(tok, 49152, "m")
    with pytest.raises(ValueError, match=r"tokenizer .*tok has 259 token ids but the model m has 258 embedding rows"):
        check_vocab(tok, 258, "m")


def test_train_with_a_tokenizer_past_the_embedding_is_one_line(tmp_path):
    """End to end (before the fix: `IndexError: index out of range in self` from the embedding, in the first rollout)."""
    folder = tiny_hf(tmp_path / "model")
    save_byte_tokenizer(folder, CHATML)
    proc = run(["train.py", "--config", SMOKE, f"model.path={folder}", "model.tokenizer=null",
                f"run.dir={tmp_path / 'run'}", "train.steps=1"])
    one_error_line(proc, folder, "259 token ids", "embedding has 96 rows")
    assert not (tmp_path / "run").exists()


def test_train_with_model_tokenizer_from_elsewhere_past_the_embedding_is_one_line(tmp_path):
    """model.tokenizer names a tokenizer with more ids than model.path's embedding: refused when the model is built."""
    folder = tiny_hf(tmp_path / "model")
    tokdir = tmp_path / "tok"
    save_byte_tokenizer(tokdir, CHATML)
    proc = run(["train.py", "--config", SMOKE, f"model.path={folder}", f"model.tokenizer={tokdir}",
                f"run.dir={tmp_path / 'run'}", "train.steps=1"])
    one_error_line(proc, folder, "259 token ids", "96 embedding rows")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("key,value,message", [
    ("num_attention_heads", 0, "'num_attention_heads' must be a positive integer, got 0"),
    ("num_attention_heads", "4", "'num_attention_heads' must be a positive integer, got '4'"),
    ("hidden_size", -32, "'hidden_size' must be a positive integer, got -32"),
    ("num_key_value_heads", 3, "num_attention_heads 4 is not a multiple of num_key_value_heads 3"),
    ("vocab_size", None, "'vocab_size' must be a positive integer, got None"),
    ("rms_norm_eps", "small", "'rms_norm_eps' must be a positive number"),
])
def test_hf_config_sizes_are_checked(tmp_path, key, value, message):
    """Before the fix: 0 heads was ZeroDivisionError, '4' a TypeError, the rest errors deep in the model build."""
    from r1.weights import load_checkpoint

    folder = tiny_hf(tmp_path / "m", **{key: value})
    with pytest.raises(ValueError, match=message) as e:
        load_checkpoint(folder)
    assert str(folder / "config.json") in str(e.value)


@pytest.mark.parametrize("case", ["header_2e63", "header_past_end", "header_not_json", "cut_in_data",
                                  "four_bytes", "shape_offsets_disagree", "not_an_object", "json_config"])
def test_damaged_safetensors_headers_are_one_error_naming_the_file(tmp_path, case):
    """Before the fix: SafetensorError (HeaderTooLarge, InvalidHeaderDeserialization, MetadataIncompleteBuffer, ...),
    which is not a user error, so train.py printed its traceback; a damaged config.json was a JSONDecodeError
    not naming the file."""
    from r1.weights import load_checkpoint

    folder = tiny_hf(tmp_path / "m")
    path = folder / "model.safetensors"
    b = path.read_bytes()
    n = int.from_bytes(b[:8], "little")
    header = json.loads(b[8:8 + n])

    def with_header(h):
        raw = json.dumps(h, separators=(",", ":")).encode()
        assert len(raw) <= n
        return b[:8] + raw + b" " * (n - len(raw)) + b[8 + n:]

    name = next(k for k in header if k != "__metadata__")
    changed = dict(header, **{name: dict(header[name], shape=[s + 1 for s in header[name]["shape"]])})
    blob = {"header_2e63": (2**63).to_bytes(8, "little") + b[8:],
            "header_past_end": (len(b)).to_bytes(8, "little") + b[8:],
            "header_not_json": b[:8] + b"x" + b[9:],
            "cut_in_data": b[:8 + n + 100],
            "four_bytes": b[:4],
            "shape_offsets_disagree": with_header(changed),
            "not_an_object": with_header([1, 2]),
            "json_config": b}[case]
    path.write_bytes(blob)
    if case == "json_config":
        (folder / "config.json").write_text('{"model_type": "llama",')
        path = folder / "config.json"
    with pytest.raises(ValueError) as e:
        load_checkpoint(folder)
    assert str(path) in str(e.value), e.value


# ================================================================== 4. private-use text reaches the model as written

PUA_TEXTS = ["\ue0000\ue001", "x \ue0001\ue001 y", "\ue000e\ue001", "a\ue000b", "\ue000\ue000\ue0012\ue001",
             "\uf8ff\U000f0000\U0010fffd", "cost \ue0007\ue001 <|im_end|> and \ue000"]


@pytest.fixture(scope="module")
def smol(tok_dir):
    from r1.tokenizer import load_tokenizer

    return load_tokenizer(tok_dir)


@pytest.mark.parametrize("text", PUA_TEXTS)
def test_private_use_characters_in_a_question_reach_the_model_as_written(smol, text):
    """Before the fix: `\\ue0000\\ue001` in a question was read as the mark of special token 0 and became
    `<jupyter_output>`; now the text is kept, and where it holds no special-token string, the ids are the
    tokenizer's own for the whole rendered prompt."""
    from r1.tasks import gsm8k

    messages = gsm8k.make_prompt({"question": text}, tools=False)
    ids = smol.render(messages)
    assert text in smol.decode(ids)
    if "<|" not in text:  # plain text: exactly what the tokenizer makes of the whole rendered prompt
        assert ids == smol.hf.encode(smol.hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True),
                                     add_special_tokens=False)


@pytest.mark.parametrize("text", PUA_TEXTS)
def test_private_use_characters_in_a_tool_result_reach_the_model_as_written(smol, text):
    """Before the fix: the same in a tool's output (render_next), and render + render_next == render as ever."""
    conv = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "call"},
            {"role": "tool", "content": text}]
    nxt = smol.render_next(conv[2:])
    assert f"<tool_response>\n{text}\n</tool_response>" in smol.decode(nxt)
    assert smol.render(conv[:2], add_generation_prompt=False) + nxt == smol.render(conv)


def test_ids_without_private_use_characters_are_unchanged(smol):
    """The encoding of texts that hold no U+E000 is the one the old code made, token for token (random texts with
    special-token strings, tool blocks and non-ASCII): trajectories for a seed do not change."""
    from r1.tokenizer import _LIT_RE, LIT_CLOSE, LIT_OPEN

    def old_encode(text):  # ChatTokenizer.encode before the fix
        if LIT_OPEN not in text:
            return smol._encode(text)
        out = []
        for i, piece in enumerate(_LIT_RE.split(text)):
            if i % 2 and int(piece) < len(smol.literals):
                out += smol.hf.encode(smol.literals[int(piece)], add_special_tokens=False, split_special_tokens=True)
            elif i % 2:
                out += smol._encode(LIT_OPEN + piece + LIT_CLOSE)
            elif piece:
                out += smol._encode(piece)
        return out

    rng = random.Random(32)
    alphabet = ["a", " ", "\n", "7", "é", "<|im_end|>", "<|im_start|>", "<tool_call>", "{", "数", "<|endoftext|>"]
    for _ in range(200):
        content = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
        msgs = [{"role": "user", "content": content}, {"role": "assistant", "content": content[::-1]}]
        text = smol.render_text(msgs, add_generation_prompt=False)
        assert smol.encode(text) == old_encode(text)
