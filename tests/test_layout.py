"""The layout budgets: sizes that keep the project readable, held by the suite.

One test per budget. A change that breaks one fails with a line naming the budget, the offender and
where its text or code belongs instead. The budgets (README.md, "Layout", and docs/decisions.md say
why each file has its job): README.md a page, r1/trainer.py the loop as the algorithm, every r1 file
small enough to read at one sitting, Trainer.iteration one screen, module docstrings what a module
owns (not its measurements), bench/ Python scripts (not shell), docs/results/ small, no import cycle
in r1/, docs/decisions.md a reference rather than a diary, every test asserts. Everything is read
statically (text and ast): nothing is imported or run.
"""
import ast
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MiB = 1 << 20

README_LINES = 250
README_ROW_CHARS = 240  # a table row rendered at 120 columns takes at most 2 lines
TRAINER_LINES = 300
R1_FILE_LINES = 600
ITERATION_LINES = 40
DOCSTRING_LINES = 15
BENCH_SHELL_SCRIPTS = 3
RESULTS_BYTES = 8 * MiB
DECISIONS_LINES = 600

# r1 files over R1_FILE_LINES today: each must be split by what it owns (strict: the test fails once it fits,
# so the entry is removed then)
OVER_BUDGET = {"r1/envs/shell_commands.py", "r1/generate.py", "r1/model.py", "r1/envs/sandbox.py"}


def path(rel):
    return os.path.join(ROOT, rel)


def lines(rel):
    with open(path(rel), encoding="utf-8") as f:
        return f.read().splitlines()


def python_files(*tops):
    out = []
    for top in tops:
        full = path(top)
        if os.path.isfile(full):
            out.append(top)
            continue
        for d, dirs, files in os.walk(full):
            dirs[:] = sorted(x for x in dirs if x != "__pycache__")
            out += [os.path.relpath(os.path.join(d, f), ROOT) for f in sorted(files) if f.endswith(".py")]
    return out


def r1_files():
    return python_files("r1")


# ------------------------------------------------------------------ README


def test_readme_is_a_page():
    n = len(lines("README.md"))
    assert n <= README_LINES, (f"budget README.md <= {README_LINES} lines: it has {n}; move the detail to the docs/ "
                               "page of its topic (docs/*.md) and link it from README.md")


def rendered(row: str) -> str:
    """A markdown table row as a reader sees it: link targets, inline-code ticks and emphasis dropped."""
    row = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", row)
    row = re.sub(r"[`*]", "", row)
    return re.sub(r"\s+", " ", row).strip()


def test_readme_table_rows_take_at_most_two_lines():
    long = [(i, len(rendered(line))) for i, line in enumerate(lines("README.md"), 1)
            if line.lstrip().startswith("|") and len(rendered(line)) > README_ROW_CHARS]
    assert not long, (f"budget README.md table row <= {README_ROW_CHARS} rendered characters (2 lines at 120 "
                      f"columns): " + ", ".join(f"README.md:{i} has {n}" for i, n in long)
                      + "; keep the row to a name and a line, and move the rest to the docs/ page it links")


def test_rendered_row_drops_markup():
    assert rendered("| `r1/a.py` | [the page](docs/a.md), **one** job |") == "| r1/a.py | the page, one job |"


# ------------------------------------------------------------------ r1 code


def test_trainer_is_the_loop():
    n = len(lines("r1/trainer.py"))
    assert n <= TRAINER_LINES, (f"budget r1/trainer.py <= {TRAINER_LINES} lines: it has {n}; move what is not the "
                                "loop to the module that owns it (r1/telemetry.py for metrics, r1/overlap.py for "
                                "the rollout, r1/learner.py for the update, r1/checkpoint.py for saving)")


@pytest.mark.parametrize("rel", [pytest.param(f, marks=pytest.mark.xfail(
    strict=True, reason=f"{f} is over the {R1_FILE_LINES}-line budget today: split it by what it owns"))
    if f in OVER_BUDGET else f for f in r1_files()])
def test_every_r1_file_reads_at_one_sitting(rel):
    n = len(lines(rel))
    assert n <= R1_FILE_LINES, (f"budget r1 file <= {R1_FILE_LINES} lines: {rel} has {n}; split it into files with "
                                "one job each (STYLE: small files, plain names, a shallow tree)")


def test_over_budget_list_names_real_files():
    missing = sorted(f for f in OVER_BUDGET if not os.path.isfile(path(f)))
    assert not missing, f"tests/test_layout.py OVER_BUDGET names files that are gone: {missing}; remove them there"


def function_span(rel, cls, name):
    tree = ast.parse("\n".join(lines(rel)))
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for f in node.body:
                if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and f.name == name:
                    return f.body[0].lineno, f.end_lineno
    raise AssertionError(f"{rel}: no {cls}.{name}; the layout test reads its length (update tests/test_layout.py)")


def test_trainer_iteration_is_one_screen():
    first, last = function_span("r1/trainer.py", "Trainer", "iteration")
    n = last - first + 1
    assert n <= ITERATION_LINES, (f"budget Trainer.iteration <= {ITERATION_LINES} lines: r1/trainer.py:{first}-{last} "
                                  f"is {n}; it reads as the algorithm, so move each phase's detail into a method or "
                                  "the module that owns it (r1/overlap.py, r1/learner.py, r1/telemetry.py)")


def docstring_lines(rel):
    doc = ast.get_docstring(ast.parse("\n".join(lines(rel))), clean=False)
    return None if doc is None else len(doc.strip("\n").splitlines())


DOCSTRING_FILES = python_files("r1", "kernels", "train.py", "eval.py")


