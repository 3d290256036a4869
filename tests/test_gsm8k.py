"""GSM8K task: answer extraction and scoring, loading (and its errors), prompts,
and expert tool-use chats replayed through the real calculator. Tests on the
real data read the copy shipped in data/gsm8k; inline fixtures always run."""

import json
import sys
from decimal import Decimal
from pathlib import Path

import pytest

from r1.envs.tools import calculate
from r1.tasks import gsm8k
from r1.tasks.gsm8k import (PLAIN_SYSTEM_PROMPT, TOOL_SYSTEM_PROMPT, calculator_calls, expert_messages,
                            extract_answer, load_split, make_prompt, normalize_number, score)

DATA = Path(__file__).resolve().parents[1] / "data" / "gsm8k"  # the copy shipped with the project
needs_data = pytest.mark.skipif(not (DATA / "train.jsonl.gz").is_file(), reason="data/gsm8k is missing from the checkout")

NATALIA = {
    "question": "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
                "How many clips did Natalia sell altogether in April and May?",
    "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
              "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72",
}
WENG = {
    "question": "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting. "
                "How much did she earn?",
    "answer": "Weng earns 12/60 = $<<12/60=0.2>>0.2 per minute.\n"
              "Working 50 minutes, she earned 0.2 x 50 = $<<0.2*50=10>>10.\n#### 10",
}

EXTRACT = [
    ("#### 72", "72"),
    ("so the total is 72.\n#### 72", "72"),
    ("####72", "72"),
    ("#### 1,234", "1234"),
    ("#### 1,234,567", "1234567"),
    ("#### $1,234.00", "1234"),
    ("#### $ 18", "18"),
    ("#### 72.0", "72"),
    ("#### 72.00", "72"),
    ("#### 72.", "72"),
    ("#### -3", "-3"),
    ("#### -$3", "-3"),
    ("#### $-3", "-3"),
    ("#### \u22124", "-4"),
    ("#### 2.5", "2.5"),
    ("#### 2.50", "2.5"),
    ("#### .5", "0.5"),
    ("#### -0", "0"),
    ("#### 007", "7"),
    ("#### 5\nwait, no\n#### 7", "7"),
    ("#### 72 clips", "72"),
    ("####\n\n72", "72"),
    ("#### **72**", "72"),
    ("#### seventy-two", None),
    ("#### ", None),
    ("the answer is 72", None),
    ("", None),
    ("\\boxed{72}", "72"),
    ("first \\boxed{1} then \\boxed{\\$1{,}000}", "1000"),
    ("\\boxed{72 \\text{ clips}}", "72"),
    ("\\boxed{\\frac{1}{2}}", None),
    ("\\boxed{-2.50}", "-2.5"),
    ("\\boxed{12", "12"),
    ("#### 9 and \\boxed{10}", "9"),
]


@pytest.mark.parametrize("text,expected", EXTRACT)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize("text,expected", [
    ("The answer is 72.", "72"),
    ("she has 1,000 apples, then $2.50 more", "2.5"),
    ("10-3 is 7", "7"),
    ("from 10 to -3", "-3"),
    ("no numbers here", None),
    ("#### 5 but then 6", "5"),
])
def test_extract_answer_with_last_number_fallback(text, expected):
    assert extract_answer(text, fallback_last_number=True) == expected


@pytest.mark.parametrize("text,expected", [("72", "72"), (" 1,000 ", "1000"), ("$5.50", "5.5"), ("-0.0", "0"),
                                           ("3.14159", "3.14159"), ("1e5", None), ("12 15", None), ("", None)])
def test_normalize_number(text, expected):
    assert normalize_number(text) == expected


