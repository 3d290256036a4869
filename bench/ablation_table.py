"""The ablation table of a task's lanes (bench/device.py ablate: RESULTS_DIR/TASK), as Markdown, and its curves.

    python bench/ablation_table.py RESULTS_DIR/TASK [RESULTS_DIR/TASK ...] [--png-prefix docs/ablation]

Several RESULTS_DIRs are sets run in different sessions, each with its own SFT policy and recipe lane: one
table with a `set` column (the folder's name), every lane compared with the recipe lane of its own set only
(two SFT runs of the same settings are not bitwise equal on a GPU, docs/decisions.md "Ablation lanes one at a time"), curves one set a file.

One row per lane: iterations run in the shared time, validation accuracy (eval.py, all of the validation
split carved from train: the table picks the next recipe, so it never reads the test split), the paired
comparison with the recipe's lane (r1.compare: gained / lost, McNemar p), and the last logged entropy.
Numbers are copied from the run's files; a lane whose evaluation is missing is listed as such. Then the lane
cost: the recipe lane's median seconds an iteration in its wave against the same config alone (a solo run of
the older shell job, or --solo RUN for a solo run made elsewhere). Last, apart
from the table, the lanes that ablate --test read once on the test split as final recipes.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # r1, for --png-prefix


def _lines(path):
    """The JSON lines of path ([] if there is none); a partial last line (a lane cut off while writing) is left
    out with a warning, any other bad line is a one-line error naming path:line."""
    if not os.path.isfile(path):
        return []
    with open(path) as f:
        text = f.read()
    lines = text.split("\n")
    out = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            if i == len(lines) and not text.endswith("\n"):  # the last line, unfinished
                print(f"warning: {path}:{i}: a partial last line, left out", file=sys.stderr)
                continue
            raise SystemExit(f"error: {path}:{i}: not a JSON line") from None
    return out


def is_recipe(lane: str) -> bool:
    """The recipe's lane: `recipe`, or `recipe-sSEED` when the lanes were run with seeds."""
    return lane == "recipe" or (lane.startswith("recipe-s") and lane[8:].isdigit())


def rows(res: str) -> list:
    lines = _lines(os.path.join(res, "compare.jsonl"))
    compare = {c["ablation"]: c["vs_recipe"] for c in lines if "vs_recipe" in c}
    same_env = {c["ablation"]: c["vs_recipe_same_env"] for c in lines if "vs_recipe_same_env" in c}
    names = sorted(n for n in os.listdir(res) if os.path.isfile(os.path.join(res, n, "metrics.jsonl"))
                   and ".stale-" not in n)  # a lane's folder moved aside by a rerun is not a lane
    names.sort(key=lambda n: not is_recipe(n))
    out = []
    for n in names:
        m = [x for x in _lines(os.path.join(res, n, "metrics.jsonl")) if "reward_mean" in x]
        if n == "sft" and not m:  # the SFT run the lanes start from (the ablate job's), not a lane
            continue
        val = _lines(os.path.join(res, f"val-{n}.json"))
        out.append({"name": n, "iterations": len(m), "val_accuracy": val[-1]["accuracy"] if val else None,
                    "n": val[-1]["n"] if val else None, "entropy": m[-1].get("entropy") if m else None,
                    "vs_recipe": compare.get(n), "vs_recipe_same_env": same_env.get(n)})
    return out


def same_env_lines(table: list) -> list:
    """Lanes whose ablation changes the environment (the ablate job reads the recipe's lane under it too): the
    lane against the recipe's lane read the same way, which is what the lane's training changed."""
    out = []
    for r in table:
        c = r.get("vs_recipe_same_env")
        if c:
            out.append(f"{r['name']}: the recipe's lane read under {r['name']}'s environment {100 * c['acc_a']:.2f}%; "
                       f"the lane against it {c['delta_points']:+.2f} ({c['gained']} / {c['lost']}, p = {c['p']:.2g})")
    return out


PHASES = ("time_rollout", "time_score", "time_train", "time_other")  # an iteration's seconds, as the trainer logs them


