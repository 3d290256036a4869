"""Hostile and broken input to the calculator tool.

Every case goes through the tool exactly as a model's call would, and must come
back as ok=False with an error text, within 100 ms, without running any code
(sentinels: a file that would be created, a builtin that would be added) and
without harming the process (recursion limit, a normal call afterwards)."""

import builtins
import os
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

import r1.envs.tools as tools_module
from r1.envs.tools import get_tool

SENTINEL = Path(tempfile.gettempdir()) / f"r1_calculator_sentinel_{os.getpid()}"
S = str(SENTINEL)

INJECTION = [
    f"__import__('os').system('touch {S}')",
    f"open('{S}', 'w')",
    f"exec(\"open('{S}', 'w')\")",
    f"eval(\"open('{S}', 'w')\")",
    "compile('1', '', 'eval')",
    "__builtins__.__dict__.__setitem__('R1_PWNED', 1)",
    "setattr(__builtins__, 'R1_PWNED', 1)",
    "globals()",
    "locals()",
    "vars()",
    "().__class__.__bases__[0].__subclasses__()",
    "(1).__class__",
    "(1).real",
    "__builtins__",
    "[x for x in range(10)]",
    "{x: x for x in range(3)}",
    "(x for x in ())",
    "{1 for _ in ()}",
    "lambda: 1",
    f"(lambda: open('{S}', 'w'))()",
    "f'{1+1}'",
    f"f\"{{__import__('os').system('touch {S}')}}\"",
    "'abc'",
    "b'abc'",
    "[1, 2]",
    "{1: 2}",
    "(1)[0]",
    "1 if 1 else 2",
    "(y := 5)",
    "1 < 2",
    "1 and 2",
    "not 1",
    "~1",
    "2 ^ 3",
    "1 << 100000",
    "1 @ 2",
    "*[1]",
    "x",
    "None",
    "True",
    "...",
    "import os",
    "1; import os",
    "1\nimport os",
]
NON_NUMBERS = ["nan", "inf", "-inf", "float('nan')", "float('inf')", "1e999", "-1e999", "1j", "2+3j"]
HUGE = [
    "9**9**9",
    "10**10**10",
    "99999999**999 * 99999999**999",
    "7**1000 * 7**1000",
    "(10**999)*(10**999)",
    "10**999*10",
    "2**100000",
    "1**(10**100)",
    "10**-100000",
    "1e308*10",
    "1e308+1e308",
    "2.0**10000",
    "10**400 / 3",
    "10**400 * 1.5",
    "10**999 / (1/10**999)",
]
ARITHMETIC = ["1/0", "1//0", "1%0", "1.5/0.0", "0**-1", "5 % (3-3)", "(-8)**0.5", "(-1)**(1/3)", "0.0**-2"]
UNICODE = ["\u0663+\u0664", "\uff11\uff12\uff13", "1\u00a0+1", "\u00b2", "\u2212" + "1", "\U0001d7cf+1", "1\u200b+1"]
BROKEN = [
    "", "   ", "1 +", "(1", "1)", "1\x002", "1,000", "2 3", "48/2=", "=", "1..2", "0x10", "1e", ")(",
    "1" * 10**6,
    "(" * 10_000 + "1" + ")" * 10_000,
    "(" * 33 + "1" + ")" * 33,
    "[" * 10_000 + "1" + "]" * 10_000,
    "-" * 10_000 + "1",
    "1+" * 10_000 + "1",
]
EXPRESSIONS = INJECTION + NON_NUMBERS + HUGE + ARITHMETIC + UNICODE + BROKEN

BAD_ARGUMENTS = [
    None, "48/2", 48, [], [("expression", "1")], {}, {"expression": None}, {"expression": 48},
    {"expression": 1.5}, {"expression": b"48/2"}, {"expression": ["48/2"]}, {"expression": {"a": 1}},
    {"expression": "1", "extra": 1}, {"x" * 10**6: "1"}, {("expression",): "1"},
]


def _call_counted(arguments):
    """Result and work of one call, counted as lines of r1/envs/tools.py executed (sys.settrace):
    a count, not a clock, so a loaded machine cannot fail the test. Every single operation is
    bounded by size before it runs (see the tool's docstring), so the line count bounds the work."""
    source, lines = tools_module.__file__, [0]

    def trace(frame, event, arg):
        if frame.f_code.co_filename != source:
            return None
        if event == "line":
            lines[0] += 1
        return trace

    sys.settrace(trace)
    try:
        result = get_tool("calculator")(arguments)
    finally:
        sys.settrace(None)
    return result, lines[0]


# Line counts are deterministic. Measured here: hostile cases at most 346 lines, bad arguments 36, the valid
# extremes 14,892 ("1+1+...+1", 256 terms); an unbounded loop or a per-digit walk would run millions.
MAX_LINES = 2_000  # a refusal
MAX_LINES_VALID = 50_000  # a valid expression of at most 512 characters


def _ids(values):
    return [repr(v)[:40] for v in values]


@pytest.mark.parametrize("expression", EXPRESSIONS, ids=_ids(EXPRESSIONS))
def test_hostile_expression_is_refused_quickly(expression):
    limit = sys.getrecursionlimit()
    result, work = _call_counted({"expression": expression})
    assert result.ok is False, result
    assert result.text.startswith("error: ") and len(result.text) < 300
    assert work < MAX_LINES, f"{work} lines"
    assert not SENTINEL.exists(), "code ran"
    assert not hasattr(builtins, "R1_PWNED"), "code ran"
    assert sys.getrecursionlimit() == limit
    assert get_tool("calculator")({"expression": "48/2"}).text == "24"


@pytest.mark.parametrize("arguments", BAD_ARGUMENTS, ids=_ids(BAD_ARGUMENTS))
def test_bad_arguments_are_refused_quickly(arguments):
    result, work = _call_counted(arguments)
    assert result.ok is False and result.text.startswith("error: ") and len(result.text) < 300
    assert work < MAX_LINES, f"{work} lines"


def test_there_are_at_least_50_hostile_cases():
    assert len(EXPRESSIONS) + len(BAD_ARGUMENTS) >= 50 and len(set(EXPRESSIONS)) == len(EXPRESSIONS)


def test_valid_but_extreme_inputs_stay_fast():
    for expression, expected in [("-" * 511 + "1", "-1"), ("1" + "+1" * 255, "256"), ("9" * 512, "9" * 512),
                                 ("7**1000", str(7**1000)), ("(" * 32 + "2" + ")" * 32 + "**3321", None)]:
        result, work = _call_counted({"expression": expression})
        assert work < MAX_LINES_VALID, f"{expression[:20]}: {work} lines"
        assert result.ok and (expected is None or result.text == expected), expression


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_random_text_never_raises(text):
    result = get_tool("calculator")({"expression": text})
    assert isinstance(result.text, str) and isinstance(result.ok, bool)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="0123456789+-*/%().e ", max_size=60))
def test_random_arithmetic_text_never_raises(text):
    result = get_tool("calculator")({"expression": text})
    assert result.ok or result.text.startswith("error: ")


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=10), children,
                                                                                        max_size=3),
                    max_leaves=8)


@settings(max_examples=200, deadline=None)
@given(JSON | st.dictionaries(st.sampled_from(["expression", "expr", "x"]), JSON, max_size=3))
def test_random_arguments_never_raise(arguments):
    result = get_tool("calculator")(arguments)
    assert isinstance(result.text, str) and isinstance(result.ok, bool)
