"""Tools an agent can call (the `TOOLS` registry), and the calculator, the one tool the tasks need.

A tool is a name, an OpenAI function schema and a function of keyword
arguments returning `ToolResult(text, ok)`. `Tool.__call__` checks the
arguments against the schema first and turns every failure into ok=False text,
because a tool call is model output: one malformed call from one rollout must
become an observation the model can learn from, never an exception that stops
a batch of rollouts.

The calculator evaluates arithmetic without eval/exec/compile: `ast.parse`
(which runs no code), a whitelist of nodes, an iterative evaluator of our
own, and every cost (input size, nesting, integer size, exponents, time)
bounded before it is paid; `evaluate` lists the bounds and the semantics.
"""

import ast
import math
import re
import time
from dataclasses import dataclass
from decimal import Decimal
from typing import Callable

from r1.registry import Registry

MAX_LENGTH = 512
MAX_NESTING = 32
MAX_DIGITS = 1000
MAX_EXPONENT = 10_000
TIME_LIMIT_S = 0.5
SIGNIFICANT_DIGITS = 12

_INT_LIMIT = 10**MAX_DIGITS
_INT_LIMIT_BITS = _INT_LIMIT.bit_length()
_OPERATORS = "numbers, + - * / // % ** and parentheses"


class CalculatorError(ValueError):
    """A bad expression; the message becomes the tool output the model sees."""


# ---------------------------------------------------------------- calculator


def evaluate(expression: str) -> int | float:
    """Value of an arithmetic expression; raises CalculatorError for anything else.

    The calculator evaluates arithmetic without eval/exec/compile: the text is
    parsed with `ast.parse(mode="eval")` (parsing runs no code), every node must be
    on a small whitelist, and the tree is walked by our own iterative evaluator.
    Everything that could cost time or memory is bounded before it is paid for:

        input      <= 512 ASCII characters, checked before anything else
        nesting    <= 32 brackets deep, counted before ast.parse (which itself can
                      die with RecursionError/MemoryError on very deep input)
        integers   < 10**1000 in magnitude, literals and every intermediate; a
                      product or a power is refused from its size estimate before
                      it is computed
        exponents  |exponent| <= 10_000
        floats     must stay finite and real (1e308*10, 1e999, (-8)**0.5 are errors)
        literals   decimal only (no 0x/0o/0b)
        time       500 ms wall clock, checked between node evaluations

    The bounds above keep every single operation in microseconds, so the time
    limit is a last line of defence, not the thing that stops hostile input; it is
    generous because a preempted process on a busy host must not turn a valid
    expression into an error (a reward that depends on machine load).

    Semantics are Python's (// floors, % takes the sign of the divisor), with one
    change: int / int that divides evenly stays an int, so 48/2 prints "24" and
    10**30/10 stays exact. Floats print with 12 significant digits and no trailing
    zeros (1/3 -> "0.333333333333"); a float that rounds to a whole number prints
    as one (0.2*50 -> "10"); magnitudes >= 1e16 or < 1e-6 use exponent notation.
    """
    if not isinstance(expression, str):
        raise CalculatorError(f"expression must be a string, got {type(expression).__name__}")
    # Length first: every later check is linear in it, ast.parse is worse.
    if len(expression) > MAX_LENGTH:
        raise CalculatorError(f"expression is {len(expression)} characters long; the limit is {MAX_LENGTH}")
    if not expression.isascii():
        position, char = next((i, c) for i, c in enumerate(expression) if not c.isascii())
        # Python's parser would read Arabic-Indic or full-width digits as numbers;
        # refusing them keeps "what the model wrote" and "what we computed" identical.
        raise CalculatorError(f"non-ASCII character {char!r} at position {position}; use ASCII digits and operators")
    text = expression.strip()
    if not text:
        raise CalculatorError("expression is empty")
    _check_nesting(text)
    if re.search(r"(?<![\w.])0[xXoObB]", text):
        raise CalculatorError("only decimal numbers are allowed (no 0x, 0o or 0b literals)")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as e:
        raise CalculatorError(f"not a valid arithmetic expression ({e.msg}); use {_OPERATORS}") from None
    except (ValueError, RecursionError, MemoryError, OverflowError) as e:
        raise CalculatorError(f"expression could not be parsed ({type(e).__name__})") from None
    for node in ast.walk(tree):
        _check_node(node)
    return _walk(tree.body, deadline=time.perf_counter() + TIME_LIMIT_S)


