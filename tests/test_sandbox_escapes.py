"""What escapes the CLI sandbox, plug-ins and the working directory, and tool observations, must not.

Each test names the case of docs/reliability.md's tables it checks. A stall is bounded by CPU time
(resource.RLIMIT_CPU in a child process, or time.process_time), never by wall time.
"""
import importlib
import os
import sys
import textwrap

import pytest

from r1.plugins import import_attr

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMOKE = os.path.join(ROOT, "configs", "smoke.yaml")


# ================================================================ plug-ins and the working directory


@pytest.fixture
def clean_path(monkeypatch):
    """sys.path and sys.modules as they were after the test: an appended folder does not leak."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        if name.startswith("r1probe_"):
            del sys.modules[name]


def test_a_module_in_the_working_directory_does_not_shadow_an_installed_one(tmp_path, monkeypatch, clean_path):
    installed, work = tmp_path / "site", tmp_path / "work"
    installed.mkdir()
    work.mkdir()
    for name in ("r1probe_shadow", "r1probe_later"):
        (installed / f"{name}.py").write_text("WHO = 'installed'\n")
        (work / f"{name}.py").write_text("WHO = 'working directory'\n")
    (work / "r1probe_beside.py").write_text("WHO = 'beside'\n")
    monkeypatch.syspath_prepend(str(installed))
    monkeypatch.chdir(work)
    assert import_attr("r1probe_beside:WHO", "data.task") == "beside"  # a module beside the command imports
    assert import_attr("r1probe_shadow:WHO", "data.task") == "installed"
    assert importlib.import_module("r1probe_later").WHO == "installed"  # later imports are not shadowed either
    assert sys.path[0] != str(work) and sys.path[-1] == str(work)


def test_json_py_in_the_working_directory_is_not_imported(tmp_path, monkeypatch, clean_path):
    (tmp_path / "json.py").write_text("raise SystemExit('the working directory json.py was imported')\n")
    (tmp_path / "r1probe_task.py").write_text("import json\nX = json.dumps([1])\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "json")  # as in a process that has not imported it yet
    assert import_attr("r1probe_task:X", "data.task") == "[1]"


@pytest.mark.parametrize("spec", [".x:TASK", "..pkg.mod:TASK", "./x.py:TASK", "x/y:TASK", "a..b:TASK", "x.:T"])
def test_relative_or_path_specs_are_one_value_error(spec, clean_path):
    with pytest.raises(ValueError) as e:
        import_attr(spec, "data.task")
    assert repr(spec) in str(e.value) and "\n" not in str(e.value)


def test_a_relative_data_task_is_a_config_error():
    from r1.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"'\.x:TASK'.*relative"):
        load_config(SMOKE, ["data.task=.x:TASK"])


# ================================================================ tool observations


class _Tok:  # what ToolEnv reads of a tokenizer
    special_tokens, stop_ids = (), ()


def _env(tools=("calculator",), max_context=2048):
    from r1.envs.tool_env import ToolEnv

    env = ToolEnv(_Tok(), lambda sample, tools: [{"role": "user", "content": "q"}], lambda text, answer: 0.0,
                  tools=tools, max_context=max_context, max_new_tokens=256)
    env.reset({"question": "q", "answer": "1"})
    return env


def _step(env, body: str):
    from r1.envs.base import Action

    obs, _, _, info = env.step(Action(ids=[], text=f"<tool_call>{body}</tool_call>"))
    return sum(len(m["content"]) for m in obs.messages), obs, info


def test_an_error_observation_does_not_grow_with_the_call():
    """One 16 KB call of 1,700 unexpected keys was a 90 KB observation (one problem named per key)."""
    import json

    from r1.envs.tool_env import MAX_CALL_CHARS, MAX_ERROR_CHARS

    args = {f"k{i}": 1 for i in range(1700)}
    body = json.dumps({"name": "calculator", "arguments": args}, separators=(",", ":"))
    assert len(body) <= MAX_CALL_CHARS
    size, obs, info = _step(_env(), body)
    assert info["errors"] == ["bad_arguments"] and size <= MAX_ERROR_CHARS
    assert "and 1697 more problems" in obs.messages[0]["content"]
    # every other kind of error stays bounded too, whatever the call's size
    for body in ['{"name": "' + "n" * 15000 + '", "arguments": {}}', "[" * 16000, "{" + "x" * 16000,
                 '{"name": "calculator", "arguments": {"expression": "' + "1+" * 7000 + '1"}}']:
        size, _, info = _step(_env(), body)
        assert size <= MAX_ERROR_CHARS, (body[:30], size, info)


def test_a_tool_failure_quotes_a_bounded_prefix_of_its_exception():
    from r1.envs.tools import MAX_QUOTE, Tool

    schema = {"type": "function", "function": {"name": "boom", "parameters": {
        "type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}}

    def boom(text):
        raise ValueError(f"cannot use {text}")
    result = Tool("boom", schema, boom)({"text": "x" * 16000})
    assert not result.ok and len(result.text) < MAX_QUOTE + 100 and "more characters" in result.text


def test_a_megabyte_tool_result_is_cut_before_it_is_tokenised():
    from r1.envs.tool_env import RESULT_CHARS_PER_TOKEN
    from r1.envs.tools import Tool, ToolResult

    schema = {"type": "function", "function": {"name": "dump", "parameters": {"type": "object", "properties": {}}}}
    text = "HEAD " + "word " * 1_000_000 + " TAIL"  # 5 MB
    Tool_ = Tool("dump", schema, lambda: ToolResult(text, True))
    from r1.envs import tools as tools_module

    tools_module.register_tool(Tool_, replace=True)
    env = _env(tools=("dump",), max_context=1024)
    size, obs, info = _step(env, '{"name": "dump", "arguments": {}}')
    content = obs.messages[0]["content"]
    assert info["errors"] == [] and size <= RESULT_CHARS_PER_TOKEN * 1024 + 200
    assert content.startswith("HEAD word") and content.endswith("word  TAIL") and "[tool result cut: " in content
    small = "x" * 100  # a result that fits is passed unchanged
    tools_module.register_tool(Tool("dump", schema, lambda: ToolResult(small, True)), replace=True)
    assert _step(_env(tools=("dump",)), '{"name": "dump", "arguments": {}}')[1].messages[0]["content"] == small
    del tools_module.TOOLS["dump"]


# ================================================================ the CLI sandbox: regular expressions

_CPU_CHILD = textwrap.dedent('''
    import resource, sys, time
    resource.setrlimit(resource.RLIMIT_CPU, (int(sys.argv[3]), int(sys.argv[3]) + 1))
    sys.path.insert(0, sys.argv[1])
    from r1.envs.sandbox import Sandbox
    t = time.process_time()
    r = Sandbox(sys.argv[2]).run(sys.stdin.read())
    print(repr((r.ok, r.refused, r.text[:300], time.process_time() - t)))
''')


def _run_cpu_bounded(root, command: str, cpu_s: int = 20):
    """(ok, refused, text, CPU seconds) of one sandbox command run in a child under RLIMIT_CPU: a stall is
    killed by SIGXCPU (a non-zero exit) instead of hanging the test."""
    import ast
    import subprocess

    p = subprocess.run([sys.executable, "-c", _CPU_CHILD, ROOT, str(root), str(cpu_s)], input=command,
                       capture_output=True, text=True)
    assert p.returncode == 0, f"{command!r}: the child was killed after {cpu_s} s of CPU (rc {p.returncode})"
    return ast.literal_eval(p.stdout.strip().splitlines()[-1])


REDOS = {
    "alternation_fixed_count": "grep -E '(a|aa){40}b' a.txt",
    "alternation_sequence": "grep -E '" + "(a|aa)" * 40 + "b' a.txt",
    "alternation_sequence_bre": "grep '" + "\\(a\\|aa\\)" * 40 + "b' a.txt",
    "variable_inside_fixed_count": "grep -E '(a*){20}b' a.txt",
    "optional_inside_fixed_count": "grep -E '(a?){40}a{40}b' a.txt",
    "bre_interval": "grep '\\(a*\\)\\{20\\}b' a.txt",
    "many_optionals": "grep -E '" + "a?" * 60 + "a" * 60 + "b' a.txt",
    "fixed_counts_multiply": "grep -E '((a.){255}){100}b' c.txt",
    "long_pattern_long_line": "grep -E '" + "a." * 1900 + "b' e.txt",
    "several_fixed_strings": "grep -F -e " + "a" * 3000 + "b -e x e.txt",
    "fixed_string_ignoring_case": "grep -i " + "a" * 3000 + "b e.txt",
}


@pytest.fixture(scope="module")
def redos_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("redos")
    (root / "a.txt").write_text(("a" * 120 + "\n") * 50 + "a" * 20_000 + "\n")
    (root / "b.txt").write_text("a line\nanother line\nnone\n")
    (root / "c.txt").write_text("a" * 150_000 + "\n")
    (root / "e.txt").write_text("a" * 3_999_999 + "\n")  # the most the sandbox reads of one file
    return root


@pytest.mark.parametrize("command", list(REDOS.values()), ids=list(REDOS))
def test_grep_patterns_that_backtrack_are_refused_in_bounded_cpu(redos_root, command):
    ok, refused, text, cpu = _run_cpu_bounded(redos_root, command)
    assert not ok and not refused and (text.startswith("grep: ") or text.startswith("stopped: ")), text
    assert "\n" not in text and cpu < 5, (text, cpu)


def test_patterns_grep_users_write_still_run(redos_root):
    from r1.envs.sandbox import Sandbox

    sb = Sandbox(redos_root)
    for command, expected in [("grep -c 'a\\{3\\}' a.txt", "51"), ("grep -cE '^(a|b)+$' a.txt", "51"),
                              ("grep -cE 'a{2,5}b|c' a.txt", "0"), ("grep -cE '(ab|cd)[0-9]{2}' a.txt", "0"),
                              ("grep -c '.*a.*' b.txt", "2"), ("grep -cE -e x -e y -e 'a?b' a.txt", "0")]:
        r = sb.run(command)
        assert r.ok or r.text == "0", (command, r.text)
        assert r.text == expected, (command, r.text)


# ================================================================ the CLI sandbox: a folder swapped for a link

CANARY = "CANARY-32b-must-not-be-read"
RACE_COMMANDS = ["cat d/f.txt", "head -n 1 d/f.txt", "wc -c d/f.txt", "grep -r CANARY d", "grep -r CANARY .",
                 "grep CANARY d/f.txt", "ls d", "ls -l d", "ls -R .", "find d", "find . -name 'SECRET*'",
                 "du -a d", "file d/f.txt", "cat */f.txt", "sort d/f.txt", "cat a/b/f.txt", "ls a/b",
                 "grep -r CANARY a", "find a -type f", "tail a/b/f.txt"]


def test_a_folder_swapped_for_a_link_to_outside_is_never_followed(tmp_path):
    """A thread swaps `d` and `a/b` for links to a folder outside the root, and back, while the commands run:
    no command may read or list what is outside (check-then-open: the path was checked, then the OS followed
    the swapped link when it opened it). Bounded by this process's CPU time, not the wall clock."""
    import threading
    import time

    from r1.envs.sandbox import Sandbox

    outside, root = tmp_path / "outside", tmp_path / "root"
    outside.mkdir()
    (outside / "f.txt").write_text(CANARY + "\n")
    (outside / "SECRET-NAME").write_text(CANARY + "\n")
    (root / "d").mkdir(parents=True)
    (root / "d" / "f.txt").write_text("benign\n")
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "b" / "f.txt").write_text("benign\n")
    sb, stop = Sandbox(root), threading.Event()

    def swap():
        pairs = [(root / "d", root / "d.saved"), (root / "a" / "b", root / "a" / "b.saved")]
        while not stop.is_set():
            for folder, saved in pairs:
                os.rename(folder, saved)
                os.symlink(outside, folder)
                time.sleep(0)
                os.unlink(folder)
                os.rename(saved, folder)
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    thread = threading.Thread(target=swap, daemon=True)
    thread.start()
    try:
        start, runs = time.process_time(), 0
        while time.process_time() - start < 6 and runs < 4000:
            for command in RACE_COMMANDS:
                text = sb.run(command).text
                runs += 1
                assert CANARY not in text and "SECRET" not in text, (command, text)
    finally:
        stop.set()
        thread.join()
        sys.setswitchinterval(old)
    assert runs >= len(RACE_COMMANDS)


