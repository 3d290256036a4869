"""Synthetic task: determinism, row schema, answers checked two independent ways
(replaying the expert chat through the calculator, and re-reading the story),
and difficulty that grows with the level."""

import re
import statistics

import pytest

from r1.envs.tools import calculate
from r1.tasks import gsm8k
from r1.tasks.synthetic import MAX_LEVEL, expert_messages, make_dataset


def test_deterministic_per_seed_and_prefix_stable():
    assert make_dataset(30, seed=7, level=2) == make_dataset(30, seed=7, level=2)
    assert make_dataset(10, seed=7, level=2) == make_dataset(30, seed=7, level=2)[:10]
    assert make_dataset(30, seed=7, level=2) != make_dataset(30, seed=8, level=2)
    assert len({r["id"] for r in make_dataset(50, seed=1, level=3)}) == 50


def test_rows_have_the_gsm8k_schema():
    for row in make_dataset(20, seed=0, level=3):
        assert set(row) == {"id", "question", "answer", "solution"}
        assert re.fullmatch(r"[1-9]\d*", row["answer"])
        assert row["solution"].endswith(f"\n#### {row['answer']}")
        assert gsm8k.score(row["solution"], row["answer"]) == 1.0
        assert row["question"].endswith("have now?")


@pytest.mark.parametrize("level", range(1, MAX_LEVEL + 1))
def test_expert_replay_reaches_the_answer(level):
    for row in make_dataset(25, seed=3, level=level):
        messages = expert_messages(row)
        calls = [m["tool_calls"][0]["function"]["arguments"]["expression"] for m in messages if "tool_calls" in m]
        results = [m["content"] for m in messages if m["role"] == "tool"]
        assert len(calls) == level
        assert results == [calculate(c).text for c in calls]
        assert results == [a for _, a in gsm8k.calculator_calls(row["solution"])]  # annotations are right
        assert results[-1] == row["answer"]
        assert gsm8k.score(messages[-1]["content"], row["answer"]) == 1.0


def _split(value, k):
    assert value % k == 0, "a split must be exact"
    return value // k


STORY = [
    (r"has (\d+) \w+\.$", lambda value, k: k),
    (r"gets (\d+) more", lambda value, k: value + k),
    (r"gives away (\d+)", lambda value, k: value - k),
    (r"grows to (\d+) times", lambda value, k: value * k),
    (r"into (\d+) equal piles", _split),
]


def answer_from_story(question):
    """Re-derive the answer from the question text alone, independent of the solution."""
    value = None
    for sentence in re.split(r"(?<=[.?])\s+", question):
        for pattern, apply in STORY:
            match = re.search(pattern, sentence)
            if match:
                value = apply(value, int(match.group(1)))
                assert value > 0
                break
    return value


@pytest.mark.parametrize("level", [1, 2, 4])
def test_question_text_determines_the_answer(level):
    for row in make_dataset(40, seed=11, level=level):
        assert str(answer_from_story(row["question"])) == row["answer"], row["question"]


def test_levels_differ():
    starts = {}
    for level in (1, 2, 3):
        rows = make_dataset(60, seed=5, level=level)
        assert {len(gsm8k.calculator_calls(r["solution"])) for r in rows} == {level}
        starts[level] = statistics.median(int(re.search(r"has (\d+)", r["question"]).group(1)) for r in rows)
    assert starts[1] <= 20 < starts[2] <= 100 < starts[3]
    ops = {op for r in make_dataset(60, seed=5, level=3) for op in re.findall(r"\d([-+*/])\d", r["solution"])}
    assert ops == {"+", "-", "*", "/"}


@pytest.mark.parametrize("kwargs,message", [
    ({"n": 3, "seed": 0, "level": 0}, "level must be an int from 1 to"),
    ({"n": 3, "seed": 0, "level": MAX_LEVEL + 1}, "level must be"),
    ({"n": 3, "seed": 0, "level": "2"}, "level must be"),
    ({"n": -1, "seed": 0, "level": 1}, "n must be a non-negative int"),
    ({"n": 2.0, "seed": 0, "level": 1}, "n must be"),
    ({"n": 3, "seed": "a", "level": 1}, "seed must be an int"),
])
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        make_dataset(**kwargs)
