"""The calculator's arithmetic and the tool API: a table of known results,
argument validation, and a property test against a reference computed by
walking a generated expression tree exactly (Fractions) with a forward error
bound for the float parts."""

import math
from fractions import Fraction
from types import SimpleNamespace

import pytest
from hypothesis import given, settings, strategies as st

from r1.envs import tools
from r1.envs.tools import (CalculatorError, Tool, ToolResult, calculate, evaluate, format_number, get_tool,
                           register_tool, validate_arguments)
from r1.registry import Registry

TABLE = [
    ("48/2", "24"),
    ("48+24", "72"),
    ("1/3", "0.333333333333"),
    ("2/3", "0.666666666667"),
    ("0.2*50", "10"),
    ("12/60", "0.2"),
    ("0.1+0.2", "0.3"),
    ("7/2", "3.5"),
    ("7//2", "3"),
    ("-7//2", "-4"),
    ("7%3", "1"),
    ("-7%3", "2"),
    ("7%-3", "-2"),
    ("7.5%2", "1.5"),
    ("2**10", "1024"),
    ("2**-2", "0.25"),
    ("-2**2", "-4"),
    ("(-2)**2", "4"),
    ("2**3**2", "512"),
    ("2**0.5", "1.41421356237"),
    ("1+2*3", "7"),
    ("(1+2)*3", "9"),
    ("10-4-3", "3"),
    ("100/10/5", "2"),
    ("-3--2", "-1"),
    ("+5", "5"),
    ("--5", "5"),
    ("-(-(-5))", "-5"),
    ("  3 * ( 4 + 5 )  ", "27"),
    ("3.0", "3"),
    ("-0.0", "0"),
    ("0.5", "0.5"),
    (".5+.25", "0.75"),
    ("1.50*2", "3"),
    ("100*1.1", "110"),
    ("123456789.123456789", "123456789.123"),
    ("1e-7", "1e-07"),
    ("0.00001", "0.00001"),
    ("1.5e20", "1.5e+20"),
    ("2**64", "18446744073709551616"),
    ("10**30/10", "100000000000000000000000000000"),
    ("(10**20+1)-10**20", "1"),
    ("99999999*99999999", "9999999800000001"),
    ("1_000+1", "1001"),
    ("0**0", "1"),
    ("3*(2+(4-1))/5", "3"),
    ("1" + "+1" * 255, "256"),
    ("-" * 511 + "1", "-1"),
]


@pytest.mark.parametrize("expression,expected", TABLE)
def test_table(expression, expected):
    result = calculate(expression)
    assert result == ToolResult(expected, ok=True), expression


def test_results_keep_int_and_float_types():
    assert type(evaluate("48/2")) is int
    assert type(evaluate("7/2")) is float
    assert evaluate("10**40/10**20") == 10**20  # exact, a float would lose the low digits
    assert evaluate("10**40//3") == 10**40 // 3


@pytest.mark.parametrize("value,text", [(24, "24"), (-3, "-3"), (0.1 + 0.2, "0.3"), (1 / 3, "0.333333333333"),
                                        (2.5, "2.5"), (1e16, "1e+16"), (123456789012.5, "123456789012"),
                                        (-0.000123, "-0.000123"), (1e-6, "0.000001"), (9.99999999999999e-7, "0.000001"), (9.9e-7, "9.9e-07")])
def test_format_number(value, text):
    assert format_number(value) == text


def test_limits_are_exact_at_the_boundary():
    assert calculate("10**999").ok and len(calculate("10**999").text) == 1000
    assert not calculate("10**999*10").ok
    assert calculate("2**10000").ok is False  # 3011 digits
    assert calculate("1**10000").text == "1"
    assert "exponent" in calculate("1**10001").text
    assert calculate("(" * 32 + "1" + ")" * 32).text == "1"
    assert "nested" in calculate("(" * 33 + "1" + ")" * 33).text
    assert calculate("1" * 512).ok and not calculate("1" * 513).ok


def test_time_limit_is_checked_during_evaluation(monkeypatch):
    ticks = iter(range(100))  # a clock that advances 0.3 s each time the calculator reads it
    monkeypatch.setattr(tools, "time", SimpleNamespace(perf_counter=lambda: 0.3 * next(ticks)))
    assert calculate("1+2+3").text == "error: evaluation took longer than 500 ms"


def test_error_texts_say_what_is_wrong():
    assert calculate("1/0").text == "error: division by zero"
    assert calculate("1%0").text == "error: modulo by zero"
    assert "name 'x'" in calculate("x*2").text
    assert "2**3" in calculate("2^3").text
    assert "1,000" in calculate("1,000").text
    assert "function calls" in calculate("sqrt(4)").text
    with pytest.raises(CalculatorError, match="must be a string"):
        evaluate(3)


# ---------------------------------------------------------------- tool API