@pytest.mark.parametrize("rel", DOCSTRING_FILES)
def test_module_docstring_says_what_the_module_owns(rel):
    n = docstring_lines(rel)
    assert n is not None, f"budget module docstring: {rel} has none; say at its top what it owns and why"
    assert n <= DOCSTRING_LINES, (f"budget module docstring <= {DOCSTRING_LINES} lines: {rel} has {n}; keep what the "
                                  "module owns and why, move measurements to docs/results.md and design reasons to "
                                  "docs/decisions.md")


def test_docstring_budget_sees_the_files():
    assert {"r1/trainer.py", "train.py", "eval.py"} <= set(DOCSTRING_FILES)
    assert any(f.startswith("kernels/") for f in DOCSTRING_FILES)
    assert any(f.startswith("r1/envs/") for f in DOCSTRING_FILES)


# ------------------------------------------------------------------ bench and docs


def test_bench_holds_few_shell_scripts():
    shell = sorted(f for f in os.listdir(path("bench")) if f.endswith(".sh"))
    assert len(shell) <= BENCH_SHELL_SCRIPTS, (
        f"budget bench/ <= {BENCH_SHELL_SCRIPTS} shell scripts: it has {len(shell)} ({', '.join(shell)}); a bench is a "
        "Python script run through bench/device.py (docs/benchmarks.md)")


def test_results_folder_is_small():
    sizes = []
    for d, _, files in os.walk(path("docs/results")):
        sizes += [(os.path.getsize(os.path.join(d, f)), os.path.relpath(os.path.join(d, f), ROOT)) for f in files]
    total = sum(s for s, _ in sizes)
    biggest = ", ".join(f"{f} {s / MiB:.1f} MiB" for s, f in sorted(sizes, reverse=True)[:3])
    assert total <= RESULTS_BYTES, (f"budget docs/results/ <= {RESULTS_BYTES // MiB} MiB: it holds "
                                    f"{total / MiB:.1f} MiB (largest: {biggest}); keep a figure per result "
                                    "docs/results.md cites, and leave raw runs in run folders (bench/results/ holds "
                                    "the numbers)")


def test_decisions_is_a_reference():
    n = len(lines("docs/decisions.md"))
    assert n <= DECISIONS_LINES, (f"budget docs/decisions.md <= {DECISIONS_LINES} lines: it has {n}; keep one section "
                                  "per decision and its reason, move measurements to docs/results.md and how-tos to "
                                  "the docs/ page of their topic")


# ------------------------------------------------------------------ imports


def module_name(rel):
    name = rel[:-3].replace(os.sep, ".")
    return name.removesuffix(".__init__")


def import_graph(files):
    """module -> the r1 modules it imports, at the top or inside a function alike (a lazy import still runs)."""
    mods = {module_name(f): f for f in files}

    def nearest(name):
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name

    graph = {}
    for me, rel in mods.items():
        package = me if rel.endswith("__init__.py") else me.rpartition(".")[0]
        out = set()
        for node in ast.walk(ast.parse("\n".join(lines(rel)))):
            if isinstance(node, ast.Import):
                out |= {nearest(a.name) for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                for a in node.names:  # `from r1 import memory` imports r1.memory; `from r1.algos import grpo` r1.algos
                    sub = f"{base}.{a.name}"
                    out.add(sub if sub in mods else nearest(base))
        graph[me] = {m for m in out if m and m != me}
    return graph


def cycles(graph):
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_cycle_finder_finds_a_lazy_cycle():
    graph = {"r1.a": {"r1.b"}, "r1.b": {"r1.c"}, "r1.c": {"r1.a"}, "r1.d": {"r1.a"}}
    assert cycles(graph) == [["r1.a", "r1.b", "r1.c"]]
    assert cycles({"r1.a": {"r1.b"}, "r1.b": set()}) == []


def test_no_import_cycle_in_r1():
    graph = import_graph(r1_files())
    assert "r1.memory" in graph["r1.trainer"]  # the graph sees `from r1 import memory`
    found = cycles(graph)
    assert not found, ("budget no import cycle in r1/: " + "; ".join(" <-> ".join(c) for c in found)
                       + "; move what both need into a lower module, or pass it in (a registry, an argument)")


# ------------------------------------------------------------------ tests


CHECKS = {"raises", "warns", "approx", "fail", "assert_close", "assert_equal", "assert_allclose", "deprecated_call"}


def called_name(node):
    f = node.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def asserts(fn, helpers) -> bool:
    """An `assert`, a `raise`, pytest.raises / warns / fail, torch.testing's asserts, or a call of a helper of
    tests/ that asserts."""
    def checks(n):
        name = called_name(n) if isinstance(n, ast.Call) else ""
        return isinstance(n, (ast.Assert, ast.Raise)) or name in CHECKS | helpers or name.startswith("assert")
    return any(checks(n) for n in ast.walk(fn))


def is_fixture(fn) -> bool:
    return any("fixture" in ast.unparse(d) for d in fn.decorator_list)


def tests_without_an_assertion():
    trees = {rel: ast.parse("\n".join(lines(rel))) for rel in python_files("tests")}
    funcs = [(rel, n) for rel, tree in trees.items() for n in ast.walk(tree)
             if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    helpers = set()
    for _ in range(3):  # helpers that call helpers that assert
        helpers |= {fn.name for _, fn in funcs if not fn.name.startswith("test") and asserts(fn, helpers)}
    return [f"{rel}:{fn.lineno} {fn.name}" for rel, fn in funcs
            if fn.name.startswith("test") and not is_fixture(fn) and not asserts(fn, helpers)]


def test_every_test_asserts():
    bare = tests_without_an_assertion()
    assert not bare, ("budget every test asserts something: " + ", ".join(bare) + "; a test that cannot fail checks "
                      "nothing: assert what it shows, or remove it if another test covers it")