def format_number(value: int | float) -> str:
    """Canonical text of a result: ints exact, floats to 12 significant digits."""
    if isinstance(value, int):
        return str(value)
    rounded = float(f"{value:.{SIGNIFICANT_DIGITS}g}")
    if rounded.is_integer() and abs(rounded) < 1e16:
        return str(int(rounded))  # also turns -0.0 into "0"
    if 1e-6 <= abs(rounded) < 1e16:
        return format(Decimal(repr(rounded)), "f")  # positional, repr has no trailing zeros
    return f"{rounded:.{SIGNIFICANT_DIGITS}g}"


def calculate(expression: str) -> "ToolResult":
    """The calculator tool's function: never raises, errors come back as ok=False."""
    try:
        return ToolResult(format_number(evaluate(expression)), ok=True)
    except CalculatorError as e:
        return ToolResult(f"error: {e}", ok=False)


def _check_nesting(text: str) -> None:
    depth = 0
    for char in text:
        if char in "([{":
            depth += 1
            if depth > MAX_NESTING:
                raise CalculatorError(f"brackets are nested more than {MAX_NESTING} deep")
        elif char in ")]}":
            depth -= 1


_ALLOWED = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Constant, ast.Add, ast.Sub, ast.Mult, ast.Div,
            ast.FloorDiv, ast.Mod, ast.Pow, ast.UAdd, ast.USub)
_REFUSED_OPERATORS = {ast.BitXor: "^ (for powers write 2**3)", ast.BitAnd: "&", ast.BitOr: "|",
                      ast.LShift: "<<", ast.RShift: ">>", ast.MatMult: "@", ast.Invert: "~", ast.Not: "not"}
_REFUSED_NODES = {ast.Call: "function calls", ast.Attribute: "attribute access", ast.Subscript: "indexing",
                  ast.Compare: "comparisons", ast.BoolOp: "and/or", ast.Lambda: "lambdas",
                  ast.JoinedStr: "f-strings", ast.ListComp: "comprehensions", ast.SetComp: "comprehensions",
                  ast.DictComp: "comprehensions", ast.GeneratorExp: "comprehensions", ast.IfExp: "if/else",
                  ast.NamedExpr: "assignments", ast.Starred: "starred expressions"}


def _check_node(node: ast.AST) -> None:
    if isinstance(node, ast.Constant):
        value = node.value
        if type(value) is int:
            if abs(value) >= _INT_LIMIT:
                raise CalculatorError(f"a number has more than {MAX_DIGITS} digits")
            return
        if type(value) is float:
            if not math.isfinite(value):
                raise CalculatorError("a number is too large for a float (limit about 1.8e308)")
            return
        if type(value) is complex:
            raise CalculatorError("imaginary numbers are not supported")
        raise CalculatorError(f"only numbers are allowed, got a {type(value).__name__} literal")
    if isinstance(node, _ALLOWED):
        return
    if isinstance(node, ast.Name):
        name = node.id if len(node.id) <= 20 else node.id[:20] + "..."
        raise CalculatorError(f"unknown name {name!r}; use only {_OPERATORS}")
    if isinstance(node, ast.Tuple):
        raise CalculatorError("commas are not allowed (write 1000, not 1,000)")
    if type(node) in _REFUSED_OPERATORS:
        raise CalculatorError(f"operator {_REFUSED_OPERATORS[type(node)]} is not supported")
    what = _REFUSED_NODES.get(type(node), f"{type(node).__name__} expressions")
    raise CalculatorError(f"{what} are not allowed; use only {_OPERATORS}")


def _walk(root: ast.expr, deadline: float) -> int | float:
    # Post-order with an explicit stack: a 255-term sum is 255 levels deep and
    # must not depend on Python's recursion limit or on the caller's stack.
    values: list[int | float] = []
    stack: list[tuple[ast.expr, bool]] = [(root, False)]
    while stack:
        if time.perf_counter() > deadline:
            raise CalculatorError(f"evaluation took longer than {TIME_LIMIT_S * 1000:.0f} ms")
        node, children_done = stack.pop()
        if isinstance(node, ast.Constant):
            values.append(node.value)
        elif not children_done:
            stack.append((node, True))
            if isinstance(node, ast.BinOp):
                stack.append((node.right, False))
                stack.append((node.left, False))
            else:
                stack.append((node.operand, False))
        elif isinstance(node, ast.BinOp):
            right = values.pop()
            left = values.pop()
            values.append(_binary(node.op, left, right))
        else:
            operand = values.pop()
            values.append(-operand if isinstance(node.op, ast.USub) else +operand)
    return values[0]


