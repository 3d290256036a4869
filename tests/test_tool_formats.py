"""Tool-call formats (r1/tool_formats.py): parsing, the choice from the chat template, and token-exact
episodes through ToolEnv for each format.

The episode test runs ToolEnv the way a rollout does: the model's reply is what its template writes for
a tool call (encoded once, as if sampled, ending with the stop token), the environment parses it, runs the
calculator, and renders the results as the next turn. The ids the episode holds must equal the template's
rendering of the whole conversation from scratch: no sampled token is re-tokenized differently. The
templates are small ones written here in each family's format (byte-level tokenizer, no download).
"""
import dataclasses
import json
import random

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from r1 import tool_formats
from r1.envs.base import Action
from r1.envs.tool_env import ToolEnv
from r1.tokenizer import ChatTokenizer
from r1.tool_formats import choose, parse_hermes, parse_llama3, parse_mistral

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

# Llama 3.1's layout: tools in the first user turn, a call as the whole assistant turn in JSON with
# "parameters", results under the ipython role
LLAMA3 = (
    "{% set ns = namespace(first=true) %}{{ '<|begin_of_text|>' }}"
    "{% for m in messages %}"
    "{% if m['role'] == 'user' and tools and ns.first %}{% set ns.first = false %}"
    "{{ '<|start_header_id|>user<|end_header_id|>\n\nGiven the following functions, respond with a JSON for a "
    "function call.\n\n' }}{% for t in tools %}{{ t | tojson }}{{ '\n\n' }}{% endfor %}"
    "{{ m['content'] | trim }}{{ '<|eot_id|>' }}"
    "{% elif m.tool_calls %}{% set c = m.tool_calls[0].function %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{{ '{\"name\": \"' + c.name + '\", \"parameters\": ' + c.arguments | tojson + '}' }}{{ '<|eot_id|>' }}"
    "{% elif m['role'] == 'tool' %}{{ '<|start_header_id|>ipython<|end_header_id|>\n\n' + m['content'] + '<|eot_id|>' }}"
    "{% else %}{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\n\n' + m['content'] | trim + '<|eot_id|>' }}"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")

# Mistral's v3 layout: tools before the last user turn, calls as a JSON list with 9-character ids,
# results with the id of the call they answer (the template refuses one without)
MISTRAL = (
    "{% set users = messages | selectattr('role', 'equalto', 'user') | list %}{{ '<s>' }}"
    "{% for m in messages %}"
    "{% if m['role'] == 'user' %}"
    "{% if tools and m == users[-1] %}{{ '[AVAILABLE_TOOLS] ' + tools | tojson + '[/AVAILABLE_TOOLS]' }}{% endif %}"
    "{{ '[INST] ' + m['content'] + '[/INST]' }}"
    "{% elif m.tool_calls %}{{ '[TOOL_CALLS] [' }}{% for c in m.tool_calls %}"
    "{% if c.id is not defined or c.id | length != 9 %}{{ raise_exception('Tool call IDs should be 9 characters') }}{% endif %}"
    "{{ (c.function | tojson)[:-1] + ', \"id\": \"' + c.id + '\"}' }}{% if not loop.last %}{{ ', ' }}{% endif %}"
    "{% endfor %}{{ ']</s>' }}"
    "{% elif m['role'] == 'tool' %}"
    "{% if m.tool_call_id is not defined or m.tool_call_id | length != 9 %}{{ raise_exception('Tool call IDs should be 9 characters') }}{% endif %}"
    "{{ '[TOOL_RESULTS] {\"content\": ' + m['content'] | tojson + ', \"call_id\": \"' + m.tool_call_id + '\"}[/TOOL_RESULTS]' }}"
    "{% elif m['role'] == 'assistant' %}{{ ' ' + m['content'] | trim + '</s>' }}"
    "{% endif %}{% endfor %}")

# Qwen2.5's layout: tools in the system turn, calls in <tool_call> tags, results in a user turn
QWEN = (
    "{% if tools %}<|im_start|>system\n{{ messages[0]['content'] if messages[0]['role'] == 'system' else '' }}"
    "<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools><|im_end|>\n{% endif %}"
    "{% for m in messages %}{% if m['role'] == 'system' and tools %}"
    "{% elif m['role'] == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m['content'] }}\n</tool_response><|im_end|>\n"
    "{% else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}{% for c in m.tool_calls or [] %}"
    "<tool_call>\n{{ {'name': c.function.name, 'arguments': c.function.arguments} | tojson }}\n</tool_call>"
    "{% endfor %}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

SPECIALS = {
    "chatml": ("<|im_end|>", ["<|im_start|>"]),
    "llama3": ("<|eot_id|>", ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|python_tag|>",
                              "<|eom_id|>"]),
    "mistral": ("</s>", ["<s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
                         "[TOOL_RESULTS]", "[/TOOL_RESULTS]"]),
}


def byte_tokenizer(template: str, specials: str) -> ChatTokenizer:
    """A byte-level tokenizer (no merges) with the family's special tokens and the given chat template."""
    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    hf = PreTrainedTokenizerFast(tokenizer_object=core)
    eos, extra = SPECIALS[specials]
    hf.add_special_tokens({"eos_token": eos, "pad_token": eos, "additional_special_tokens": extra})
    hf.chat_template = template
    return ChatTokenizer(hf, f"byte-{specials}")


CASES = {  # format: (template, special tokens)
    "hermes": (CHATML, "chatml"),  # SmolLM2's plain ChatML: r1 renders the Hermes convention itself
    "hermes-native": (QWEN, "chatml"),
    "llama3": (LLAMA3, "llama3"),
    "mistral": (MISTRAL, "mistral"),
}


def make_prompt(sample, tools=True):
    return [{"role": "system", "content": "Use the calculator."}, {"role": "user", "content": sample["question"]}]


def call(expression, k):
    return {"type": "function", "id": f"call{k:05d}", "function": {"name": "calculator",
                                                                   "arguments": {"expression": expression}}}


@pytest.mark.parametrize("case", CASES)
def test_episode_is_token_exact(case):
    """Two tool calls, a malformed one and a final answer: the held ids are the template's ids of the whole
    conversation, and each reply's calls come back from the parser as written."""
    template, specials = CASES[case]
    tok = byte_tokenizer(template, specials)
    fmt = choose(tok)
    assert fmt.name == case.removesuffix("-native")
    env = ToolEnv(tok, make_prompt, lambda text, gold: float(gold in text), tools=("calculator",), max_steps=6,
                  max_context=8192, max_new_tokens=512)
    sample = {"question": "What is (48/2 + 7) * 3?", "answer": "93"}
    messages = make_prompt(sample)
    ids, _ = env.first_prompt(env.reset(sample))
    assert ids == tok.render(messages, tools=env.tools)
    malformed = {"hermes": '<tool_call>{"name": "calculator", "arguments": {oops}</tool_call>',
                 "llama3": '{"name": "calculator", "parameters": {"expression": }', "mistral": "[TOOL_CALLS] [{oops"}
    replies = [{"role": "assistant", "content": "", "tool_calls": [call("48/2", 1)]},
               {"role": "assistant", "content": "", "tool_calls": [call("24+7", 2)]},
               {"role": "assistant", "content": malformed[fmt.name]},
               {"role": "assistant", "content": "The answer is 93."}]
    stop = tok.close_turn_ids([])[:1]  # the stop token that ends a turn, which the model samples
    for k, reply in enumerate(replies):
        before = tok.render_text(messages, tools=env.tools, add_generation_prompt=True)
        after = tok.render_text(messages + [reply], tools=env.tools, add_generation_prompt=False)
        assert after.startswith(before)
        text = after[len(before):].removesuffix(tok._close_text(env.tools))
        sampled = tok.encode(text) + stop
        obs, reward, done, info = env.step(Action(sampled, tok.decode(sampled)))
        messages.append(reply)
        if k < 2:
            calls, errors = fmt.parse(tok.decode(sampled), 8)
            written = reply["tool_calls"][0]["function"]
            assert calls == [(written["name"], written["arguments"])] and errors == []
            assert info["tool_calls"] == 1 and info["errors"] == [] and not done
            assert obs.messages[0]["content"] == str([24, 31][k])
        elif k == 2:
            assert info["tool_calls"] == 0 and info["errors"] == ["bad_json"] and not done
            assert obs.messages[0]["content"].startswith("error (bad_json)")
        else:
            assert done and info["final"] and reward == 1.0
            break
        messages += obs.messages
        ids, reason = env.next_prompt(ids, Action(sampled, tok.decode(sampled)), obs)
        assert reason is None
        assert ids == tok.render(messages, tools=env.tools)  # the sampled ids, untouched, are the template's


@pytest.mark.parametrize("text,calls,kinds", [
    ('{"name": "calc", "parameters": {"x": 1}}', [("calc", {"x": 1})], []),
    ('<|python_tag|>{"name": "calc", "parameters": {"x": 1}}<|eom_id|>', [("calc", {"x": 1})], []),
    ('{"name": "a", "parameters": {}}; {"name": "b", "arguments": "{\\"y\\": 2}"}', [("a", {}), ("b", {"y": 2})], []),
    ("The answer is 4.", [], []),
    ('{"name": "calc", "parameters": {"x": }', [], ["bad_json"]),
    ('{"parameters": {}}', [], ["bad_call"]),
    ('{"name": "calc", "parameters": "{bad"}', [], ["bad_json"]),
    ("<|python_tag|>", [], ["bad_call"]),
])
def test_llama3_parser(text, calls, kinds):
    got, errors = parse_llama3(text)
    assert got == calls and [k for k, _ in errors] == kinds


@pytest.mark.parametrize("text,calls,ids,kinds", [
    ('[TOOL_CALLS] [{"name": "calc", "arguments": {"x": 1}, "id": "abc123XYZ"}]</s>', [("calc", {"x": 1})],
     ["abc123XYZ"], []),
    ('Let me compute. [TOOL_CALLS] [{"name": "a", "arguments": {}}, {"name": "b", "arguments": {"y": 2}}]',
     [("a", {}), ("b", {"y": 2})], [None, None], []),
    ('[TOOL_CALLS]calc[ARGS]{"x": 1}[TOOL_CALLS]calc[CALL_ID]k2j3h4g5f[ARGS]{"x": 2}</s>',
     [("calc", {"x": 1}), ("calc", {"x": 2})], [None, "k2j3h4g5f"], []),
    ("No tools needed: 4.", [], [], []),
    ("[TOOL_CALLS] [{oops", [], [], ["bad_json"]),
    ("[TOOL_CALLS] calc", [], [], ["bad_call"]),
    ('[TOOL_CALLS] [{"arguments": {}}]', [], [], ["bad_call"]),
])
def test_mistral_parser(text, calls, ids, kinds):
    got, errors = parse_mistral(text)
    assert got == calls and [c.id for c in got] == ids and [k for k, _ in errors] == kinds


def test_mistral_results_carry_a_valid_call_id():
    fmt = tool_formats.get("mistral")
    good, bad = parse_mistral('[TOOL_CALLS] [{"name": "c", "arguments": {}, "id": "abc123XYZ"}, '
                              '{"name": "c", "arguments": {}, "id": "no"}]')[0]
    assert fmt.result(good, "c", "1")["tool_call_id"] == "abc123XYZ"
    assert fmt.result(bad, "c", "1")["tool_call_id"] == fmt.result(None, "error", "x")["tool_call_id"] == "r1error00"


@pytest.mark.parametrize("name", ["hermes", "llama3", "mistral"])
def test_parsers_never_raise_and_bound_the_calls(name):
    """Random junk around each format's markers: errors, never an exception; at most max_calls calls."""
    parse = tool_formats.get(name).parse
    pieces = ["<tool_call>", "</tool_call>", "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]", "<|python_tag|>", "{", "}", "[",
              "]", '"name"', '"arguments"', '"parameters"', ":", ",", ";", '"calc"', "1e999", "\\", '"', " ",
              '{"name": "c", "arguments": {}}', '{"name": "c", "parameters": {}}', "[" * 50, "{" * 3000]
    rng = random.Random(0)
    for _ in range(600):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 40)))
        calls, errors = parse(text, 3)
        assert len(calls) <= 3 and all(isinstance(k, str) and isinstance(m, str) for k, m in errors)