def test_score():
    assert score("... #### 72", NATALIA["answer"]) == 1.0
    assert score("... #### 72", "72") == 1.0
    assert score("#### 72.0000001", "72") == 1.0
    assert score("#### 72.001", "72") == 0.0
    assert score("#### 1,000", "1000") == 1.0
    assert score("#### 1000", "1,000") == 1.0
    assert score("#### 73", NATALIA["answer"]) == 0.0
    assert score("I think 72", "72") == 0.0
    assert score("I think 72", "72", fallback_last_number=True) == 1.0
    with pytest.raises(ValueError, match="does not end in a number"):
        score("#### 1", "seventy")
    with pytest.raises(TypeError, match="expects a str"):
        extract_answer(None)


# ---------------------------------------------------------------- loading


def _write_jsonl(path, records):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def test_load_split_from_dir(tmp_path):
    _write_jsonl(tmp_path / "train.jsonl", [NATALIA, WENG])
    rows = load_split(tmp_path, "train")
    assert [r["id"] for r in rows] == ["gsm8k-train-0", "gsm8k-train-1"]
    assert rows[0] == {"id": "gsm8k-train-0", "question": NATALIA["question"], "answer": "72",
                       "solution": NATALIA["answer"]}
    assert rows[1]["answer"] == "10"
    assert load_split(tmp_path / "train.jsonl", "train") == rows  # a file path: split only names the ids


@pytest.mark.parametrize("record,message", [
    ("{not json", "invalid JSON"),
    ("[1, 2]", "expected a JSON object, got list"),
    ({"question": "q"}, "field 'answer' is missing"),
    ({"question": "", "answer": "#### 1"}, "field 'question'"),
    ({"question": "q", "answer": 72}, "field 'answer'"),
    ({"question": "q", "answer": "it is 72"}, "no '#### <number>' line"),
    ({"question": "q", "answer": "#### seventy"}, "cannot read a number after '####'"),
])
def test_load_split_errors_name_file_and_line(tmp_path, record, message):
    path = _write_jsonl(tmp_path / "test.jsonl", [NATALIA, "", record])
    with pytest.raises(ValueError, match=message) as info:
        load_split(tmp_path, "test")
    assert f"{path}:3:" in str(info.value)


def test_load_split_skip_bad_counts(tmp_path):
    _write_jsonl(tmp_path / "test.jsonl", [NATALIA, "{broken", WENG, {"question": "q", "answer": "#### x"}])
    with pytest.warns(UserWarning, match="skipped 2 bad rows of 4"):
        rows = load_split(tmp_path, "test", skip_bad=True)
    assert [r["id"] for r in rows] == ["gsm8k-test-0", "gsm8k-test-2"]


def test_load_split_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match="looked for train.jsonl, train.jsonl.gz, main/train-"):
        load_split(tmp_path, "train")
    with pytest.raises(FileNotFoundError, match="neither a file nor a directory"):
        load_split(tmp_path / "nope", "train")


def test_parquet_without_pyarrow_says_so(tmp_path, monkeypatch):
    (tmp_path / "main").mkdir()
    (tmp_path / "main" / "test-00000-of-00001.parquet").write_bytes(b"PAR1")
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # makes `import pyarrow...` raise ImportError
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(ImportError, match="needs pyarrow"):
        load_split(tmp_path, "test")


