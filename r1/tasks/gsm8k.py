"""GSM8K: loading, prompts, answer extraction, reward, and expert tool-use chats.

Rows are `{"id", "question", "answer", "solution"}`: `answer` a canonical number string ("72", "-3",
"2.5"), `solution` the raw GSM8K answer with its `<<48/2=24>>` calculator annotations and `#### 72`.
The model ends with `#### <number>`, as GSM8K's own solutions do. `extract_answer` reads the number after
the last `####`, else the last `\\boxed{...}`; the last number in the text only when asked
(`fallback_last_number=True`), because as a reward it pays a lucky number and hides a broken format.
`expert_messages` turns a solution into the tool-use chat SFT imitates: each annotation becomes one
assistant turn (reasoning, then one calculator call) and one tool turn whose content comes from running
our calculator, so the chat shows exactly what the environment returns. Loading reads the
grade-school-math jsonl files (plain or gzipped, as shipped in data/gsm8k) or the Hugging Face parquet
layout (needs pyarrow).
"""

import json
import os
import re
import warnings
from decimal import Decimal
from pathlib import Path

from r1.bounded import check_file, confined, text_lines
from r1.envs.tools import get_tool

TOOL_SYSTEM_PROMPT = (
    "You solve grade-school math word problems step by step. You have a calculator tool: for every "
    "arithmetic step, call it with an expression such as 48/2 or (12+3)*4 and use the number it returns. "
    "When you are done, write the final answer on the last line as '#### <number>', for example '#### 72'."
)
PLAIN_SYSTEM_PROMPT = (
    "You solve grade-school math word problems. Reason step by step, then write the final answer "
    "on the last line as '#### <number>', for example '#### 72'."
)

# A number as people write it: optional sign and $ in either order, thousands
# commas, decimals. The look-behind keeps "10-3" from reading as "-3".
# Linear time on any text: the gaps around `$` are at most 8 blanks and
# possessive (`{0,8}+`, no backtracking; `\s*\$?\s*` was quadratic on a
# run of spaces, cubic with finditer), and the digit alternatives cannot
# both match the same prefix (a thousands group needs a comma).
_GAP = r"[ \t\u00a0]{0,8}+"
_NUMBER = (r"(?<![\w.])([-+\u2212]?)" + _GAP + r"(?:\$" + _GAP + r")?([-+\u2212]?)"
           r"((?:\d{1,3}(?:,\d{3})++|\d++)(?:\.\d*+)?|\.\d++)")
_NUMBER_RE = re.compile(_NUMBER)
# Size caps: model output is read from its last MAX_TEXT characters (the
# answer is at the end), and a number longer than MAX_DIGITS digits is not an
# answer (Python refuses int() beyond 4300 digits; no GSM8K answer has 20).
MAX_TEXT = 100_000
MAX_DIGITS = 64
_ANNOTATION_RE = re.compile(r"<<([^<>]*)>>")
_LATEX_NOISE = ("\\$", "\\,", "\\!", "{,}", "\\left", "\\right")


# ---------------------------------------------------------------- answers


def normalize_number(text: str) -> str | None:
    """Canonical form of one written number ("$1,234.00" -> "1234", "-2.50" -> "-2.5"), or None."""
    match = _NUMBER_RE.fullmatch(text.strip())
    return _canonical(match) if match else None


def extract_answer(text: str, fallback_last_number: bool = False) -> str | None:
    """The final answer in `text` as a canonical number string, or None (see the module docstring)."""
    if not isinstance(text, str):
        raise TypeError(f"extract_answer expects a str, got {type(text).__name__}")
    text = text[-MAX_TEXT:]
    if "####" in text:
        after = text.rsplit("####", 1)[1].lstrip(" \t\r\n*:")
        match = _NUMBER_RE.match(after)
        return _canonical(match) if match else None
    boxed = _last_boxed(text)
    if boxed is not None:
        for noise in _LATEX_NOISE:
            boxed = boxed.replace(noise, "," if noise == "{,}" else "")
        match = _NUMBER_RE.match(boxed.strip())
        return _canonical(match) if match else None
    if fallback_last_number:
        last = None
        for last in _NUMBER_RE.finditer(text):
            pass
        return _canonical(last) if last else None
    return None