def test_choice_and_override():
    assert choose(byte_tokenizer(LLAMA3, "llama3"), "hermes").name == "hermes"
    with pytest.raises(ValueError, match="env.tool_format: unknown tool-call format 'json'; known: mistral, llama3"):
        choose(byte_tokenizer(CHATML, "chatml"), "json")
    odd = CHATML.replace("{{ m['content'] }}", "{{ m['content'] }}{% for c in m.tool_calls or [] %}"
                         "{{ '@@' + c.function.name + (c.function.arguments | tojson) }}{% endfor %}")
    odd = "{% for t in tools or [] %}{{ t.function.name }}{% endfor %}" + odd
    with pytest.raises(ValueError, match="renders tool calls in a format r1 has no parser for; set env.tool_format"):
        choose(byte_tokenizer(odd, "chatml"))
    hermes = tool_formats.get("hermes")
    with pytest.raises(ValueError, match="tool-call format 'hermes' is already registered"):
        tool_formats.register(dataclasses.replace(hermes, markers=()))
    assert tool_formats.get("hermes") is hermes
    assert json.loads(json.dumps([c for c in parse_hermes('<tool_call>{"name": "c"}</tool_call>')[0]])) == [["c", {}]]


@pytest.mark.parametrize("name,text", [("hermes", '<tool_call>{"name": "c", "arguments": null}</tool_call>'),
                                       ("llama3", '{"name": "c", "parameters": null}'),
                                       ("mistral", '[TOOL_CALLS] [{"name": "c", "arguments": null}]'),
                                       ("mistral", "[TOOL_CALLS]c[ARGS]null")])