def test_parquet_layout(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    (tmp_path / "main").mkdir()
    pq.write_table(pa.Table.from_pylist([NATALIA, WENG]), tmp_path / "main" / "train-00000-of-00001.parquet")
    assert [r["answer"] for r in load_split(tmp_path, "train")] == ["72", "10"]


# ---------------------------------------------------------------- prompts and expert chats


def test_make_prompt():
    row = {"question": "What is 2+2?"}
    assert make_prompt(row, tools=True) == [{"role": "system", "content": TOOL_SYSTEM_PROMPT},
                                            {"role": "user", "content": "What is 2+2?"}]
    assert make_prompt(row, tools=False)[0]["content"] == PLAIN_SYSTEM_PROMPT
    assert make_prompt(row, tools=True, system_prompt="S")[0] == {"role": "system", "content": "S"}
    assert "####" in TOOL_SYSTEM_PROMPT and "calculator" in TOOL_SYSTEM_PROMPT and "####" in PLAIN_SYSTEM_PROMPT


def _call(expression):
    return {"type": "function", "function": {"name": "calculator", "arguments": {"expression": expression}}}


def test_expert_messages_exact(tmp_path):
    _write_jsonl(tmp_path / "train.jsonl", [NATALIA])
    row = load_split(tmp_path, "train")[0]
    assert expert_messages(row)[2:] == [
        {"role": "assistant", "content": "Natalia sold 48/2 =", "tool_calls": [_call("48/2")]},
        {"role": "tool", "name": "calculator", "content": "24"},
        {"role": "assistant", "content": "24 clips in May.\nNatalia sold 48+24 =", "tool_calls": [_call("48+24")]},
        {"role": "tool", "name": "calculator", "content": "72"},
        {"role": "assistant", "content": "72 clips altogether in April and May.\n#### 72"},
    ]
    plain = expert_messages(row, tools=False)
    assert plain[0]["content"] == PLAIN_SYSTEM_PROMPT and len(plain) == 3
    assert plain[2]["content"] == ("Natalia sold 48/2 = 24 clips in May.\n"
                                   "Natalia sold 48+24 = 72 clips altogether in April and May.\n#### 72")


def test_expert_messages_use_the_calculator_not_the_annotation():
    row = {"question": "q", "answer": "5", "solution": "So 2+2 = <<2+2=5>>5.\n#### 5"}
    messages = expert_messages(row)
    assert messages[3] == {"role": "tool", "name": "calculator", "content": "4"}
    assert calculator_calls(row["solution"]) == [("2+2", "5")]


def test_expert_messages_without_annotations_and_canonical_answer():
    row = {"question": "q", "answer": "1000", "solution": "It is a thousand.\n#### 1,000"}
    assert expert_messages(row)[2:] == [{"role": "assistant", "content": "It is a thousand.\n#### 1000"}]


def replay(rows):
    """Run every annotation through the calculator; return (calls, mismatches, final scores)."""
    calls, mismatches, scores = 0, [], []
    for row in rows:
        for expression, annotated in calculator_calls(row["solution"]):
            calls += 1
            result = calculate(expression)
            want = normalize_number(annotated)
            if not result.ok or want is None or \
                    abs(Decimal(str(float(result.text))) - Decimal(want)) > Decimal("1e-6") * max(1, abs(Decimal(want))):
                mismatches.append((row["id"], expression, annotated, result.text))
        messages = expert_messages(row)
        tool_texts = [m["content"] for m in messages if m["role"] == "tool"]
        assert len(tool_texts) == len(calculator_calls(row["solution"]))
        scores.append(score(messages[-1]["content"], row["solution"]))
    return calls, mismatches, scores


def test_expert_replay_inline():
    rows = [{**r, "id": str(i), "answer": extract_answer(r["answer"]), "solution": r["answer"]}
            for i, r in enumerate([NATALIA, WENG])]
    calls, mismatches, scores = replay(rows)
    assert (calls, mismatches, scores) == (4, [], [1.0, 1.0])


@needs_data
def test_expert_replay_real_train_rows():
    rows = load_split(DATA, "train")[:200]
    calls, mismatches, scores = replay(rows)
    print(f"\nGSM8K replay: {calls} calculator calls in {len(rows)} rows, {len(mismatches)} mismatches: "
          f"{mismatches[:5]}")
    assert calls > 400
    assert len(mismatches) <= 0.03 * calls
    assert scores == [1.0] * len(rows)


@needs_data
def test_real_splits_load_whole():
    train, test = load_split(DATA, "train"), load_split(DATA, "test")
    assert (len(train), len(test)) == (7473, 1319)
    assert all(score(f"#### {r['answer']}", r["solution"]) == 1.0 for r in test)
    assert gsm8k.normalize_number(test[0]["answer"]) == test[0]["answer"]
