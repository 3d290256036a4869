"""bench/peer_trl.py gives TRL our task token for token (no TRL needed to check it).

The peer comparison is only fair if TRL's trainer sees the prompts, tool calls and tool
results our env renders. TRL renders them with the tokenizer's chat template, so the
template the benchmark installs must give the ids r1.tokenizer gives, on real expert
chats (several calls a turn, results in one user turn) and at every generation prompt.
"""
from pathlib import Path

import pytest

from bench import peer_trl
from r1.envs.tools import get_tool
from r1.tasks import gsm8k
from r1.tokenizer import load_tokenizer

DATA = Path(__file__).resolve().parents[2] / "data" / "gsm8k"


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("smollm2-135m-instruct")


def hf_ids(tok, messages, add_generation_prompt):
    return tok.hf.apply_chat_template(messages, chat_template=peer_trl.CHAT_TEMPLATE, tokenize=True,
                                      return_dict=False, add_generation_prompt=add_generation_prompt)


def test_template_renders_the_expert_chats_as_our_tokenizer_does(tok):
    schema = [get_tool("calculator").schema]
    rows = gsm8k.load_split(DATA, "train")[:40]
    for row in rows:
        chat = gsm8k.expert_messages(row, tools=True)
        trl_chat = peer_trl.prompt_messages(row) + chat[2:]  # TRL's dataset prompt, then the episode
        assert hf_ids(tok, peer_trl.prompt_messages(row), True) == tok.render(chat[:2], tools=schema)
        for cut in range(3, len(chat) + 1):  # every prefix: after a call, after results, the final answer
            gen = chat[cut - 1]["role"] != "assistant"
            assert hf_ids(tok, trl_chat[:cut], gen) == tok.render(chat[:cut], tools=schema, add_generation_prompt=gen)


def test_template_joins_several_calls_and_results_like_ours(tok):
    schema = [get_tool("calculator").schema]
    call = lambda e: {"type": "function", "function": {"name": "calculator", "arguments": {"expression": e}}}
    chat = [{"role": "system", "content": gsm8k.TOOL_SYSTEM_PROMPT}, {"role": "user", "content": "2+3 and 4*5?"},
            {"role": "assistant", "content": "Both:", "tool_calls": [call("2+3"), call("4*5")]},
            {"role": "tool", "name": "calculator", "content": "5"}, {"role": "tool", "name": "calculator", "content": "20"},
            {"role": "assistant", "content": "", "tool_calls": [call("5+20")]},
            {"role": "tool", "name": "calculator", "content": "25"}]
    trl_chat = peer_trl.prompt_messages({"question": "2+3 and 4*5?"}) + chat[2:]
    assert hf_ids(tok, trl_chat, True) == tok.render(chat, tools=schema)


def test_the_tool_and_the_reward_are_ours():
    assert peer_trl.calculator("(48 + 24) / 2") == "36"
    assert peer_trl.calculator("1/0").startswith("error:")
    gold = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n#### 72"
    done = [{"role": "assistant", "content": "So 72 in all.\n#### 72"}]
    assert peer_trl.final_reward(done, gold) == 1.0
    assert peer_trl.final_reward([{"role": "assistant", "content": "#### 71"}], gold) == 0.0
    ended_on_call = [{"role": "assistant", "content": "#### 72", "tool_calls": [{"type": "function", "function": {}}]}]
    assert peer_trl.final_reward(ended_on_call, gold) == 0.0
    assert peer_trl.final_reward(done + [{"role": "tool", "content": "72"}], gold) == 0.0
    assert peer_trl.final_reward([], gold) == 0.0
