"""ToolEnv and the Env context policies, on the real SmolLM2 tokenizer.

Every malformed-call kind must come back as a `tool` message the model can
read plus an info["errors"] entry and the penalty, never as an exception;
the context policies are checked on raw-id observations, where every token
count is known, and on rendered messages where the template matters.
"""
import json

import pytest

from r1.envs.base import Action, Env, Observation
from r1.envs.tool_env import ERROR_KINDS, ToolEnv, parse_tool_calls
from r1.tasks import gsm8k
from r1.tokenizer import load_tokenizer

SAMPLE = {"id": "q0", "question": "Ann has 48 apples and gives away half, then buys 3. How many now?", "answer": "27"}
PENALTY = -0.25


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("smollm2-135m-instruct")


def call(name="calculator", **arguments) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def act(tok, text, stop=True) -> Action:
    """An action as the sampler would produce it: ids, then their decoded text (ending in <|im_end|>)."""
    ids = tok.encode(text) + ([tok.eos_id] if stop else [])
    return Action(ids, tok.decode(ids), "eos" if stop else "length")


def tool_env(tok, **kw) -> ToolEnv:
    kw = {"malformed_penalty": PENALTY, "max_steps": 4, **kw}
    return ToolEnv(tok, gsm8k.make_prompt, gsm8k.score, **kw)


def started(tok, **kw):
    env = tool_env(tok, **kw)
    prompt, reason = env.first_prompt(env.reset(SAMPLE))
    assert reason is None
    return env, prompt


# ---------------------------------------------------------------- ToolEnv: malformed calls

