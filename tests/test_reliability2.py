"""Reliability, second round (issue 17): what the project reads back cannot run code, stall or load corrupted.

One test (or a few) per item of the issue, each failing on main 46e8374, plus the same classes
of input elsewhere. No test asserts on wall time: text handling is bounded by CPU time with a
margin of hours (the inputs take hours when the handling is quadratic) or by a count.
"""
import gzip
import json
import os
import pickle
import subprocess
import sys
import time

import pytest
import torch

from r1.tasks import gsm8k

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMOKE = os.path.join(ROOT, "configs", "smoke.yaml")
TINY = ["rollout.prompts=2", "rollout.n=2", "rollout.max_new_tokens=8", "data.train_size=16", "log.tensorboard=false",
        "log.progress=false"]


def cpu_seconds(fn):
    t = time.process_time()
    out = fn()
    return out, time.process_time() - t


# ------------------------------------------------------------------ 1. rewards in linear time, never raising

HOSTILE_REPLIES = {
    "spaces_after_sign": "#### -" + " " * 200_000 + "x",  # main: 8,000 spaces took 4.5 s, quadratic
    "signs_and_spaces": "- " * 100_000 + " x",  # the last-number fallback was cubic
    "dollar_spaces": "$" + " " * 200_000 + "x",
    "comma_groups": ",111" * 50_000 + "1",
    "digits_4301": "#### " + "1" * 4301,  # main: ValueError (Python's int digit limit) ended the batch
    "digits_1e6": "#### " + "7" * 1_000_000,
    "open_boxes": "\\boxed{" * 100_000,
    "dots": "1." * 100_000,
    "nested_boxes": "\\boxed{" + "{" * 100_000 + "1",
}


@pytest.mark.parametrize("name", sorted(HOSTILE_REPLIES))
@pytest.mark.parametrize("fallback", [False, True])
def test_reward_is_linear_time_and_never_raises(name, fallback):
    text = HOSTILE_REPLIES[name]
    result, cpu = cpu_seconds(lambda: gsm8k.score(text, "42", fallback_last_number=fallback))
    assert result == 0.0
    assert cpu < 5.0, f"{name}: {cpu:.1f} s of CPU for {len(text)} characters"  # quadratic would be hours


def test_reward_work_grows_linearly():
    """CPU time of 8x the input stays within 40x (quadratic would be 64x, cubic 512x)."""
    def work(n):
        text = "- $ " * n + "x"
        return min(cpu_seconds(lambda: [gsm8k.score(text, "1", fallback_last_number=True) for _ in range(3)])[1]
                   for _ in range(3))
    small, big = work(20_000), work(160_000)
    assert big < 40 * max(small, 1e-3)


def test_a_huge_number_is_not_an_answer():
    assert gsm8k.extract_answer("#### " + "1" * 65) is None
    assert gsm8k.extract_answer("#### " + "1" * 64) == "1" * 64
    assert gsm8k.score("#### " + "1" * 64, "1" * 64) == 1.0


@pytest.mark.parametrize("gold", ["#### 3/4", "#### 10-3", "#### 1e5", "#### 2.5.1", "#### 1,5", "#### -",
                                  "#### 12 apples", "#### $", "#### " + "9" * 100, "3/4", "seventy"])
def test_gold_that_is_not_one_plain_number_is_rejected(gold):
    """main read '#### 3/4' as 3 and '#### 10-3' as 10: a wrong gold, silently."""
    assert gsm8k.gold_answer(gold) is None
    with pytest.raises(ValueError, match="does not end in a number"):
        gsm8k.score("#### 3", gold)


def test_gold_row_not_a_plain_number_names_file_and_line(tmp_path):
    good = json.dumps({"question": "q", "answer": "1+1=<<1+1=2>>2\n#### 2"})
    (tmp_path / "train.jsonl").write_text(good + "\n" + json.dumps({"question": "q", "answer": "so\n#### 3/4"}) + "\n")
    with pytest.raises(ValueError, match=r"train.jsonl:2: cannot read a number after '####' in ' 3/4'"):
        gsm8k.load_split(tmp_path, "train")


@pytest.mark.parametrize("gold,canonical", [("#### 72", "72"), ("#### 1,000", "1000"), ("#### -3", "-3"),
                                            ("#### 2.50", "2.5"), ("#### $5", "5"), ("x\n#### 72.", "72"), ("7", "7")])
def test_plain_golds_still_read(gold, canonical):
    assert gsm8k.gold_answer(gold) == canonical