def test_calculator_schema_and_call():
    calc = get_tool("calculator")
    assert calc.name == "calculator"
    function = calc.schema["function"]
    assert calc.schema["type"] == "function" and function["name"] == "calculator"
    assert function["parameters"]["required"] == ["expression"]
    assert function["parameters"]["properties"]["expression"]["type"] == "string"
    assert calc({"expression": "48/2"}) == ToolResult("24", ok=True)


@pytest.mark.parametrize("arguments,needle", [
    ({"expression": 48}, "'expression' must be a string, got int"),
    ({"expression": None}, "must be a string, got NoneType"),
    ({"expression": ["1+1"]}, "got list"),
    ({}, "missing required argument 'expression'"),
    ({"expression": "1", "extra": 1}, "unexpected argument 'extra'"),
    ({"expr": "1"}, "missing required argument 'expression'; unexpected argument 'expr'"),
    ("48/2", "arguments must be a JSON object, got str"),
    (None, "got NoneType"),
    ([("expression", "1")], "got list"),
    ({1: "x", "expression": "1"}, "unexpected argument name of type int"),
])
def test_wrong_arguments_are_errors_not_exceptions(arguments, needle):
    result = get_tool("calculator")(arguments)
    assert result.ok is False and result.text.startswith("error: ") and needle in result.text


def test_get_tool_unknown_lists_known():
    with pytest.raises(KeyError, match="unknown tool 'nope'; known tools: .*calculator"):
        get_tool("nope")


def _schema(name, properties, required=()):
    return {"type": "function", "function": {"name": name, "description": "test",
            "parameters": {"type": "object", "properties": properties, "required": list(required)}}}


def test_register_tool(monkeypatch):
    monkeypatch.setattr(tools, "TOOLS", Registry("tool", dict(tools.TOOLS), kind=Tool))
    echo = Tool("echo", _schema("echo", {"text": {"type": "string"}, "times": {"type": "integer"}}, ["text"]),
                fn=lambda text, times=1: ToolResult(text * times, ok=True))
    assert register_tool(echo) is echo
    assert register_tool(echo) is echo  # the same tool again (a module imported twice): no second entry
    assert get_tool("echo")({"text": "ab", "times": 2}) == ToolResult("abab", ok=True)
    assert "must be an integer, got bool" in get_tool("echo")({"text": "a", "times": True}).text
    other = Tool("echo", echo.schema, fn=lambda text, times=1: ToolResult(text, ok=True))
    with pytest.raises(ValueError, match="^tool 'echo' is already registered"):
        register_tool(other)
    assert get_tool("echo") is echo
    register_tool(other, replace=True)
    assert get_tool("echo") is other
    with pytest.raises(TypeError, match="expects a Tool"):
        register_tool("echo")
    with pytest.raises(KeyError, match="calculator, echo"):
        get_tool("nope")


def test_tool_turns_exceptions_into_errors_but_not_wrong_return_types():
    def broken(x):
        raise RuntimeError("boom")

    tool = Tool("broken", _schema("broken", {"x": {"type": "number"}}, ["x"]), fn=broken)
    assert tool({"x": 1}) == ToolResult("error: broken failed: RuntimeError: boom", ok=False)
    bad = Tool("bad", _schema("bad", {}), fn=lambda: "not a ToolResult")
    with pytest.raises(TypeError, match="returned str"):
        bad({})


@pytest.mark.parametrize("schema,match", [
    ({"type": "function"}, "schema must be"),
    (_schema("other", {}), "schema names it 'other'"),
    (_schema("t", {"a": {"type": "array"}}), "property 'a' must have a type"),
    (_schema("t", {}, ["a"]), "required property 'a'"),
])
def test_bad_schemas_are_refused_at_construction(schema, match):
    with pytest.raises(ValueError, match=match):
        Tool("t", schema, fn=lambda: ToolResult("", True))


def test_validate_arguments():
    params = {"type": "object", "required": ["n"],
              "properties": {"n": {"type": "number"}, "k": {"type": "integer"}, "flag": {"type": "boolean"},
                             "mode": {"type": "string", "enum": ["a", "b"]}}}
    assert validate_arguments(params, {"n": 1.5, "k": 2, "flag": False, "mode": "a"}) is None
    assert validate_arguments(params, {"n": 3}) is None
    assert "'n' must be a number, got str" in validate_arguments(params, {"n": "3"})
    assert "'n' must be a number, got float" in validate_arguments(params, {"n": math.inf})
    assert "'k' must be an integer, got float" in validate_arguments(params, {"n": 1, "k": 2.0})
    assert "'flag' must be a boolean, got int" in validate_arguments(params, {"n": 1, "flag": 1})
    assert "'mode' must be one of ['a', 'b']" in validate_arguments(params, {"n": 1, "mode": "c"})
    long_key = "k" * 10_000
    assert len(validate_arguments(params, {"n": 1, long_key: 0})) < 200
    assert validate_arguments({**params, "additionalProperties": True}, {"n": 1, "zzz": 0}) is None
    with pytest.raises(ValueError, match="property 'x' must have a type"):
        validate_arguments({"type": "object", "properties": {"x": {"type": "object"}}}, {})


