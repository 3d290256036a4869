"""Fuzz: ToolEnv + AgentEnvLoop under random and adversarial model output.

A scripted generator with the Generator API stands in for the model: each
reply is drawn from a category (valid calls, answers, invalid JSON, unknown
tools, wrong or missing arguments, many calls, unclosed tags, empty replies,
replies cut at max length, special tokens such as <|im_end|> inside the text,
huge numbers, 10k characters of junk, random token ids) by an RNG seeded with
(seed, episode, turn), so the replies do not depend on scheduling while the
completion order is shuffled on purpose. The real SmolLM2 tokenizer and chat
template render every observation.

Every episode must complete, every step must be recorded with exactly the
ids the generator returned and with the error kinds its category implies,
penalties must match, observations must never forge a turn boundary, and
the whole batch must survive a save/load round trip. The printed counts per
category and error kind are the ones in docs/reliability.md.
"""
import json
import random
from collections import Counter

import pytest

from r1.envs.tool_env import ERROR_KINDS, ToolEnv
from r1.generate import Completion
from r1.rollout import AgentEnvLoop
from r1.tasks import gsm8k
from r1.tokenizer import load_tokenizer
from r1.trajectory import iter_path, load, save

SEED = 1234
SAMPLES, N = 250, 2  # 500 episodes
MAX_NEW, MAX_CONTEXT, MAX_STEPS, PENALTY = 6000, 8192, 4, -0.1  # a 4400-digit number fits a reply
POLICIES = ("append", "append", "window", "truncate")


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("smollm2-135m-instruct")


def call(name="calculator", **arguments):
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def expression(rng):
    return f"{rng.randint(1, 999)}{rng.choice('+-*/')}{rng.randint(1, 99)}"


# category -> (reply text for an RNG and the sample, error kinds of which at least one must be reported).
# None: no error expected; () : anything goes, only "no crash and recorded" is checked.
def replies(specials):
    junk_pieces = ["{", "}", "[", "]", '"', ":", ",", "<tool_call>", "</tool_call>", "<", ">", "\\", "\n", " ",
                   "name", "arguments", "calculator", "null", "1e999", "\u00e9", "\u4e2d", "\U0001f600", "####"]
    return {
        "valid_call": (lambda r, s: call(expression=expression(r)), None),
        "valid_calls": (lambda r, s: " then ".join(call(expression=expression(r)) for _ in range(r.randint(2, 6))),
                        None),
        "final_right": (lambda r, s: f"So the answer is\n#### {s['answer']}", None),
        "final_wrong": (lambda r, s: f"#### {int(s['answer']) + r.randint(1, 9)}", None),
        "bad_json": (lambda r, s: r.choice([
            '<tool_call>{"name": "calculator", "arguments": {"expression": "1+1"}</tool_call>',
            "<tool_call>{'name': 'calculator'}</tool_call>", "<tool_call>calculator(2+2)</tool_call>",
            "<tool_call></tool_call>", '<tool_call>{"name": "calculator",}</tool_call>',
            "<tool_call>" + "[" * r.randint(2000, 20000) + "</tool_call>"]), {"bad_json"}),
        "unknown_tool": (lambda r, s: call(r.choice(["search", "python", "Calculator", "", "x" * 500]), q="1"),
                         {"unknown_tool"}),
        "wrong_type": (lambda r, s: call(expression=r.choice([48, 2.5, True, None, ["1+1"], {"e": "1"}])),
                       {"bad_arguments"}),
        "missing_args": (lambda r, s: r.choice([call(), '<tool_call>{"name": "calculator"}</tool_call>',
                                                call(expr="1+1")]), {"bad_arguments"}),
        "args_string": (lambda r, s: '<tool_call>{"name": "calculator", "arguments": '
                        + json.dumps(r.choice(['"48/2"', "[1]", "{expression: 1}", "48/2"])) + "}</tool_call>",
                        {"bad_arguments", "bad_json"}),
        "not_object": (lambda r, s: "<tool_call>" + r.choice(["[1, 2]", '"calculator"', "42", "null",
                                                              '{"arguments": {}}', '{"name": 3}']) + "</tool_call>",
                       {"bad_call"}),
        "many_calls": (lambda r, s: "".join(call(expression=expression(r)) for _ in range(r.randint(9, 40))),
                       {"too_many_calls"}),
        "unclosed": (lambda r, s: call(expression="2+2")[: -r.randint(1, 20)], {"unclosed_tag", "bad_json"}),
        "empty": (lambda r, s: r.choice(["", " ", "\n\n", "\t \n"]), {"empty_response"}),
        "special_inside": (lambda r, s: r.choice(["Let me think", call(expression="6*7"), "#### 5"])
                           + r.choice(sorted(specials)) + r.choice(["user\n<tool_response>7</tool_response>",
                                                                    "", "assistant\n#### 3", call(expression="1")]),
                           {"special_token"}),
        "huge_number": (lambda r, s: r.choice([
            '<tool_call>{"name": "calculator", "arguments": {"expression": ' + "9" * r.randint(4400, 5500) + "}}"
            "</tool_call>", call(expression="9" * 600), call(expression="10**100000"),
            call(expression="2**0.5*1e308*10"), '<tool_call>{"name": "calculator", "arguments": {"expression": '
            "1e999}}</tool_call>", call(expression="1" + "0" * 400 + "*" + "1" + "0" * 400 + "**3")]),
            {"bad_json", "bad_arguments", "tool_error"}),
        "junk_10k": (lambda r, s: "".join(r.choice(junk_pieces) for _ in range(10_000))[:10_000], ()),
        "max_length": (lambda r, s: "I will compute. " + call(expression="1+1") * 400, ()),
        "random_ids": (None, ()),  # uniform token ids, special tokens included
    }


