"""The task registry: built-in and user tasks through train.py / eval.py, tools by name or module:attr,
the README's own-task example trained as printed, and the SFT warm-up phase of an RL run (resume too)."""
import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

from r1.config import ConfigError, load_config
from r1.tasks.registry import TASKS, get_task, load_rows, make_env, task_tools

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMOKE = os.path.join(ROOT, "configs", "smoke.yaml")
TINY = ["rollout.prompts=2", "rollout.n=2", "rollout.max_new_tokens=8", "data.train_size=16", "data.test_size=4"]


def test_builtin_tasks_are_registered_like_a_users():
    get_task("synthetic")
    assert {"synthetic", "gsm8k", "gsm8k_tool"} <= set(TASKS)
    assert get_task("gsm8k").tools == () and get_task("gsm8k_tool").tools == ("calculator",)


def test_gsm8k_ships_with_the_project():
    cfg = load_config(SMOKE, ["data.task=gsm8k_tool"])  # no data.path: the copy in data/gsm8k
    train, test = load_rows(cfg, "train"), load_rows(cfg, "test")
    assert (len(train), len(test)) == (64, 1319)  # the smoke config caps train_size at 64
    assert test[0]["answer"] and "####" in test[0]["solution"]
    assert os.path.isfile(os.path.join(ROOT, "data", "gsm8k", "LICENSE"))


@pytest.mark.parametrize("task,message", [
    ("gsm8k_tol", "did you mean gsm8k_tool"),
    ("nosuchpkg.mod:TASK", "cannot import module 'nosuchpkg.mod'"),
    ("r1.tasks.builtin:gsm8k_rows", "not an r1.tasks.registry.Task"),
    ("r1.tasks.builtin:NOPE", "has no attribute 'NOPE'"),
])
def test_unknown_task_is_one_line_config_error(task, message):
    with pytest.raises(ConfigError, match=re.escape(message)) as e:
        load_config(SMOKE, [f"data.task={task}"])
    assert "data.task" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("overrides,message", [
    (["env.tools=[]"], "needs tools"),
    (["data.task=gsm8k", "env.tools=[calculator]"], "takes no tools"),
    (["env.tools=[calculatr]"], "did you mean calculator"),
    (["env.tools=[r1.envs.tools:nothing]"], "has no attribute 'nothing'"),
])
def test_tools_mismatch_is_a_config_error(overrides, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(SMOKE, overrides)


def test_tool_from_a_module_path_is_registered_and_offered(tmp_path, monkeypatch):
    (tmp_path / "mytools.py").write_text(textwrap.dedent('''
        from r1.envs.tools import Tool, ToolResult
        SCHEMA = {"type": "function", "function": {"name": "reverse", "description": "reverse the text",
                  "parameters": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}}
        REVERSE = Tool(name="reverse", schema=SCHEMA, fn=lambda text: ToolResult(text[::-1], True))
    '''))
    monkeypatch.chdir(tmp_path)
    cfg = load_config(SMOKE, ["env.tools=[calculator, mytools:REVERSE]"])
    assert task_tools(cfg, get_task("synthetic")) == ("calculator", "reverse")

    class Tok:  # what ToolEnv reads of a tokenizer
        special_tokens, stop_ids = (), ()

    env = make_env(cfg, Tok())()
    assert [t["function"]["name"] for t in env.tools] == ["calculator", "reverse"]
    env.reset({"question": "q", "answer": "1"})
    from r1.envs.base import Action
    obs, reward, done, info = env.step(Action(ids=[], text='<tool_call>{"name": "reverse", "arguments": {"text": "abc"}}</tool_call>'))
    assert obs.messages[0]["content"] == "cba" and not done and info["errors"] == []


def test_a_tasks_own_tool_by_module_path_is_checked_when_the_config_is_read(tmp_path, monkeypatch):
    (tmp_path / "mytask.py").write_text(textwrap.dedent('''
        from r1.envs.tools import Tool, ToolResult
        from r1.tasks import synthetic
        from r1.tasks.registry import Task, get_task
        SCHEMA = {"type": "function", "function": {"name": "echo2", "description": "echo",
                  "parameters": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}}
        ECHO = Tool(name="echo2", schema=SCHEMA, fn=lambda text: ToolResult(text, True))
        base = get_task("synthetic")
        TASK = Task("echo_task", base.rows, base.env, tools=("mytask:ECHO",))
        BAD = Task("bad_tool_task", base.rows, base.env, tools=("mytask:NOPE",))
    '''))
    monkeypatch.chdir(tmp_path)
    try:
        cfg = load_config(SMOKE, ["data.task=mytask:TASK"])
        assert task_tools(cfg, get_task("mytask:TASK")) == ("echo2",)
        with pytest.raises(ConfigError, match=r"data.task=bad_tool_task: its Task\(tools=...\) entry: .*no attribute 'NOPE'"):
            load_config(SMOKE, ["data.task=mytask:BAD"])
    finally:  # the registry keeps what a test registers; the next tests see the built-in tasks only
        for name in ("echo_task", "bad_tool_task"):
            TASKS.pop(name, None)


def test_shaped_rewards_are_keys_and_accuracy_ignores_them():
    cfg = load_config(SMOKE, ["env.rewards={format: 0.1, tool_success: 0.05, malformed: -0.2}"])

    class Tok:
        special_tokens, stop_ids = (), ()

    from r1.envs.base import Action

    env = make_env(cfg, Tok())()
    env.reset({"question": "q", "answer": "5"})
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}</tool_call>'
    assert env.step(Action(ids=[], text=call))[1] == pytest.approx(0.15)  # well formed and it ran
    bad = '<tool_call>{"name": "calculator", "arguments": {"expression": "2/0"}}</tool_call>'
    assert env.step(Action(ids=[], text=bad))[1] == pytest.approx(-0.2 + 0.1)  # well formed, failed to run
    _, reward, done, info = env.step(Action(ids=[], text="#### 4"))  # wrong, but in the answer format
    assert done and reward == pytest.approx(0.1) and info["correct"] is False and info["score"] == 0.0
    env.reset({"question": "q", "answer": "5"})
    _, reward, _, info = env.step(Action(ids=[], text="#### 5"))
    assert reward == pytest.approx(1.1) and info["correct"] is True