def test_null_arguments_reach_the_env_as_a_call(name, text):
    """JSON's null is a value, not a parse failure: the call reaches the env, which reports bad arguments."""
    calls, errors = tool_formats.get(name).parse(text, 8)
    assert calls == [("c", None)] and errors == []


# Qwen3's switch: with enable_thinking false the generation prompt holds an empty reasoning block
QWEN3_THINK = CHATML.replace("{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
                             "{% if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking is defined "
                             "and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}")


def test_thinking_switch_reaches_every_render(tmp_path):
    from r1.tokenizer import load_tokenizer

    hf = byte_tokenizer(QWEN3_THINK, "chatml").hf
    hf.save_pretrained(str(tmp_path / "qwen3ish"))
    conv = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}, {"role": "user", "content": "3+3?"}]
    default, off = load_tokenizer(tmp_path / "qwen3ish"), load_tokenizer(tmp_path / "qwen3ish", thinking=False)
    assert not default.render_text(conv).endswith("</think>\n\n")
    assert off.render_text(conv).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert load_tokenizer(tmp_path / "qwen3ish", thinking=True).render_text(conv) == default.render_text(conv)
    held = off.render(conv[:2], add_generation_prompt=False)
    assert held + off.render_next(conv[2:]) == off.render(conv)  # the next turn's prompt has the block too
    byte_tokenizer(CHATML, "chatml").hf.save_pretrained(str(tmp_path / "plain"))
    with pytest.raises(ValueError, match="model.thinking=false: the chat template of .*plain has no enable_thinking"):
        load_tokenizer(tmp_path / "plain", thinking=False)