def seconds_per_iteration(rows: list, first: int, last: int):
    """Median seconds of iterations first..last (1-based, inclusive) from metrics rows, or None. Iteration 1 is
    left out by callers: it holds CUDA-graph captures and the first compile, which a lane pays whatever its
    neighbours do."""
    its = sorted(r["iter"] for r in rows if first <= r["iter"] <= last)
    if not its:
        return None
    by = {r["iter"]: r for r in rows}
    t = sorted(sum(by[i].get(k, 0.0) for k in PHASES) for i in its)
    return t[len(t) // 2] if len(t) % 2 else (t[len(t) // 2 - 1] + t[len(t) // 2]) / 2


def lane_cost(res: str, solo: str = "") -> str:
    """One line: the recipe lane's median seconds an iteration beside the others against alone, over the same
    iterations (2..the lane's last), or ''. `solo` is a run of the same config alone on the GPU; by default the
    one the older shell job's SOLO made (RES/solo/recipe), which also keeps the lane's memory fraction (a solo run with
    a bigger memory plan mixes that in). Seconds an iteration, not iteration counts: a solo run from
    another session (e.g. the recipe's own run, docs/results/recipe1) ran longer, and its first iterations are
    the ones to set against the lane's."""
    solo = solo or os.path.join(res, "solo", "recipe")
    lane, alone = ([x for x in _lines(os.path.join(p, "metrics.jsonl")) if "reward_mean" in x]
                   for p in (os.path.join(res, "recipe"), solo))
    if len(lane) < 2 or len(alone) < 2:
        return ""
    last = max(r["iter"] for r in lane)
    t_lane, t_alone = seconds_per_iteration(lane, 2, last), seconds_per_iteration(alone, 2, last)
    if not t_lane or not t_alone:  # missing, or runs that logged no phase times
        return ""
    return (f"Lane cost: the recipe's lane took {t_lane:.2f} s an iteration beside the others and {t_alone:.2f} s "
            f"alone ({solo}), medians of iterations 2..{last}: {t_alone / t_lane:.2f} of its speed alone.")


def test_lines(res: str) -> list:
    """The lanes ablate --test read once on the test split (final recipes, not candidates): one line each,
    with the paired comparison against the first named. Kept apart from the table, which never reads test."""
    cmp = {c["test"]: c for c in _lines(os.path.join(res, "test-compare.jsonl"))}
    out = []
    for name in sorted(f[5:-5] for f in os.listdir(res) if f.startswith("test-") and f.endswith(".json")):
        t = _lines(os.path.join(res, f"test-{name}.json"))
        if not t:
            continue
        line = f"{name}: {100 * t[-1]['accuracy']:.2f}% of {t[-1]['n']} test problems"
        if name in cmp:
            c = cmp[name]["result"]
            line += (f", {c['delta_points']:+.2f} points against {cmp[name]['baseline']} "
                     f"({c['gained']} gained / {c['lost']} lost, p = {c['p']:.2g})")
        out.append(line)
    return out


def markdown(table: list, sets: list | None = None) -> str:
    """The table; with `sets` (one name a row), a first column naming each row's set."""
    head = ("| lane | iterations | validation accuracy | vs recipe (gained / lost, p) | entropy, last |\n"
            "| --- | --- | --- | --- | --- |")
    if sets:
        head = "| set " + head.replace("\n", "\n| --- ", 1)
    body = []
    for i, r in enumerate(table):
        acc = "not evaluated" if r["val_accuracy"] is None else f"{100 * r['val_accuracy']:.2f}% of {r['n']}"
        c = r["vs_recipe"]
        vs = "" if c is None else f"{c['delta_points']:+.2f} ({c['gained']} / {c['lost']}, p = {c['p']:.2g})"
        ent = "" if r["entropy"] is None else f"{r['entropy']:.3f}"
        body.append(f"{f'| {sets[i]} ' if sets else ''}| {r['name']} | {r['iterations']} | {acc} | {vs} | {ent} |")
    return "\n".join([head, *body])


def check_set(res: str) -> list:
    """rows(res), or a one-line exit naming the folder: missing, no lanes, or no recipe lane."""
    if not os.path.isdir(res):
        sys.exit(f"error: {res} is not a folder (bench/device.py ablate's RESULTS_DIR/TASK)")
    table = rows(res)
    if not table:
        sys.exit(f"error: no lanes (folders with metrics.jsonl) in {res}")
    if not is_recipe(table[0]["name"]):
        sys.exit(f"error: {res} has no recipe lane (recipe/metrics.jsonl), which every row is compared with: "
                 f"not a task folder of bench/device.py ablate")
    return table


def main(argv=None):
    p = argparse.ArgumentParser(prog="python bench/ablation_table.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", nargs="+", help="bench/device.py ablate's RESULTS_DIR/TASK; several: one set each")
    p.add_argument("--png-prefix", help="write PREFIX_reward.png, PREFIX_val.png, PREFIX_entropy.png "
                   "(several sets: PREFIX_SET_reward.png, ...)")
    p.add_argument("--solo", default="", help="a run of the recipe alone on the GPU, for the lane cost "
                   "(default: RESULTS_DIR/solo/recipe, if an older job made one; one RESULTS_DIR only)")
    a = p.parse_args(argv)
    if a.solo and len(a.results) > 1:
        sys.exit("error: --solo goes with one RESULTS_DIR (several sets: each set's own solo/recipe is used)")
    if a.solo and not os.path.isfile(os.path.join(a.solo, "metrics.jsonl")):
        sys.exit(f"error: --solo {a.solo}: no metrics.jsonl there (a run folder of the recipe alone on the GPU)")
    names = [os.path.basename(os.path.normpath(r)) for r in a.results]
    if len(set(names)) < len(names):
        sys.exit(f"error: two results folders share a name ({', '.join(names)}); the set column would not tell "
                 f"them apart")
    tables = [check_set(r) for r in a.results]
    several = len(a.results) > 1
    print(markdown([r for t in tables for r in t], [n for n, t in zip(names, tables) for _ in t] if several else None))
    same = [(f"{n}: " if several else "") + x for n, t in zip(names, tables) for x in same_env_lines(t)]
    if same:
        print("\nRead under the lane's environment (the recipe's lane too):\n" + "\n".join(f"- {x}" for x in same))
    for res, name in zip(a.results, names):
        cost = lane_cost(res, a.solo)
        if cost:
            print("\n" + (f"{name}: " if several else "") + cost)
    for res, name in zip(a.results, names):
        tests = test_lines(res)
        if tests:
            print(f"\nTest split{f' ({name})' if several else ''}, read once per final recipe (not used to choose):\n"
                  + "\n".join(f"- {x}" for x in tests))
    if a.png_prefix:
        from r1.plot import plot

        for res, name, table in zip(a.results, names, tables):
            runs, prefix = [os.path.join(res, r["name"]) for r in table], a.png_prefix + (f"_{name}" if several else "")
            for key, what, smooth in (("reward_mean", "reward", 5), ("eval_accuracy", "val", 1),
                                      ("entropy", "entropy", 1)):
                try:  # a curve no lane logged (eval.every=0, say) is a note, not the end of the table's command
                    plot(runs, [key], f"{prefix}_{what}.png", smooth=smooth)
                except SystemExit as e:
                    print(f"no {prefix}_{what}.png: {e}", file=sys.stderr)


if __name__ == "__main__":
    main()