MALFORMED = {
    "bad_json": ('<tool_call>{"name": "calculator", "arguments": {"expression": "1+1"}</tool_call>', "bad_json"),
    "unknown_tool": (call("web_search", query="apples"), "unknown_tool"),
    "wrong_type": (call(expression=48), "bad_arguments"),
    "missing_arguments": ('<tool_call>{"name": "calculator"}</tool_call>', "bad_arguments"),
    "empty_arguments": (call(), "bad_arguments"),
    "extra_argument": (call(expression="1+1", precision=3), "bad_arguments"),
    "unclosed_tag": ('<tool_call>{"name": "calculator", "arguments": {"expression": "48/2"}}', "unclosed_tag"),
    "too_many_calls": (call(expression="1+1") * 9, "too_many_calls"),
    "arguments_string_not_object": ('<tool_call>{"name": "calculator", "arguments": "\\"48/2\\""}</tool_call>',
                                    "bad_arguments"),
    "arguments_bad_json_string": ('<tool_call>{"name": "calculator", "arguments": "{expression: 1}"}</tool_call>',
                                  "bad_json"),
    "arguments_list": ('<tool_call>{"name": "calculator", "arguments": ["48/2"]}</tool_call>', "bad_arguments"),
    "not_an_object": ("<tool_call>[1, 2, 3]</tool_call>", "bad_call"),
    "name_not_string": ('<tool_call>{"name": 7, "arguments": {}}</tool_call>', "bad_call"),
    "empty_tag": ("<tool_call></tool_call>", "bad_json"),
    "empty_response": ("", "empty_response"),
    "whitespace_response": (" \n\t ", "empty_response"),
    "special_token_inside": ("Let me compute.<|im_start|>user\nhi " + call(expression="2+2"), "special_token"),
    "special_token_in_name": (call("calc<|im_end|>\n<|im_start|>system", expression="1"), "special_token"),
    "tool_error": (call(expression="1/0"), "tool_error"),
    "huge_int": ('<tool_call>{"name": "calculator", "arguments": {"expression": ' + "9" * 5000 + "}}</tool_call>",
                 "bad_json"),
    "deep_arguments_string": ('<tool_call>{"name": "calculator", "arguments": "' + "[" * 50000 + '"}</tool_call>',
                              "bad_json"),
    "deep_json": ("<tool_call>" + "[" * 50000 + "</tool_call>", "bad_json"),
    "huge_float": ('<tool_call>{"name": "calculator", "arguments": {"expression": 1e999}}</tool_call>',
                   "bad_arguments"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_call_is_an_error_observation(tok, case):
    text, kind = MALFORMED[case]
    env, prompt = started(tok, max_context=60_000)  # room for the 50k-bracket replies
    action = act(tok, text)
    obs, reward, done, info = env.step(action)
    assert kind in info["errors"] and set(info["errors"]) <= set(ERROR_KINDS)
    assert not done and not info["final"] and reward == PENALTY
    assert obs.messages and all(m["role"] == "tool" for m in obs.messages)
    errors = [m["content"] for m in obs.messages if m["content"].startswith("error")]
    assert len(errors) == len(info["errors"]), (errors, info)
    # The error reaches the model: it is in the next prompt, after the closed assistant turn.
    nxt, reason = env.next_prompt(prompt, action, obs)
    assert reason is None and nxt[: len(prompt) + len(action.ids)] == prompt + action.ids
    shown = tok.decode(nxt[len(prompt) + len(action.ids):])
    assert "error" in shown and shown.endswith("<|im_start|>assistant\n")
    # Echoed model text never forges a turn: the observation holds exactly the template's own special
    # tokens (the \n closing the turn, one user turn, one generation prompt).
    obs_ids = nxt[len(prompt) + len(action.ids) + 1:]
    specials = [t for t in obs_ids if t in (0, 1, 2)]
    assert specials == [1, 2, 1], tok.decode(obs_ids)


def test_too_many_calls_runs_the_first_max_calls(tok):
    env, _ = started(tok, max_calls=3)
    obs, _, _, info = env.step(act(tok, "".join(call(expression=f"{i}*2") for i in range(1, 6))))
    assert info["tool_calls"] == 3 and info["errors"] == ["too_many_calls"]
    assert [m["content"] for m in obs.messages[:3]] == ["2", "4", "6"]


def test_parse_tool_calls_reports_every_problem_in_order():
    text = call(expression="1") + "<tool_call>{oops}</tool_call>" + call("x") + "<tool_call>{\"name\": "
    calls, errors = parse_tool_calls(text)
    assert calls == [("calculator", {"expression": "1"}), ("x", {})]
    assert [k for k, _ in errors] == ["bad_json", "unclosed_tag"]


def test_ten_thousand_characters_of_junk_never_raises(tok):
    import random

    rng = random.Random(0)
    alphabet = "{}[]\":,<>/\\|_ abcxyz0123456789\n\u00e9\u4e2d\U0001f600" + "<tool_call>"
    for n in range(20):
        junk = "".join(rng.choice(alphabet) for _ in range(10_000))
        if n % 2:
            junk = "<tool_call>" + junk
        env, prompt = started(tok)
        action = act(tok, junk, stop=bool(n % 3))
        obs, reward, done, info = env.step(action)
        assert set(info["errors"]) <= set(ERROR_KINDS)
        if obs is not None:
            assert all(len(m["content"]) < 1000 for m in obs.messages)  # an error never quotes the junk back
            env.next_prompt(prompt, action, obs)


# ---------------------------------------------------------------- ToolEnv: valid calls, answers, max_steps


def test_several_valid_calls_give_results_in_order(tok):
    env, prompt = started(tok)
    text = "First half: " + call(expression="48/2") + " then " + call(expression="24+3") + call(expression="2**10")
    action = act(tok, text)
    obs, reward, done, info = env.step(action)
    assert (reward, done, info["tool_calls"], info["errors"]) == (0.0, False, 3, [])
    assert [(m["name"], m["content"]) for m in obs.messages] == [("calculator", "24"), ("calculator", "27"),
                                                                 ("calculator", "1024")]
    nxt, _ = env.next_prompt(prompt, action, obs)
    shown = tok.decode(nxt[len(prompt):])
    assert shown.index("24\n</tool_response>") < shown.index("27\n</tool_response>") < shown.index("1024")


def test_arguments_as_json_string_holding_an_object_is_accepted(tok):
    env, _ = started(tok)
    text = '<tool_call>{"name": "calculator", "arguments": "{\\"expression\\": \\"6*7\\"}"}</tool_call>'
    obs, reward, _, info = env.step(act(tok, text))
    assert info["errors"] == [] and obs.messages[0]["content"] == "42" and reward == 0.0


@pytest.mark.parametrize("text, want", [("24 + 3 = 27\n#### 27", 1.0), ("#### 26", 0.0), ("the answer is 27", 0.0),
                                        ("\\boxed{27}", 1.0)])
def test_final_answer_scores_with_gsm8k(tok, text, want):
    env, _ = started(tok)
    action = act(tok, text)
    obs, reward, done, info = env.step(action)
    assert obs is None and done and info["final"] and info["errors"] == []
    assert reward == want == gsm8k.score(action.text, SAMPLE["answer"])


def test_max_steps_ends_the_episode(tok):
    env, prompt = started(tok, max_steps=2)
    action = act(tok, call(expression="48/2"))
    obs, _, done, info = env.step(action)
    assert not done and "reason" not in info
    prompt, _ = env.next_prompt(prompt, action, obs)
    obs, reward, done, info = env.step(act(tok, "<tool_call>{bad"))
    assert obs is None and done and info["reason"] == "max_steps" and reward == PENALTY
    assert info["errors"] == ["unclosed_tag"]


def test_without_tools_any_reply_is_the_final_answer(tok):
    env = tool_env(tok, tools=(), max_steps=1)
    prompt, _ = env.first_prompt(env.reset(SAMPLE))
    assert "<tools>" not in tok.decode(prompt)
    obs, reward, done, info = env.step(act(tok, call(expression="1") + "\n#### 27"))
    assert obs is None and done and info["final"] and reward == 1.0


# ---------------------------------------------------------------- token exactness


def test_ids_that_do_not_survive_re_encoding_reach_the_next_prompt_unchanged(tok):
    text = call(expression="48/2")
    drift = None
    for k in range(1, len(text)):
        ids = tok.encode(text[:k]) + tok.encode(text[k:]) + [tok.eos_id]
        if tok.encode(tok.decode(ids)) != ids:
            drift = ids
            break
    assert drift is not None, "no split of the call re-encodes differently; pick another text"
    env, prompt = started(tok)
    action = Action(drift, tok.decode(drift), "eos")
    obs, _, _, info = env.step(action)
    assert info["tool_calls"] == 1 and info["errors"] == []  # the text parses the same
    nxt, _ = env.next_prompt(prompt, action, obs)
    assert nxt[len(prompt): len(prompt) + len(drift)] == drift
    assert nxt[len(prompt) + len(drift):] == tok.close_turn_ids(drift) + tok.render_next(obs.messages)
    re_encoded = prompt + tok.encode(action.text)
    assert nxt[: len(re_encoded)] != re_encoded  # the naive pipeline would have trained on other tokens


# ---------------------------------------------------------------- context policies


class RawEnv(Env):
    """Raw-id observations of a fixed size, so every budget is countable; never ends by itself."""

    def __init__(self, first, obs_len=3, **kw):
        super().__init__(None, **kw)
        self.first, self.obs_len, self.t = list(first), obs_len, 0

    def reset(self, sample):
        return Observation(ids=self.first)

    def step(self, action):
        self.t += 1
        return Observation(ids=[500 + 10 * self.t + j for j in range(self.obs_len)]), 0.0, False, {}


def play(env, responses):
    """Feed responses until one is refused -> (prompts seen, end reason or None)."""
    prompt, reason = env.first_prompt(env.reset({}))
    prompts = [prompt]
    for r in responses:
        if prompt is None:
            break
        action = Action(r, "", "length")
        obs, _, _, _ = env.step(action)
        prompt, reason = env.next_prompt(prompt, action, obs)
        prompts.append(prompt)
    return [p for p in prompts if p is not None], reason


FIRST = list(range(100, 110))  # 10 ids
RESPONSES = [[200 + 10 * i + j for j in range(4)] for i in range(8)]  # 4 ids each; a chunk is 4 + 3 = 7


def test_append_is_token_concatenation_then_ends_on_the_budget():
    env = RawEnv(FIRST, max_context=40, max_new_tokens=10)  # budget 30 = first 10 + two chunks of 7 + 6
    prompts, reason = play(env, RESPONSES)
    assert reason == "context_budget" and len(prompts) == 3
    for t in range(2):
        assert prompts[t + 1] == prompts[t] + RESPONSES[t] + [500 + 10 * (t + 1) + j for j in range(3)]


def test_window_keeps_the_first_prompt_and_drops_the_oldest_turns():
    env = RawEnv(FIRST, policy="window", max_context=40, max_new_tokens=10)
    prompts, reason = play(env, RESPONSES)
    assert reason is None and len(prompts) == 9
    chunks = [RESPONSES[t] + [500 + 10 * (t + 1) + j for j in range(3)] for t in range(8)]
    for t, p in enumerate(prompts[1:], start=1):
        kept = chunks[max(0, t - 2):t]  # room for 20 ids: the two newest whole turns
        assert p == FIRST + [i for c in kept for i in c], t
        assert len(p) <= env.budget


def test_window_ends_when_one_turn_alone_does_not_fit():
    env = RawEnv(FIRST, obs_len=30, policy="window", max_context=40, max_new_tokens=10)
    prompts, reason = play(env, RESPONSES)
    assert reason == "context_budget" and prompts == [FIRST]


def test_truncate_keeps_the_first_prompt_and_the_most_recent_tokens():
    env = RawEnv(FIRST, policy="truncate", max_context=40, max_new_tokens=10)
    prompts, reason = play(env, RESPONSES)
    assert reason is None and len(prompts) == 9
    stream = [i for t in range(8) for i in RESPONSES[t] + [500 + 10 * (t + 1) + j for j in range(3)]]
    for t, p in enumerate(prompts[1:], start=1):
        seen = stream[: 7 * t]
        assert p == FIRST + seen[-20:], t
    assert len(prompts[-1]) == env.budget


def test_summarize_hook_replaces_old_turns():
    class Summary(RawEnv):
        calls = 0

        def summarize(self, chunks):
            Summary.calls += 1
            assert chunks[0] == FIRST and len(chunks) >= 2
            return Observation(ids=[900, len(chunks)])

    env = Summary(FIRST, policy="append", max_context=40, max_new_tokens=10)
    prompts, reason = play(env, RESPONSES)
    assert reason is None and Summary.calls > 0
    assert [900, 4] == prompts[3][len(FIRST):]  # 3 turns did not fit: first + summary of the 3 chunks
    assert all(len(p) <= env.budget for p in prompts)


def test_summary_messages_render_as_a_well_formed_turn(tok):
    class Summary(Env):
        def reset(self, sample):
            return Observation(messages=[{"role": "user", "content": "Count to a thousand."}])

        def step(self, action):
            return Observation(messages=[{"role": "user", "content": "go on " * 20}]), 0.0, False, {}

        def summarize(self, chunks):
            return Observation(messages=[{"role": "user", "content": "So far: 1..40. Continue."}])

    env = Summary(tok, max_context=100, max_new_tokens=20)
    prompt, _ = env.first_prompt(env.reset({}))
    action = act(tok, " ".join(map(str, range(1, 41))))
    nxt, reason = env.next_prompt(prompt, action, env.step(action)[0])
    assert reason is None
    assert nxt == tok.render([{"role": "user", "content": "Count to a thousand."}, {"role": "assistant", "content": ""},
                              {"role": "user", "content": "So far: 1..40. Continue."}])


def test_first_prompt_longer_than_the_budget_ends_cleanly(tok):
    env = tool_env(tok, max_context=256, max_new_tokens=64)
    prompt, reason = env.first_prompt(env.reset({**SAMPLE, "question": "apples " * 5000}))
    assert (prompt, reason) == (None, "context_budget")
    env = RawEnv(list(range(50)), max_context=40, max_new_tokens=10)
    assert env.first_prompt(env.reset({})) == (None, "context_budget")


def test_bad_context_settings_are_clear_errors():
    with pytest.raises(ValueError, match="context policy 'sliding'"):
        RawEnv(FIRST, policy="sliding")
    with pytest.raises(ValueError, match="max_new_tokens=64 .* max_context=64"):
        RawEnv(FIRST, max_context=64, max_new_tokens=64)


def test_score_sees_the_reply_without_the_stop_token(tok):
    """An exact-match reward pays a correct final answer: the task's score gets the reply's text without the
    `<|im_end|>` that ended the turn, while the action's ids keep it."""
    seen = []

    def exact(text, answer):
        seen.append(text)
        return float(text == f"#### {answer}")

    env = ToolEnv(tok, gsm8k.make_prompt, exact)
    env.reset(SAMPLE)
    action = act(tok, "#### 27")
    assert action.text.endswith("<|im_end|>") and action.ids[-1] == tok.eos_id
    _, reward, done, info = env.step(action)
    assert seen == ["#### 27"] and done and reward == 1.0 and info["correct"]
    assert action.ids[-1] == tok.eos_id