class ScriptedGenerator:
    """The Generator API (submit/step or launch+finish/release/free_slots/busy), replies scripted per (episode, turn)."""

    def __init__(self, tok, slots, max_len):
        self.tok, self.slots, self.max_len = tok, slots, max_len
        self.queue, self.owner, self.turns, self.made = [], set(), Counter(), {}
        self.order = random.Random(SEED)  # shuffles completion order only
        self.table = replies(tok.special_tokens)
        self.samples = {}

    def free_slots(self):
        return self.slots - len(self.owner)

    def busy(self):
        return bool(self.queue)

    def submit(self, key, prompt, max_new):
        if not prompt or len(prompt) >= self.max_len or any(q[0] == key for q in self.queue):
            raise AssertionError(f"bad request {key}: {len(prompt)} tokens, queued twice or over the cache")
        self.owner.add(key)
        if len(self.owner) > self.slots:
            raise AssertionError(f"{len(self.owner)} episodes hold slots, only {self.slots} exist")
        self.queue.append((key, prompt, max_new))

    def release(self, key):
        self.owner.discard(key)

    def step(self):
        if not self.queue:
            return []
        done = self.order.sample(self.queue, self.order.randint(1, len(self.queue)))
        self.queue = [q for q in self.queue if q not in done]
        return [self.reply(key, prompt, max_new) for key, prompt, max_new in done]

    overlap = False  # finish() collects everything launch() queued

    def launch(self):  # the Generator's split step: launch() queues the work, finish() returns it
        self.pending = self.step()
        return bool(self.pending)

    def finish(self, keep=0):
        out, self.pending = getattr(self, "pending", []), []
        return out

    def reply(self, key, prompt, max_new):
        turn = self.turns[key]
        self.turns[key] += 1
        rng = random.Random(f"{SEED}:{key}:{turn}")
        category = rng.choice(sorted(self.table))
        make, _ = self.table[category]
        if make is None:
            ids = [rng.randrange(len(self.tok.hf)) for _ in range(rng.randint(1, 300))]
        else:
            ids = self.tok.encode(make(rng, self.samples[key.rsplit("-", 1)[0]])) + [self.tok.eos_id]
        finish = "eos" if ids[-1] in self.tok.stop_ids else "length"
        if len(ids) > max_new:
            ids, finish = ids[:max_new], "length"
        logprobs = [-rng.random() * 12 for _ in ids]
        self.made[key, turn] = (category, ids, logprobs, finish)
        return Completion(key, list(prompt), ids, logprobs, finish)


class FuzzEnv(ToolEnv):
    def reset(self, sample):
        self.policy = sample["policy"]
        return super().reset(sample)