def _binary(op: ast.operator, a: int | float, b: int | float) -> int | float:
    try:
        if isinstance(op, ast.Add):
            result = a + b
        elif isinstance(op, ast.Sub):
            result = a - b
        elif isinstance(op, ast.Mult):
            # |a| >= 2**(bits_a - 1), so the product is at least 2**(bits_a + bits_b - 2).
            if type(a) is int and type(b) is int and a and b and \
                    a.bit_length() + b.bit_length() - 2 >= _INT_LIMIT_BITS:
                raise CalculatorError(f"result would have more than {MAX_DIGITS} digits")
            result = a * b
        elif isinstance(op, ast.Pow):
            result = _power(a, b)
        elif b == 0:
            raise CalculatorError("division by zero" if isinstance(op, (ast.Div, ast.FloorDiv)) else "modulo by zero")
        elif isinstance(op, ast.Div):
            result = a // b if type(a) is int and type(b) is int and a % b == 0 else a / b
        elif isinstance(op, ast.FloorDiv):
            result = a // b
        else:
            result = a % b
    except OverflowError:
        raise CalculatorError("result is too large for a float (limit about 1.8e308)") from None
    except ZeroDivisionError:
        raise CalculatorError("division by zero") from None
    if isinstance(result, complex):
        raise CalculatorError("result is not a real number")
    if isinstance(result, float) and not math.isfinite(result):
        raise CalculatorError("result is too large for a float (limit about 1.8e308)")
    if isinstance(result, int) and abs(result) >= _INT_LIMIT:
        raise CalculatorError(f"result has more than {MAX_DIGITS} digits")
    return result


def _power(base: int | float, exponent: int | float) -> int | float:
    if abs(exponent) > MAX_EXPONENT:
        raise CalculatorError(f"exponent is too large (the limit is {MAX_EXPONENT})")
    if base == 0 and exponent < 0:
        raise CalculatorError("division by zero (0 to a negative power)")
    if base < 0 and not float(exponent).is_integer():
        raise CalculatorError("a negative number to a fractional power is not a real number")
    if type(base) is int and type(exponent) is int and exponent > 0 and abs(base) >= 2:
        # Estimate the size of the result before paying for it: digits ~ e*log10|b|.
        if exponent * math.log10(abs(base)) > MAX_DIGITS + 1:
            raise CalculatorError(f"result would have more than {MAX_DIGITS} digits")
    return base**exponent


# ---------------------------------------------------------------- tool API


@dataclass(frozen=True)
class ToolResult:
    text: str
    ok: bool


@dataclass(frozen=True)
class Tool:
    """A callable tool: `schema` is the OpenAI function schema, `fn` takes its arguments as keywords."""

    name: str
    schema: dict
    fn: Callable[..., ToolResult]

    def __post_init__(self):
        check_schema(self.schema, self.name)

    @property
    def doc(self) -> str:
        """The schema's description: what the registry lists for this tool."""
        return self.schema["function"].get("description", "")

    def __call__(self, arguments: dict) -> ToolResult:
        error = validate_arguments(self.schema["function"]["parameters"], arguments)
        if error is not None:
            return ToolResult(f"error: {error}", ok=False)
        try:
            result = self.fn(**arguments)
        except Exception as e:  # the model's bad call is an observation, not a crashed batch
            # The exception's text may quote the arguments (a 16 KB string): a bounded prefix of it.
            text = str(e)
            if len(text) > MAX_QUOTE:
                text = f"{text[:MAX_QUOTE]}... ({len(text) - MAX_QUOTE} more characters)"
            return ToolResult(f"error: {self.name} failed: {type(e).__name__}: {text}", ok=False)
        if not isinstance(result, ToolResult):
            raise TypeError(f"tool {self.name!r} returned {type(result).__name__}, expected ToolResult")
        return result


MAX_PROBLEMS = 4  # argument problems named in one error; the rest are counted
MAX_QUOTE = 200  # characters of an exception's text quoted in a tool's error

_JSON_TYPES = {"string": "a string", "number": "a number", "integer": "an integer", "boolean": "a boolean"}


def check_schema(schema: dict, name: str) -> None:
    """Raise ValueError unless `schema` is an OpenAI function schema in the subset we validate."""
    function = schema.get("function") if isinstance(schema, dict) else None
    if not isinstance(schema, dict) or schema.get("type") != "function" or not isinstance(function, dict):
        raise ValueError(f"tool {name!r}: schema must be {{'type': 'function', 'function': {{...}}}}")
    if function.get("name") != name:
        raise ValueError(f"tool {name!r}: schema names it {function.get('name')!r}")
    _check_parameters(function.get("parameters"), f"tool {name!r}")


