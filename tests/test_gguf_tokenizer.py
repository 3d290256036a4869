"""The GGUF tokenizer cache (r1/gguf_tokenizer.py): an entry gives the ids transformers' conversion gives and
is read instead of converting; an entry changed after it was written is rebuilt, not trusted; a cache that
cannot be written, or is turned off, costs only the time; the key follows the file's metadata, not its
weights. One real conversion of SmolLM2's tokenizer for the module (about 20 s of a laptop core); the other
loads count conversions with a stand-in that hands out copies of that one."""
import copy
import json
import os

import pytest

from r1 import gguf_tokenizer as gt
from r1.tokenizer import ChatTokenizer, _load, load_tokenizer
from r1.weights import gguf_header, resolve


@pytest.fixture(scope="module")
def smol():
    """SmolLM2's GGUF and transformers' conversion of its tokenizer, no cache involved: the reference."""
    p = resolve("smollm2-135m-instruct").resolve()
    return p, gt._convert(p, gguf_header(p)["kv"])


@pytest.fixture
def cache(tmp_path, monkeypatch, smol):
    """R1_CACHE under tmp_path, load_tokenizer's memo cleared, conversions counted."""
    monkeypatch.setenv("R1_CACHE", str(tmp_path / "cache"))
    calls = []

    def convert(p, kv):
        calls.append(p)
        return copy.deepcopy(smol[1])

    monkeypatch.setattr(gt, "_convert", convert)
    _load.cache_clear()
    yield tmp_path / "cache", calls
    _load.cache_clear()


def entries(root):
    return sorted((root / "gguf-tokenizers").iterdir()) if (root / "gguf-tokenizers").is_dir() else []


TOOLS = [{"type": "function", "function": {"name": "calculate", "description": "Evaluate arithmetic.",
                                           "parameters": {"type": "object", "properties": {"x": {"type": "string"}}}}}]
CHAT = [{"role": "system", "content": "Solve it. Private-use \ue000 and <|im_end|> stay text."},
        {"role": "user", "content": "What is 12*7? caf\u00e9 \u65e5\u672c"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "calculate", "arguments": {"x": "12*7"}}}]},
        {"role": "tool", "content": "84"}]


def same_chat_tokenizer(a: ChatTokenizer, b: ChatTokenizer):
    assert gt.same_tokenizer(a.hf, b.hf)
    assert a.fingerprint() == b.fingerprint()
    assert (a.eos_id, a.pad_id, a.stop_ids) == (b.eos_id, b.pad_id, b.stop_ids)
    assert a.render(CHAT, TOOLS) == b.render(CHAT, TOOLS)
    assert a.render_next(CHAT[3:], TOOLS) == b.render_next(CHAT[3:], TOOLS)
    text = gt.GGUF_PROBE * 3 + "\ue0000\ue001 <|im_start|>user"
    assert a.encode(text) == b.encode(text) and a.decode(a.encode(text)) == b.decode(b.encode(text))


def test_an_entry_gives_the_conversions_ids_and_is_read_instead_of_converting(cache, smol):
    root, calls = cache
    first = load_tokenizer(smol[0])
    assert len(calls) == 1 and len(entries(root)) == 1
    entry = entries(root)[0]
    assert json.loads((entry / gt.MANIFEST).read_text()) == gt._manifest(str(entry))
    assert not [n for n in os.listdir(root / "gguf-tokenizers") if n.startswith(".tmp-")]
    _load.cache_clear()
    second = load_tokenizer(smol[0])
    assert len(calls) == 1  # read from the entry
    reference = ChatTokenizer(copy.deepcopy(smol[1]), str(smol[0]))
    same_chat_tokenizer(reference, first)
    same_chat_tokenizer(reference, second)


def test_an_entry_changed_after_it_was_written_is_rebuilt_not_trusted(cache, smol):
    """Two tokens' ids swapped in the entry's tokenizer.json would change every id of them; the manifest catches
    it, the tokenizer is converted again, and the entry is written anew. A missing manifest, likewise."""
    root, calls = cache
    load_tokenizer(smol[0])
    entry = entries(root)[0]
    spec = json.loads((entry / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    vocab["Hello"], vocab["world"] = vocab["world"], vocab["Hello"]
    (entry / "tokenizer.json").write_text(json.dumps(spec))
    _load.cache_clear()
    again = load_tokenizer(smol[0])
    assert len(calls) == 2
    assert again.encode("Hello world") == smol[1]("Hello world", add_special_tokens=False)["input_ids"]
    assert json.loads((entry / gt.MANIFEST).read_text()) == gt._manifest(str(entry))
    (entry / gt.MANIFEST).unlink()
    _load.cache_clear()
    load_tokenizer(smol[0])
    assert len(calls) == 3 and (entry / gt.MANIFEST).is_file()


@pytest.mark.parametrize("setting", ["a file", "off"])
def test_a_cache_that_cannot_be_written_or_is_off_costs_only_the_time(cache, smol, monkeypatch, tmp_path, setting):
    root, calls = cache
    if setting == "a file":
        blocker = tmp_path / "not-a-folder"
        blocker.write_text("x")
        monkeypatch.setenv("R1_CACHE", str(blocker))
    else:
        monkeypatch.setenv("R1_CACHE", "off")
    for n in (1, 2):
        _load.cache_clear()
        tok = load_tokenizer(smol[0])
        assert len(calls) == n  # converted each time, nothing cached
    assert gt.same_tokenizer(tok.hf, smol[1])
    assert not root.exists()
    if setting == "a file":
        assert blocker.read_text() == "x"


def test_another_process_that_wrote_the_entry_first_keeps_it(cache, smol, tmp_path):
    entry = tmp_path / "cache" / "gguf-tokenizers" / "k"
    entry.mkdir(parents=True)
    (entry / "theirs").write_text("first")
    gt._save_entry(copy.deepcopy(smol[1]), gguf_header(smol[0])["kv"], str(entry))
    assert os.listdir(entry) == ["theirs"]
    assert os.listdir(entry.parent) == ["k"]  # no temporary folder left behind


def test_the_key_follows_the_metadata_not_the_weights(tmp_path):
    from test_hostile_files import tiny_gguf

    def key(path):
        return gt.gguf_cache_key(path, gguf_header(path)["metadata_end"])

    a = tiny_gguf(tmp_path / "a.gguf", tokens=["a", "b", "c"])
    b = tiny_gguf(tmp_path / "b.gguf", tokens=["a", "b", "d"])
    assert key(a) != key(b)
    data = bytearray(a.read_bytes())
    data[-1] ^= 0xFF  # the last weight's last byte: not the tokenizer
    c = tmp_path / "c.gguf"
    c.write_bytes(bytes(data))
    assert key(c) == key(a)
    assert gguf_header(a)["metadata_end"] < len(data) - 64