def gold_answer(gold: str) -> str | None:
    """A gold answer ("72", "1,000", or a solution ending "#### 72") as a canonical number, or None.

    Stricter than extract_answer: everything after the last `####` must be
    one number ("#### 3/4", "#### 10-3", "#### 1e5" are None, not 3, 10, 1),
    because a gold misread as another number silently teaches wrong answers.
    """
    if not isinstance(gold, str):
        return None
    tail = gold.rsplit("####", 1)[1] if "####" in gold else gold
    return normalize_number(tail.strip(" \t\r\n*:"))


def score(text: str, gold: str, fallback_last_number: bool = False) -> float:
    """1.0 if the answer in `text` equals `gold` within 1e-6, else 0.0.

    `gold` is a number ("72", "1,000") or a whole GSM8K solution ending in "#### 72".
    """
    gold_value = gold_answer(gold)
    if gold_value is None:
        raise ValueError(f"gold answer {str(gold)[-60:]!r} does not end in a number (one plain number after ####)")
    if not isinstance(text, str):
        return 0.0  # a reward never raises on model output: it just is not an answer
    answer = extract_answer(text, fallback_last_number=fallback_last_number)
    if answer is None:
        return 0.0
    return 1.0 if abs(Decimal(answer) - Decimal(gold_value)) <= Decimal("1e-6") else 0.0


def _canonical(match: re.Match) -> str:
    sign1, sign2, digits = match.groups()
    digits = digits.replace(",", "").rstrip(".")
    if sum(c.isdigit() for c in digits) > MAX_DIGITS:
        return None
    value = Decimal(digits or "0")
    if (sign1 + sign2).replace("\u2212", "-").count("-") % 2:
        value = -value
    if value == value.to_integral_value():
        return str(int(value))  # also maps "-0" and "72.00" to "0" and "72"
    return format(value.normalize(), "f")