def _check_parameters(parameters: dict, where: str) -> None:
    if not isinstance(parameters, dict) or parameters.get("type") != "object":
        raise ValueError(f"{where}: parameters must be a schema of type 'object'")
    properties = parameters.get("properties", {})
    for key, prop in properties.items():
        if not isinstance(prop, dict) or prop.get("type") not in _JSON_TYPES:
            raise ValueError(f"{where}: property {key!r} must have a type in {sorted(_JSON_TYPES)}")
    for key in parameters.get("required", []):
        if key not in properties:
            raise ValueError(f"{where}: required property {key!r} is not in properties")


def validate_arguments(schema: dict, arguments: dict) -> str | None:
    """Error text if `arguments` do not fit the parameters `schema`, else None.

    The subset: an object with properties of type string/number/integer/boolean
    (optionally an enum), `required`, and no other keys unless
    additionalProperties is true. Messages name keys and types, never values,
    so a 1 MB argument cannot become a 1 MB observation; at most MAX_PROBLEMS
    are named (the rest counted), so neither can 3,000 unexpected keys.
    """
    _check_parameters(schema, "parameters schema")
    if not isinstance(arguments, dict):
        return f"arguments must be a JSON object, got {type(arguments).__name__}"
    properties = schema.get("properties", {})
    problems = []
    for key in schema.get("required", []):
        if key not in arguments:
            problems.append(f"missing required argument {key!r}")
    for key, value in arguments.items():
        if key not in properties:
            if schema.get("additionalProperties") is not True:
                problems.append(f"unexpected argument {_short_name(key)} (expected: {', '.join(properties)})")
            continue
        want = properties[key]["type"]
        if not _has_type(value, want):
            problems.append(f"argument {key!r} must be {_JSON_TYPES[want]}, got {type(value).__name__}")
        elif "enum" in properties[key] and value not in properties[key]["enum"]:
            problems.append(f"argument {key!r} must be one of {properties[key]['enum']}")
    if len(problems) > MAX_PROBLEMS:
        problems = problems[:MAX_PROBLEMS] + [f"and {len(problems) - MAX_PROBLEMS} more problems"]
    return "; ".join(problems) if problems else None


def _short_name(key) -> str:
    if not isinstance(key, str):  # only programmatic callers; JSON keys are strings
        return f"name of type {type(key).__name__}"
    return repr(key) if len(key) <= 40 else repr(key[:40]) + "..."


def _has_type(value, want: str) -> bool:
    if want == "string":
        return isinstance(value, str)
    if want == "boolean":
        return isinstance(value, bool)
    if isinstance(value, bool):  # bool is an int subclass; JSON keeps them apart
        return False
    if want == "integer":
        return isinstance(value, int)
    return isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))


CALCULATOR = Tool(
    name="calculator",
    schema={
        "type": "function",
        "function": {
            "name": "calculator",
            "description": ("Evaluate an arithmetic expression and return the number. Supports + - * / "
                            "// (floor division) % (remainder) ** (power), parentheses, integers and decimals."),
            "parameters": {
                "type": "object",
                "properties": {
                    "expression": {"type": "string",
                                   "description": "The expression, for example \"(48 + 24) / 2\"."},
                },
                "required": ["expression"],
            },
        },
    },
    fn=calculate,
)

TOOLS = Registry("tool", {CALCULATOR.name: CALCULATOR}, kind=Tool)


def register_tool(tool: Tool, replace: bool = False) -> Tool:
    """TOOLS.register under tool.name, so get_tool finds it; a second tool of the same name needs replace=True."""
    if not isinstance(tool, Tool):
        raise TypeError(f"register_tool expects a Tool, got {type(tool).__name__}")
    return TOOLS.register(tool.name, tool, replace)


def get_tool(name: str) -> Tool:
    if name not in TOOLS:
        raise KeyError(f"unknown tool {name!r}; known tools: {', '.join(sorted(TOOLS))}")
    return TOOLS[name]


def resolve_tool(spec: str) -> str:
    """A config's tool entry -> a registered tool name: a registered name, or `package.module:attr`
    (attr a Tool, registered here; its module may register others on import). ValueError names the
    closest known tools."""
    if ":" in spec:
        from r1.plugins import import_attr

        tool = import_attr(spec, "env.tools entry")
        if not isinstance(tool, Tool):
            raise ValueError(f"env.tools entry {spec!r} is a {type(tool).__name__}, not an r1.envs.tools.Tool")
        if TOOLS.get(tool.name) is not tool:
            register_tool(tool, replace=True)
        return tool.name
    if spec not in TOOLS:
        import difflib

        close = difflib.get_close_matches(spec, TOOLS, n=3, cutoff=0.5)
        hint = f"did you mean {', '.join(close)}? " if close else ""
        raise ValueError(f"unknown tool {spec!r} in env.tools; {hint}known: {', '.join(sorted(TOOLS))} "
                         f"(or package.module:attr for your own)")
    return spec