# ---------------------------------------------------------------- property test against a reference

EPS = 2.0**-52


@st.composite
def int_trees(draw, depth):
    """Integer-valued trees: Python ints are exact, so // and % can be compared exactly."""
    if depth == 0 or draw(st.integers(0, 2)) == 0:
        return ("lit", str(draw(st.integers(0, 10**6))))
    kind = draw(st.sampled_from(["+", "-", "*", "//", "%", "**", "neg"]))
    if kind == "neg":
        return ("neg", draw(int_trees(depth - 1)))
    if kind == "**":
        return ("**", draw(int_trees(depth - 1)), ("lit", str(draw(st.integers(0, 3)))))
    return (kind, draw(int_trees(depth - 1)), draw(int_trees(depth - 1)))


@st.composite
def trees(draw, depth):
    """Trees mixing decimals and true division; divisors are non-zero literals so that the float
    rounding of a subtree can never turn an exact zero divisor into a tiny non-zero one."""
    choice = draw(st.integers(0, 3)) if depth else 0
    if choice == 0:
        if draw(st.booleans()):
            return draw(int_trees(min(depth, 2)))
        whole, frac = draw(st.integers(0, 99999)), draw(st.integers(0, 999))
        return ("lit", f"{whole}.{frac:03d}")
    kind = draw(st.sampled_from(["+", "-", "*", "/", "**", "neg"]))
    if kind == "neg":
        return ("neg", draw(trees(depth - 1)))
    if kind == "/":
        return ("/", draw(trees(depth - 1)), ("lit", str(draw(st.integers(1, 999)))))
    if kind == "**":
        return ("**", draw(trees(depth - 1)), ("lit", str(draw(st.integers(0, 3)))))
    return (kind, draw(trees(depth - 1)), draw(trees(depth - 1)))


def render(tree):
    if tree[0] == "lit":
        return tree[1]
    if tree[0] == "neg":
        return f"-({render(tree[1])})"
    return f"({render(tree[1])}) {tree[0]} ({render(tree[2])})"


def reference(tree):
    """(exact value, bound on the float error of the calculator's value, is_exact_int).
    Raises ZeroDivisionError where the expression divides by zero and OverflowError where
    it leaves the calculator's range (ints of 1000+ digits, floats beyond 1.7e308)."""
    if tree[0] == "lit":
        if "." in tree[1]:
            value = Fraction(tree[1])
            return value, EPS * abs(value), False
        return Fraction(int(tree[1])), 0.0, True
    if tree[0] == "neg":
        value, err, exact = reference(tree[1])
        return -value, err, exact
    op, (a, ea, ia), (b, eb, ib) = tree[0], reference(tree[1]), reference(tree[2])
    if op in ("/", "//", "%") and b == 0:
        raise ZeroDivisionError(op)
    if op == "+":
        value = a + b
    elif op == "-":
        value = a - b
    elif op == "*":
        value = a * b
    elif op == "/":
        value = a / b
    elif op == "//":
        value = a // b
    elif op == "%":
        value = a % b
    else:
        value = a ** int(b)  # the generators only put a literal 0..3 here
    if ia and ib and value.denominator == 1:
        if abs(value) >= 10**1000:
            raise OverflowError("digits")
        return value, 0.0, True
    # a float operation: Python converts an int operand to float first, which overflows past 1.8e308
    if max(abs(a), abs(b), abs(value)) > Fraction(1.7e308):
        raise OverflowError("float")
    fa, fb = float(abs(a)), float(abs(b))
    if op in "+-":
        err = ea + eb
    elif op == "*":
        err = fa * eb + fb * ea + ea * eb
    elif op == "/":
        err = ea / fb
    else:
        n = int(b)
        err = n * (fa + ea) ** max(n - 1, 0) * ea * 1.01
    # the operation rounds once more, and int operands are rounded on conversion
    return value, err + 2 * EPS * (float(abs(value)) + fa + fb), False


def check(tree):
    text = render(tree)
    result = calculate(text)
    try:
        value, err, exact = reference(tree)
    except ZeroDivisionError:
        assert not result.ok and "by zero" in result.text, (text, result)
        return
    except OverflowError:
        assert not result.ok and ("too large" in result.text or "digits" in result.text), (text, result)
        return
    assert result.ok, (text, result)
    if exact:
        assert result.text == str(int(value)), (text, result)
    else:
        tolerance = 2 * err + 1e-11 * float(abs(value)) + 1e-300
        assert abs(float(result.text) - float(value)) <= tolerance, (text, result, float(value), tolerance)


@settings(max_examples=300, deadline=None)
@given(int_trees(4))
def test_random_integer_expressions_match_exact_reference(tree):
    check(tree)


@settings(max_examples=300, deadline=None)
@given(trees(4))
def test_random_mixed_expressions_match_reference_within_error_bound(tree):
    check(tree)