def _last_boxed(text: str) -> str | None:
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, begin = 0, start + len("\\boxed{")
    for i in range(begin, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth < 0:
            return text[begin:i]
    return text[begin:]


# ---------------------------------------------------------------- loading

# Read caps (r1/bounded.py): GSM8K's train split is 4.2 MB of text (7,473 rows), its longest row 1.7 KB; a
# task file is held whole in memory as rows, so 256 MiB of text per file (60 times GSM8K train), 1 MiB a
# row, and 1,000,000 rows (the largest public math sets have under 900,000; a million short rows are about
# 1 GB as dicts, where 256 MiB of 35-byte rows would be 8 GB). A 3 MB .jsonl.gz that inflates without limit
# stops at the first of these, as one error naming the file.
MAX_FILE = 256 << 20
MAX_ROW = 1 << 20
MAX_ROWS = 1_000_000


def load_split(path_or_dir: str | Path, split: str, skip_bad: bool = False) -> list[dict]:
    """Rows of one split from a directory holding either layout, or from one jsonl/parquet file
    (then `split` only names the ids, "gsm8k-<split>-<index>").

    A row with a missing field or no readable `#### <number>` raises ValueError
    naming the file and line; with skip_bad=True such rows are skipped and one
    warning reports how many.
    """
    files = _split_files(Path(path_or_dir), split)
    rows, bad, index = [], [], 0
    for path in files:
        for where, record in _read_parquet(path) if path.suffix == ".parquet" else _read_jsonl(path):
            try:
                rows.append(_make_row(record, f"gsm8k-{split}-{index}"))
            except ValueError as e:
                if not skip_bad:
                    raise ValueError(f"{where}: {e}") from None
                bad.append(f"{where}: {e}")
            index += 1  # ids follow the source order even when rows are skipped
    if bad:
        warnings.warn(f"skipped {len(bad)} bad rows of {len(bad) + len(rows)} in split {split!r}; first: {bad[0]}")
    if not rows:  # an empty file would fail later, deep in the trainer, with a division by zero
        raise ValueError(f"GSM8K split {split!r} in {', '.join(map(str, files))} has no usable rows")
    return rows


def _split_files(root: Path, split: str) -> list[Path]:
    if root.is_file():
        return [root]
    if not root.is_dir():
        raise FileNotFoundError(f"GSM8K data not found: {root} is neither a file nor a directory")
    for candidates in ([root / f"{split}.jsonl"], [root / f"{split}.jsonl.gz"],
                       sorted((root / "main").glob(f"{split}-*.parquet")),
                       sorted(root.glob(f"{split}-*.parquet"))):
        found = [path for path in candidates if os.path.lexists(path)]
        if found:  # a link out of data.path is refused; a FIFO or device among them is refused when opened
            return [path for path in found if confined(root, path, "GSM8K file")]
    raise FileNotFoundError(f"no GSM8K split {split!r} in {root}: looked for {split}.jsonl, {split}.jsonl.gz, "
                            f"main/{split}-*.parquet and {split}-*.parquet")


def _read_jsonl(path: Path):
    rows = 0
    for line_no, line in text_lines(path, MAX_ROW, MAX_FILE, "GSM8K file"):
        if not line.strip():
            continue
        rows += 1
        if rows > MAX_ROWS:
            raise ValueError(f"GSM8K file {path} has more than {MAX_ROWS} rows, the most this reads; refusing to "
                             f"read further")
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            record = ValueError(f"invalid JSON ({e.msg})")
        yield f"{path}:{line_no}", record


def _read_parquet(path: Path):
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ImportError(f"reading {path} needs pyarrow (pip install pyarrow); "
                          "or point at the openai/grade-school-math jsonl files") from None
    check_file(path, MAX_FILE, "GSM8K file")
    for row_no, record in enumerate(pq.read_table(path).to_pylist()):
        yield f"{path}: row {row_no}", record


def _make_row(record, row_id: str) -> dict:
    if isinstance(record, ValueError):
        raise record
    if not isinstance(record, dict):
        raise ValueError(f"expected a JSON object, got {type(record).__name__}")
    for field in ("question", "answer"):
        if not isinstance(record.get(field), str) or not record[field].strip():
            raise ValueError(f"field {field!r} is missing or not a non-empty string")
    if "####" not in record["answer"]:
        raise ValueError("answer has no '#### <number>' line")
    answer = gold_answer(record["answer"])
    if answer is None:
        raise ValueError(f"cannot read a number after '####' in {record['answer'].rsplit('####', 1)[1][:40]!r} "
                         f"(expected one plain number)")
    return {"id": row_id, "question": record["question"], "answer": answer, "solution": record["answer"]}


# ---------------------------------------------------------------- prompts and expert chats


def make_prompt(row: dict, tools: bool, system_prompt: str | None = None) -> list[dict]:
    """The opening messages of an episode: system prompt and the question."""
    system = system_prompt if system_prompt is not None else (TOOL_SYSTEM_PROMPT if tools else PLAIN_SYSTEM_PROMPT)
    return [{"role": "system", "content": system}, {"role": "user", "content": row["question"]}]


def calculator_calls(solution: str) -> list[tuple[str, str]]:
    """(expression, annotated result) for each <<expression=result>> annotation in `solution`."""
    calls = []
    for match in _ANNOTATION_RE.finditer(solution):
        expression, _, result = match.group(1).rpartition("=")
        calls.append((expression.strip(), result.strip()) if expression else (result.strip(), ""))
    return calls


def expert_messages(row: dict, tools: bool = True, system_prompt: str | None = None) -> list[dict]:
    """A full chat for SFT: prompt, then the solution as calculator-using turns, ending in '#### answer'.

    With tools=False the annotations are dropped and the solution is one assistant turn.
    """
    messages = make_prompt(row, tools, system_prompt)
    body = row["solution"].rsplit("####", 1)[0]  # the answer line is rewritten in canonical form below
    if not tools:
        body, annotations = _ANNOTATION_RE.sub("", body), []
    else:
        annotations = list(_ANNOTATION_RE.finditer(body))
    calculator = get_tool("calculator")
    start = 0
    for match, (expression, _) in zip(annotations, calculator_calls(body)):
        call = {"type": "function", "function": {"name": "calculator", "arguments": {"expression": expression}}}
        messages.append({"role": "assistant", "content": body[start:match.start()].strip(), "tool_calls": [call]})
        messages.append({"role": "tool", "name": "calculator", "content": calculator({"expression": expression}).text})
        start = match.end()
    rest = body[start:].strip()
    messages.append({"role": "assistant", "content": (rest + "\n" if rest else "") + f"#### {row['answer']}"})
    return messages
