"""GSM8K accuracy by how many calculations the reference solution makes: where a policy wins and loses.

Why: one accuracy number does not say what limits a small model. GSM8K's reference solutions mark each
calculation (`<<48/2=24>>`); their count is a plain, task-given measure of a problem's length. This script
groups eval.py's greedy episodes by it: accuracy, the policy's mean calculator calls, how many wrong answers
made fewer calls than the reference has calculations, and with a baseline evaluation (the SFT policy, say)
the paired gained / lost per group (r1/compare.py). It describes an evaluation; it picks nothing, so reading
a final recipe's test episodes with it does not tune on the test set.

    python bench/gsm8k_calculations.py --config configs/gsm8k_tool.yaml --split test EVAL [--base BASE_EVAL]

EVAL, BASE_EVAL: eval.py's eval.out folders or their episode files (r1/trajectory.py EVAL_FILE). --split
names the split the evaluation read (test, or val with the config's data.val_size), so problem ids find their
reference solutions. Prints a markdown table, then the rows as JSON lines.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from r1.compare import mcnemar  # noqa: E402
from r1.config import load_config  # noqa: E402
from r1.exits import USER_ERRORS, run_main  # noqa: E402
from r1.rollout_stats import traj_stats  # noqa: E402
from r1.tasks.builtin import calculations as difficulty  # noqa: E402
from r1.tasks.data import load_rows  # noqa: E402
from r1.trajectory import load_eval  # noqa: E402

TOP = 7  # problems of TOP or more calculations share the last group


def calculations(rows: list) -> dict:
    """problem id -> the number of calculator annotations in its reference solution (the task's difficulty,
    r1/tasks/builtin.py, which data.rl_max_difficulty reads)."""
    return {r["id"]: difficulty(r) for r in rows}


def episodes(path: str) -> dict:
    """problem id -> (correct, calculator calls) of an evaluation's greedy episodes."""
    return {t.sample_id: (traj_stats(t)["correct"], t.num_tool_calls) for t in load_eval(path)}


def same_problems(split: dict, ev: dict, base: dict | None):
    """Exit with one line unless every evaluated problem is in the split (keyed by problem id) and the
    baseline, if any, evaluated the same problems."""
    for e in (ev, base or {}):
        missing = sorted(set(e) - set(split))
        if missing:
            raise SystemExit(f"error: {len(missing)} evaluated problems are not in this split (first: "
                             f"{missing[0]!r}): is --split the one the evaluation read?")
    if base is not None and set(base) != set(ev):
        raise SystemExit(f"error: the two evaluations are of different problems ({len(set(ev) - set(base))} only in "
                         f"the evaluation, {len(set(base) - set(ev))} only in the baseline): pair evaluations of "
                         f"the same split and eval.limit")


def table(calc: dict, ev: dict, base: dict | None = None) -> list:
    """One row per calculation count (TOP and more together): problems, accuracy, calls, under-calling, and
    against `base` (the same problems) its accuracy, calls and the paired counts."""
    same_problems(calc, ev, base)
    groups = {}
    for k in ev:
        groups.setdefault(min(calc[k], TOP), []).append(k)
    rows = []
    for g in sorted(groups):
        ks = groups[g]
        wrong = [k for k in ks if not ev[k][0]]
        row = {"calculations": f"{g}+" if g == TOP else str(g), "problems": len(ks),
               "accuracy": sum(ev[k][0] for k in ks) / len(ks), "mean_calls": sum(ev[k][1] for k in ks) / len(ks),
               "wrong_with_fewer_calls": (sum(1 for k in wrong if ev[k][1] < calc[k]) / len(wrong)) if wrong else None}
        if base is not None:
            m = mcnemar({k: base[k][0] for k in ks}, {k: ev[k][0] for k in ks})
            row.update(base_accuracy=m["acc_a"], base_mean_calls=sum(base[k][1] for k in ks) / len(ks),
                       gained=m["gained"], lost=m["lost"], p=m["p"])
        rows.append(row)
    return rows


def markdown(rows: list) -> str:
    """The rows as a markdown table, baseline columns beside the evaluation's when there is a baseline."""
    has_base = any("base_accuracy" in r for r in rows)
    head = ["reference calculations", "problems"] + (["baseline accuracy"] if has_base else []) + ["accuracy"] + \
        (["baseline mean calls"] if has_base else []) + \
        ["mean calls", "wrong answers with fewer calls than calculations"] + (["gained / lost (p)"] if has_base else [])
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in rows:
        cells = [r["calculations"], str(r["problems"])]
        if has_base:
            cells.append(f"{100 * r['base_accuracy']:.1f}%")
        cells.append(f"{100 * r['accuracy']:.1f}%")
        if has_base:
            cells.append(f"{r['base_mean_calls']:.2f}")
        under = r["wrong_with_fewer_calls"]
        cells += [f"{r['mean_calls']:.2f}", "" if under is None else f"{100 * under:.0f}%"]
        if has_base:
            cells.append(f"{r['gained']} / {r['lost']} (p = {r['p']:.2g})")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def read_inputs(argv, doc: str, task_ok, reads: str) -> tuple:
    """The command line this script and bench/cli_kinds.py share -> (the split's rows, the evaluation's
    episodes, the baseline's or None); each mistake (a config of another task, a split it has not, a missing
    or damaged file) exits with one line that names it. task_ok(data.task) says whether the task fits;
    `reads` says what the script reads, for that line."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("eval", help="eval.py's eval.out folder, or its episode file")
    p.add_argument("--base", help="a baseline evaluation of the same problems (e.g. the SFT policy's)")
    p.add_argument("--config", required=True, help="the config the evaluation ran with (its data.* keys)")
    p.add_argument("--split", required=True, choices=("test", "val", "train"), help="the split it read")
    a = p.parse_args(argv)
    try:
        cfg = load_config(a.config)
        if not task_ok(cfg.data.task):
            raise SystemExit(f"error: {a.config}: data.task is {cfg.data.task!r}; this script reads {reads}")
        rows = load_rows(cfg, a.split)
    except USER_ERRORS as e:  # a wrong config path, a split the config has not (val without data.val_size)
        raise SystemExit(f"error: {e}") from None
    evals = []
    for path in (a.eval, a.base):
        try:
            evals.append(None if path is None else episodes(path))
        except (OSError, ValueError) as e:  # a wrong path, a damaged file: one line that names it
            raise SystemExit(f"error: {e}" if path in str(e) else f"error: {path}: {e}") from None
    return (rows, *evals)


def report(rows: list, as_markdown) -> list:
    """Print the table (as_markdown(rows)), then each row as a JSON line; return the rows."""
    print(as_markdown(rows))
    for r in rows:
        print(json.dumps(r))
    return rows


def main(argv=None):
    rows, ev, base = read_inputs(argv, __doc__, lambda task: task.startswith("gsm8k"), "GSM8K's reference solutions")
    return report(table(calculations(rows), ev, base), markdown)


if __name__ == "__main__":
    run_main(main)