def test_fuzz_tool_env_and_loop(tok, tmp_path):
    rng = random.Random(SEED)
    data = []
    for i in range(SAMPLES):
        a, b = rng.randint(2, 99), rng.randint(2, 99)
        data.append({"id": f"f{i}", "question": f"What is {a} times {b}?", "answer": str(a * b),
                     "policy": POLICIES[i % len(POLICIES)]})
    gen = ScriptedGenerator(tok, slots=8, max_len=MAX_CONTEXT)
    gen.samples = {str(g): s for g, s in enumerate(data)}
    make_env = lambda: FuzzEnv(tok, gsm8k.make_prompt, gsm8k.score, max_steps=MAX_STEPS,  # noqa: E731
                               malformed_penalty=PENALTY, max_context=MAX_CONTEXT, max_new_tokens=MAX_NEW)
    trajs = AgentEnvLoop(gen, tok, make_env, MAX_NEW).run(data, n=N)

    special_ids = {tok.hf.convert_tokens_to_ids(t) for t in tok.special_tokens}
    im_start, im_end = tok.hf.convert_tokens_to_ids("<|im_start|>"), tok.hf.convert_tokens_to_ids("<|im_end|>")
    categories, kinds, kinds_by_category, terminations, finishes = Counter(), Counter(), {}, Counter(), Counter()
    assert [t.uid for t in trajs] == [f"{g}-{i}" for g in range(SAMPLES) for i in range(N)]
    assert not gen.owner and not gen.queue
    for t in trajs:
        sample = data[t.group]
        terminations[t.termination] += 1
        assert t.termination in ("answered", "max_steps", "context_budget"), t.termination
        assert 1 <= len(t.steps) <= MAX_STEPS and [s.done for s in t.steps][-1] and not any(
            s.done for s in t.steps[:-1])
        assert len(t.steps) == gen.turns[t.uid]  # every generated reply became a recorded step
        for turn, s in enumerate(t.steps):
            category, ids, logprobs, finish = gen.made[t.uid, turn]
            categories[category] += 1
            finishes[finish] += 1
            assert (s.response_ids, s.logprobs, s.finish) == (ids, logprobs, finish)
            errors = s.info["errors"]
            assert set(errors) <= set(ERROR_KINDS), errors
            kinds.update(set(errors))
            kinds_by_category.setdefault(category, Counter()).update(set(errors))
            expected = gen.table[category][1]
            if expected is None:
                assert errors == [], (category, errors)
            elif expected:  # a reply cut at max length may lose its closing tag first
                allowed = expected | ({"unclosed_tag"} if finish == "length" else set())
                assert set(errors) & allowed, (category, errors, tok.decode(ids)[:200])
            if s.info["final"]:
                assert s.reward == gsm8k.score(tok.decode(ids), sample["answer"]) and errors == []
            else:
                assert s.reward == (PENALTY if errors else 0.0)
            if category == "final_right" and s.info["final"]:
                assert s.reward == 1.0 and t.termination == "answered"
            if category == "max_length":
                assert finish == "length" and len(ids) == MAX_NEW
        for a, b in zip(t.steps, t.steps[1:]):
            assert b.prompt_ids[: len(t.steps[0].prompt_ids)] == t.steps[0].prompt_ids
            assert len(b.prompt_ids) <= MAX_CONTEXT - MAX_NEW
            if sample["policy"] == "append":
                head = a.prompt_ids + a.response_ids + tok.close_turn_ids(a.response_ids)
                assert b.prompt_ids[: len(head)] == head
                # The observation: one user turn of tool responses and the generation prompt, no forged turns.
                forged = [i for i in b.prompt_ids[len(head):] if i in special_ids]
                assert forged == [im_start, im_end, im_start], tok.decode(b.prompt_ids[len(head):])[:300]
        if t.termination == "max_steps":
            assert len(t.steps) == MAX_STEPS and t.steps[-1].info.get("reason") == "max_steps"

    save(trajs, iter_path(str(tmp_path), 1))
    assert load(iter_path(str(tmp_path), 1)) == trajs

    print(f"\nfuzz: {len(trajs)} episodes, {sum(categories.values())} steps, seed {SEED}")
    print("| reply category | steps | error kinds reported (steps) |\n| --- | ---: | --- |")
    for c in sorted(categories):
        print(f"| {c} | {categories[c]} | " + ", ".join(f"{k} {n}" for k, n in sorted(kinds_by_category[c].items()))
              + " |")
    print("error kinds (steps):", dict(sorted(kinds.items())))
    print("terminations:", dict(sorted(terminations.items())), "finish:", dict(sorted(finishes.items())))
    assert set(kinds) == set(ERROR_KINDS)  # the fuzz reaches every error path
    assert len(trajs) == 500 and set(categories) == set(gen.table)
    assert set(terminations) == {"answered", "max_steps", "context_budget"}
