"""Issue 32, third round, classes 2-4: the CLI sandbox, plug-ins and the working directory, tool observations.

Each test names the case of docs/RELIABILITY.md's third-round tables it checks. A stall is bounded by CPU
time (resource.RLIMIT_CPU in a child process, or time.process_time), never by wall time.
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