# ================================================================ the CLI sandbox: no host path in any output


def test_ls_l_and_file_never_print_a_host_path(tmp_path):
    from r1.envs.sandbox import Sandbox
    from r1.envs.shell_commands import LINK_HIDDEN

    root, outside = tmp_path / "root", tmp_path / "elsewhere"
    (root / "docs").mkdir(parents=True)
    (root / "sub").mkdir()
    outside.mkdir()
    (root / "docs" / "notes.md").write_text("notes\n")
    os.symlink(str(outside / "f.txt"), root / "abs_out")
    os.symlink("../elsewhere", root / "rel_out")
    os.symlink(str(root / "docs"), root / "abs_in")
    os.symlink("docs/notes.md", root / "rel_in")
    os.symlink("../docs", root / "sub" / "up_in")
    os.symlink("../../elsewhere/x", root / "sub" / "up_out")
    os.symlink("docs/../../elsewhere", root / "dips_out")
    sb = Sandbox(root)
    host = str(tmp_path)
    outputs = {c: sb.run(c).text for c in ["ls -l", "ls -l sub", "ls -lS", "ls -lR", "ls -l abs_out rel_out",
                                           "file abs_out rel_out abs_in rel_in dips_out sub/up_in sub/up_out",
                                           "find . -type l", "ls -lh sub"]}
    for command, text in outputs.items():
        assert host not in text and "elsewhere" not in text, (command, text)
    ls = outputs["ls -l"]
    assert all(f"{name} -> {LINK_HIDDEN}" in ls for name in ("abs_out", "rel_out", "dips_out"))
    assert "abs_in -> /sandbox/docs" in ls and "rel_in -> docs/notes.md" in ls
    assert "up_in -> ../docs" in outputs["ls -l sub"] and f"up_out -> {LINK_HIDDEN}" in outputs["ls -l sub"]
    assert f"abs_out: symbolic link to {LINK_HIDDEN}" in outputs[
        "file abs_out rel_out abs_in rel_in dips_out sub/up_in sub/up_out"]
    # a link's size is the length of what is shown, not of the host path it holds
    line = next(x for x in ls.splitlines() if x.endswith("rel_in -> docs/notes.md"))
    assert line.split()[4] == str(len("docs/notes.md"))
    line = next(x for x in ls.splitlines() if "abs_out" in x)
    assert line.split()[4] == str(len(LINK_HIDDEN))


def test_grep_m_0_prints_no_match(tmp_path):
    """Before the fix: `grep -m 0` printed the first match (the count was checked after a line was taken)."""
    from r1.envs.cli import Sandbox

    (tmp_path / "f.txt").write_text("abc\nabd\n")
    sb = Sandbox(str(tmp_path))
    assert sb.run("grep -m 0 ab f.txt").text == "(no output)"
    assert sb.run("grep -m 1 ab f.txt").text == "abc"
    assert sb.run("grep -c -m 0 ab f.txt").text == "0"
