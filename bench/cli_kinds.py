"""Command-line task accuracy by request kind: which requests RL learned that SFT left unsolved.

Why: at level 3 the task mixes request kinds the level-2 expert chats show (list_ext, count_lines, largest,
newest, ...) with one they never show (lines_of_largest: the line count of a folder's largest file, two
steps). One accuracy number cannot say whether RL gained on the new kind or polished the old ones. This
groups eval.py's greedy episodes by the kind of request each problem is (the task's own label), with the
paired gained / lost per kind against a baseline evaluation (the SFT policy's; r1/compare.py). It describes an
evaluation and picks nothing.

    python bench/cli_kinds.py --config configs/cli.yaml --split test EVAL [--base BASE_EVAL]

EVAL, BASE_EVAL: eval.py's eval.out folders or their episode files; --split names the split the evaluation
read, so problem ids find their requests. Prints a markdown table, then the rows as JSON lines.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from gsm8k_calculations import read_inputs, report, same_problems  # noqa: E402
from r1.compare import mcnemar  # noqa: E402
from r1.exits import run_main  # noqa: E402


def table(kinds: dict, ev: dict, base: dict | None = None) -> list:
    """One row per request kind, most problems first: problems, accuracy, and against `base` (the same
    problems) its accuracy and the paired counts."""
    same_problems(kinds, ev, base)
    groups = {}
    for k in ev:
        groups.setdefault(kinds[k], []).append(k)
    rows = []
    for kind, ks in sorted(groups.items(), key=lambda g: (-len(g[1]), g[0])):
        row = {"kind": kind, "problems": len(ks), "accuracy": sum(ev[k][0] for k in ks) / len(ks)}
        if base is not None:
            m = mcnemar({k: base[k][0] for k in ks}, {k: ev[k][0] for k in ks})
            row.update(base_accuracy=m["acc_a"], gained=m["gained"], lost=m["lost"], p=m["p"])
        rows.append(row)
    return rows


def markdown(rows: list) -> str:
    """The rows as a markdown table, the baseline's column and the paired counts when there is a baseline."""
    has_base = any("base_accuracy" in r for r in rows)
    head = ["request kind", "problems"] + (["baseline accuracy"] if has_base else []) + ["accuracy"] + \
        (["gained / lost (p)"] if has_base else [])
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in rows:
        cells = [r["kind"], str(r["problems"])] + ([f"{100 * r['base_accuracy']:.1f}%"] if has_base else [])
        cells.append(f"{100 * r['accuracy']:.1f}%")
        if has_base:
            cells.append(f"{r['gained']} / {r['lost']} (p = {r['p']:.2g})")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None):
    rows, ev, base = read_inputs(argv, __doc__, lambda task: task == "cli", "the command-line task's request kinds")
    return report(table({r["id"]: r["kind"] for r in rows}, ev, base), markdown)


if __name__ == "__main__":
    run_main(main)