def readme_blocks():
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    section = text[text.index("## Your own task"):]
    section = section[: section.index("\n## ", 5)]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    config = re.search(r"```yaml\n(.*?)```", section, re.S).group(1)
    return code, config


def test_readme_task_is_the_shipped_example():
    code, config = readme_blocks()
    assert code == open(os.path.join(ROOT, "examples", "guess_number.py"), encoding="utf-8").read()
    assert config == open(os.path.join(ROOT, "configs", "guess_number.yaml"), encoding="utf-8").read()


def test_readme_task_trains_and_evaluates_as_printed(tmp_path, tok_dir):
    """The README's code block and config, written to a fresh folder, trained and evaluated by the scripts."""
    code, config = readme_blocks()
    (tmp_path / "examples").mkdir()
    (tmp_path / "examples" / "guess_number.py").write_text(code)
    (tmp_path / "guess_number.yaml").write_text(config)
    tiny = ["model.path=tiny", f"model.tokenizer={tok_dir}", "train.steps=1", "log.progress=false", *TINY]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    run = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), "--config", "guess_number.yaml",
                          "run.dir=run", *tiny], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert lines[-1]["iter"] == 1 and "reward_mean" in lines[-1]
    assert "run folder: run" in run.stdout  # the closing summary
    ev = subprocess.run([sys.executable, os.path.join(ROOT, "eval.py"), "--config", "guess_number.yaml",
                         "model.path=run", f"model.tokenizer={tok_dir}", "eval.limit=2", "eval.out=ev",
                         "rollout.max_new_tokens=8"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert ev.returncode == 0, ev.stderr[-3000:]
    res = json.loads(ev.stdout.strip().splitlines()[-1])
    assert res["n"] == 2 and res["task"] == "examples.guess_number:TASK"


def test_guess_number_parser_and_max_steps():
    sys.path.insert(0, ROOT)
    from examples.guess_number import GuessNumber
    from r1.envs.base import Action

    class Tok:
        pass

    env = GuessNumber(Tok(), max_steps=3, max_context=64, max_new_tokens=8)
    env.reset({"question": "q", "answer": 100})
    _, reward, done, info = env.step(Action(ids=[], text="a number between 1 and 100"))
    assert (reward, done, info) == (1.0, True, {"final": True, "correct": True})  # the last number, not 1100
    env.reset({"question": "q", "answer": 7})
    assert env.step(Action(ids=[], text="50"))[0].messages[0]["content"] == "lower"
    assert env.step(Action(ids=[], text="3"))[0].messages[0]["content"] == "higher"
    assert env.step(Action(ids=[], text="4"))[3] == {"reason": "max_steps"}  # env.max_steps=3 is honoured


def test_sft_warmup_then_rl_in_one_command_and_resume(tmp_path, tok_dir, capsys):
    import train

    run = str(tmp_path / "run")
    args = ["--config", SMOKE, f"run.dir={run}", f"model.tokenizer={tok_dir}", "train.sft_steps=2",
            "train.sft_batch=2", "train.steps=1", *TINY]
    train.main(args)
    assert os.path.isfile(os.path.join(run, "sft", "done")) and os.path.isdir(os.path.join(run, "sft", "hf"))
    sft_lines = open(os.path.join(run, "sft", "metrics.jsonl")).read().splitlines()
    assert [json.loads(x)["iter"] for x in sft_lines] == [1, 2]
    assert load_config(os.path.join(run, "config.yaml")).model.path == os.path.join(run, "sft", "hf")
    out = capsys.readouterr().out
    assert "SFT warm-up: 2 steps" in out and "SFT warm-up:" in out and "run folder:" in out
    # a second command without run.resume is refused; with it, the SFT phase is skipped and RL goes on
    with pytest.raises(SystemExit):
        train.main(args)
    train.main(args[:-len(TINY) - 1] + ["train.steps=2", *TINY, "run.resume=true"])
    assert "SFT warm-up done" in capsys.readouterr().out
    assert [json.loads(x)["iter"] for x in open(os.path.join(run, "metrics.jsonl")).read().splitlines()] == [1, 2]


def test_sft_phase_resumes_from_its_checkpoint(tmp_path, tok_dir, capsys):
    """An SFT phase stopped after its checkpoint at step 2 (before the export) goes on from step 2."""
    import train

    run = str(tmp_path / "run")
    base = ["--config", SMOKE, f"model.tokenizer={tok_dir}", "train.sft_batch=2", *TINY]
    # exactly the phase's config (r1.sft.warmup_config), run as its own SFT run, then its end undone
    train.main(base + ["train.stage=sft", f"run.dir={run}/sft", "train.steps=2", "train.lr=1e-5",
                       "train.schedule=cosine", "train.checkpoint_every=10"])
    os.remove(os.path.join(run, "sft", "done"))
    capsys.readouterr()
    # 3 steps where the stopped phase planned 2: its cosine schedule is redrawn, a deliberate change (without
    # run.allow_config_change the resume is refused, tests/test_run_folder.py)
    train.main(base + [f"run.dir={run}", "train.sft_steps=3", "train.steps=1", "run.resume=true",
                       "run.allow_config_change=true"])
    assert "resuming from step 2" in capsys.readouterr().out
    assert [json.loads(x)["iter"] for x in open(os.path.join(run, "sft", "metrics.jsonl"))] == [1, 2, 3]
    assert [json.loads(x)["iter"] for x in open(os.path.join(run, "metrics.jsonl"))] == [1]


def test_task_without_expert_refuses_sft(tmp_path, monkeypatch):
    sys.path.insert(0, ROOT)
    with pytest.raises(ConfigError, match="no expert chats"):
        load_config(SMOKE, ["data.task=examples.guess_number:TASK", "train.sft_steps=2"])


def test_rl_phase_that_cannot_fit_is_refused_before_the_sft_phase(tmp_path, tok_dir, capsys):
    import train

    run = tmp_path / "run"
    with pytest.raises(SystemExit) as e:
        train.main(["--config", SMOKE, f"run.dir={run}", f"model.tokenizer={tok_dir}", "train.sft_steps=2",
                    "rollout.slots=65536", "rollout.cache_len=16384", *TINY])
    assert e.value.code == 2
    assert "rollout.slots" in capsys.readouterr().err and not (run / "sft" / "metrics.jsonl").exists()


def test_a_tasks_stop_strings_end_its_responses(tmp_path, tok_dir, monkeypatch):
    """Task(stop_strings=...) reaches the generator: a response ends at the first token whose text completes
    a stop string (finish "stop", the string kept); the built-in task declares none."""
    (tmp_path / "stoptask.py").write_text(textwrap.dedent('''
        import dataclasses
        from r1.tasks.registry import get_task
        TASK = dataclasses.replace(get_task("synthetic"), name="synthetic_stop", stop_strings=("e",))
    '''))
    monkeypatch.chdir(tmp_path)
    from r1.trainer import Trainer

    assert get_task("synthetic").stop_strings == ()
    args = [f"run.dir={tmp_path / 'run'}", f"model.tokenizer={tok_dir}", *TINY, "rollout.max_new_tokens=24",
            "data.task=stoptask:TASK", "log.tensorboard=false", "log.trajectories=false"]
    try:
        tr = Trainer(load_config(SMOKE, args))
        assert tr.actor.gen.stop_strings == ["e"]
        steps = [s for t in tr.rollout(0).trajectories for s in t.steps]
    finally:
        TASKS.pop("synthetic_stop", None)
    stopped = [s for s in steps if s.finish == "stop"]
    assert stopped, [tr.tok.decode(s.response_ids) for s in steps]
    for s in stopped:
        assert "e" in tr.tok.decode(s.response_ids) and "e" not in tr.tok.decode(s.response_ids[:-1])
    assert all("e" not in tr.tok.decode(s.response_ids[:-1]) for s in steps)
