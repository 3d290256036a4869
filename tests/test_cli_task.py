"""The cli task (r1/tasks/cli.py): rows, ground truth, scorer, the env's sandbox lifecycle, the expert.

The expert's answers are read off the real sandbox's output, so checking
them against the generator's ground truth for every request kind and level
also checks the sandbox's commands against the tree spec. The expert chat's
tool turns are compared with what the env returns for the same calls, so
SFT trains on exactly the observations RL will see.
"""
import gc
import json
import os
import stat

import pytest

from r1.config import ConfigError, load_config
from r1.envs.base import Action
from r1.envs.tools import get_tool
from r1.sft import expert_example
from r1.tasks import cli
from r1.tasks.registry import get_task, load_rows, make_env
from r1.tokenizer import load_tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs", "cli.yaml")
KINDS = {1: {"list_ext", "count_lines", "largest", "newest", "count_files", "find_word", "count_matches"}}
KINDS[2] = KINDS[1] | {"total_size"}
KINDS[3] = KINDS[2] | {"lines_of_largest"}


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("smollm2-135m-instruct")


def cfg_of(*overrides):
    return load_config([CONFIG], ["model.path=tiny", "model.tokenizer=smollm2-135m-instruct", *overrides])


def call(command: str, thought: str = "") -> str:
    return f'{thought}<tool_call>{json.dumps({"name": "shell", "arguments": {"command": command}})}</tool_call>'


# ---------------------------------------------------------------- rows


def test_rows_are_deterministic_and_splits_differ():
    a, b = cli.make_dataset(6, 7, 2), cli.make_dataset(6, 7, 2)
    assert a == b
    assert cli.make_dataset(3, 7, 2) == a[:3]  # row i does not depend on n
    json.dumps(a)  # rows are plain data: the tree is a spec, not files
    cfg = cfg_of("data.train_size=20", "data.test_size=20", "data.level=1")
    train, test = load_rows(cfg, "train"), load_rows(cfg, "test")
    assert len(train) == len(test) == 20
    assert not {r["id"] for r in train} & {r["id"] for r in test}
    assert not {json.dumps(r["tree"], sort_keys=True) for r in train} & {json.dumps(r["tree"], sort_keys=True)
                                                                         for r in test}
    for r in train:
        assert r["level"] == 1 and r["question"] and r["answer"] and r["kind"] in KINDS[1]
        assert all(d.count("/") == 0 for d in r["tree"]["dirs"])  # level 1: no subfolders


def test_levels_grow_and_bad_level_is_an_error():
    depth = {lvl: max(d.count("/") for r in cli.make_dataset(10, 0, lvl) for d in r["tree"]["dirs"])
             for lvl in (1, 2, 3)}
    assert depth[1] == 0 and depth[2] == 1 and depth[3] == 2
    with pytest.raises(ValueError, match="data.level=4: the cli task has levels 1 to 3"):
        cli.make_dataset(1, 0, 4)
    cfg = cfg_of("data.level=3")
    cfg.data.level = 5  # past the config check (a config made in code): the rows refuse it too
    with pytest.raises(ValueError, match="levels 1 to 3"):
        load_rows(cfg, "train")


def test_materialized_tree_matches_the_spec(tmp_path):
    row = cli.make_dataset(1, 3, 3)[0]
    cli.materialize(row["tree"], str(tmp_path))
    on_disk = sorted(os.path.relpath(os.path.join(b, f), tmp_path) for b, _, fs in os.walk(tmp_path) for f in fs)
    assert on_disk == [f["path"] for f in row["tree"]["files"]]
    for f in row["tree"]["files"]:
        st = os.stat(tmp_path / f["path"])
        assert st.st_mtime == f["mtime"] and stat.S_IMODE(st.st_mode) == 0o644
        assert (tmp_path / f["path"]).read_bytes() == cli.file_bytes(f)
    with pytest.raises(ValueError, match=r"cli tree: path '\.\./x'"):
        cli.materialize({"dirs": [], "files": [{"path": "../x", "kind": "txt", "seed": 1, "size": 2, "mtime": 0}]},
                        str(tmp_path))


def test_outputs_do_not_depend_on_where_or_when_the_tree_is_written(tmp_path):
    """Two copies of a tree, written at different times in different folders, answer alike: SFT chats
    and RL observations are reproducible."""
    import time

    row = cli.make_dataset(1, 4, 3)[0]
    commands = ["ls -lR", "ls -lt Documents", "du -a", "find . -type f", "file Downloads/*", "pwd", "ls -la /sandbox"]
    with cli.sandbox_for(row["tree"]) as first:
        a = [first.run(c).text for c in commands]
        time.sleep(1.1)
        with cli.sandbox_for(row["tree"]) as second:
            b = [second.run(c).text for c in commands]
            assert first.root != second.root and second.root not in "".join(b)
    assert a == b and all(x and not x.startswith(("refused", "error")) for x in a)
    assert "2024-" in a[0] and " user user " in a[0]


@pytest.mark.parametrize("level", [1, 2, 3])
def test_expert_solves_every_kind(level):
    """For every request kind of the level, the expert's answer (from real sandbox output) is the ground truth."""
    seen, n = {}, 0
    for row in cli.make_dataset(80, 11, level):
        if row["kind"] in seen and seen[row["kind"]] >= 3:
            continue
        messages = cli.expert_messages(row)
        final = messages[-1]
        assert final["role"] == "assistant" and "####" in final["content"]
        assert cli.score(final["content"], row["answer"]) == 1.0, (row["question"], row["answer"], messages[2:])
        calls = [m for m in messages if m.get("tool_calls")]
        tools = [m for m in messages if m["role"] == "tool"]
        assert calls and len(calls) == len(tools) and all(not t["content"].startswith("refused") for t in tools)
        seen[row["kind"]] = seen.get(row["kind"], 0) + 1
        n += 1
    assert set(seen) == KINDS[level], seen
    assert n >= 2 * len(KINDS[level])


# ---------------------------------------------------------------- answers


@pytest.mark.parametrize("text,gold,expected", [
    ("#### 12", "12", 1.0),
    ("There are 12 lines.\n#### 12 lines", "12", 1.0),
    ("#### 1,234", "1234", 1.0),
    ("#### 0", "0", 1.0),
    ("#### 13", "12", 0.0),
    ("12", "12", 0.0),  # no ####: no answer
    ("####", "12", 0.0),
    ("#### 5\nthen\n#### 12", "12", 1.0),  # the last #### counts
    ("#### logs/app.log", "logs/app.log", 1.0),
    ("#### ./logs/app.log.", "logs/app.log", 1.0),
    ("#### `/sandbox/logs/app.log`", "logs/app.log", 1.0),
    ("#### app.log", "logs/app.log", 0.0),
    ("#### b/y.pdf, a/x.pdf", "a/x.pdf, b/y.pdf", 1.0),
    ("####\n- a/x.pdf\n- b/y.pdf", "a/x.pdf, b/y.pdf", 0.0),  # a '-' bullet is not a path
    ("####\na/x.pdf\nb/y.pdf\na/x.pdf", "a/x.pdf, b/y.pdf", 1.0),
    ("#### 'a/x.pdf' \"b/y.pdf\"", "a/x.pdf, b/y.pdf", 1.0),
    ("#### a/x.pdf", "a/x.pdf, b/y.pdf", 0.0),
    ("#### a/x.pdf, b/y.pdf, c/z.pdf", "a/x.pdf, b/y.pdf", 0.0),
    ("#### " + "9" * 5000, "12", 0.0),  # beyond Python's int digit limit: no crash
    ("#### logs/app.log<|im_end|>", "logs/app.log", 1.0),  # a decoded reply ends with its stop token
    ("#### a/x.pdf, b/y.pdf<|im_end|>\n<|im_start|>user", "a/x.pdf, b/y.pdf", 1.0),
])
def test_score(text, gold, expected):
    assert cli.score(text, gold) == expected


def test_score_on_hostile_text_is_plain():
    assert cli.score("####" * 100_000, "12") == 0.0
    assert cli.score("#### " + "1," * 200_000, "12") == 0.0
    assert cli.score("#### " + "a/x.pdf, " * 100_000, "a/x.pdf") == 1.0  # duplicates: a set
    assert cli.has_answer("done\n#### 3") and not cli.has_answer("#### ,, ") and not cli.has_answer("no answer")


# ---------------------------------------------------------------- the env


def test_episode_lifecycle_and_rewards(tok):
    cfg = cfg_of("data.level=2")
    row = next(r for r in cli.make_dataset(20, 5, 2) if r["kind"] in ("largest", "newest", "list_ext", "find_word"))
    env = make_env(cfg, tok)()
    obs = env.reset(row)
    assert obs.messages[-1]["content"] == row["question"] and env.tools[0]["function"]["name"] == "shell"
    root = env.root
    assert os.path.isdir(root) and sorted(os.listdir(root)) == sorted(d for d in row["tree"]["dirs"] if "/" not in d)
    obs, reward, done, info = env.step(Action([], call("pwd")))
    assert not done and reward == 0.0 and info["tool_calls"] == 1 and info["errors"] == [] and info["refused"] == 0
    assert obs.messages == [{"role": "tool", "name": "shell", "content": "/sandbox"}]
    obs, reward, done, info = env.step(Action([], call("rm -rf .")))
    assert not done and info["errors"] == ["tool_error"] and info["refused"] == 1
    assert obs.messages[0]["content"].startswith("refused: rm: the sandbox is read-only")
    _, reward, done, info = env.step(Action([], f"Done.\n#### {row['answer']}" + tok.decode([tok.stop_ids[0]])))
    assert done and reward == 1.0 and info["correct"] and info["score"] == 1.0
    cli.drain()
    assert not os.path.exists(root) and env.root is None  # removed at the episode's end
    assert not get_tool("shell")({"command": "ls"}).ok  # the registered tool is never bound to a sandbox


def test_sandbox_removed_on_max_steps_reset_close_and_gc(tok):
    cfg = cfg_of("env.max_steps=2")
    rows = cli.make_dataset(3, 5, 1)
    factory = make_env(cfg, tok)
    env = factory()
    env.reset(rows[0])
    first = env.root
    env.step(Action([], call("ls")))
    _, _, done, info = env.step(Action([], call("ls")))
    cli.drain()
    assert done and info["reason"] == "max_steps" and not os.path.exists(first)
    env.reset(rows[1])
    second = env.root
    env.reset(rows[2])  # an episode cut short (e.g. context budget) is cleaned up by the next reset
    cli.drain()
    assert not os.path.exists(second) and os.path.isdir(env.root)
    third = env.root
    env.close()
    env.close()
    cli.drain()
    assert not os.path.exists(third)
    env = factory()
    env.reset(rows[0])
    fourth = env.root
    del env
    gc.collect()
    cli.drain()
    assert not os.path.exists(fourth)  # dropped by the rollout loop without a word: the finalizer removes it


def test_shaping_keys(tok):
    row = cli.make_dataset(1, 5, 1)[0]
    env = make_env(cfg_of("env.rewards={format: 0.1, tool_success: 0.2, malformed: -0.5}"),
                   tok)()
    env.reset(row)
    assert env.step(Action([], call("ls")))[1] == pytest.approx(0.3)
    assert env.step(Action([], call("cat nope.txt")))[1] == pytest.approx(-0.4)  # ran and failed: well formed
    assert env.step(Action([], "<tool_call>{bad json</tool_call>"))[1] == pytest.approx(-0.5)
    env.close()
    shaped = make_env(cfg_of("env.rewards.command=0.25"), tok)()  # the config's weight reaches the env
    shaped.reset(row)
    assert shaped.step(Action([], call("cat nope.txt")))[1] == pytest.approx(0.25)  # accepted, then failed
    assert shaped.step(Action([], call("cat ../x")))[1] == 0.0  # refused
    assert shaped.step(Action([], "#### wrong"))[1] == 0.0  # a final answer is not a command
    assert shaped.root is None


def test_level_and_command_reward_are_checked_at_config_time():
    with pytest.raises(ConfigError, match=r"data.level.*in \[1, 3\] for data.task=cli, got 4"):
        cfg_of("data.level=4")
    with pytest.raises(ConfigError, match="env.rewards.*'command'.*cli task's shell sandbox only; data.task=gsm8k_tool"):
        load_config([os.path.join(ROOT, "configs", "gsm8k_tool.yaml")], ["env.rewards.command=0.1"])
    assert cfg_of("data.level=3", "env.rewards.command=0.1").env.rewards == {"malformed": 0.0, "command": 0.1}


def test_sft_level_gives_the_sft_phase_rows_of_its_own_level():
    """configs/cli.yaml: SFT on level-2 expert chats, RL and evaluation on level 3 (data.sft_level)."""
    from r1.sft import sft_data, warmup_config
    cfg = cfg_of()
    assert (cfg.data.level, cfg.data.sft_level) == (3, 2)
    sft_rows = load_rows(sft_data(warmup_config(cfg)), "train")
    assert {r["level"] for r in sft_rows} == {2} and len(sft_rows) == cfg.data.train_size
    assert {r["level"] for r in load_rows(cfg, "train")} == {3} and {r["level"] for r in load_rows(cfg, "test")} == {3}
    assert "lines_of_largest" not in {r["kind"] for r in sft_rows}  # the two-step request is left to RL
    same = cfg_of("data.sft_level=0")
    assert sft_data(same) is same and sft_data(cfg_of("data.sft_level=3")).data.level == 3
    with pytest.raises(ConfigError, match=r"data.sft_level.*in \[1, 3\] for data.task=cli, got 4"):
        cfg_of("data.sft_level=4")
    with pytest.raises(ConfigError, match="data.sft_level.*data.task=gsm8k_tool, which has no levels, got 2"):
        load_config([os.path.join(ROOT, "configs", "gsm8k_tool.yaml")], ["data.sft_level=2"])


def test_cli_needs_the_shell_tool(tok):
    with pytest.raises(ValueError, match="data.task=cli needs the shell tool"):
        make_env(cfg_of("env.tools=[calculator]"), tok)()
    assert get_task("cli").tools == ("shell",) and get_task("cli").expert is not None


def test_expert_chat_is_what_the_env_returns(tok):
    """Replaying the expert's calls through the env gives the same tool turns and a full reward."""
    tools = [get_tool("shell").schema]
    for row in cli.make_dataset(12, 21, 3):
        messages = cli.expert_messages(row, tools)
        env = cli.cli_env(cfg_of(), tok, ("shell",))
        env.reset(row)
        for m, nxt in zip(messages, messages[1:]):
            if m["role"] != "assistant":
                continue
            if m.get("tool_calls"):
                command = m["tool_calls"][0]["function"]["arguments"]["command"]
                obs, reward, done, _ = env.step(Action([], call(command, m["content"])))
                assert obs.messages[0]["content"] == nxt["content"]
            else:
                _, reward, done, info = env.step(Action([], m["content"]))
                assert done and reward == 1.0 and info["correct"]
        ids, mask = expert_example(tok, messages, tools)  # the chat lays out as SFT needs
        assert sum(mask) > 0 and len(ids) < cfg_of().env.max_context


@pytest.mark.slow
def test_train_sft_then_rl_and_eval(tmp_path, capsys):
    import eval as eval_py
    import train

    common = ["model.path=tiny", "model.tokenizer=smollm2-135m-instruct", "data.train_size=4", "data.test_size=2",
              "rollout.prompts=2", "rollout.n=2", "rollout.max_new_tokens=16", "rollout.slots=4",
              "env.max_context=1024", "log.tensorboard=false", "log.progress=false", "eval.every=0"]
    run = tmp_path / "run"
    train.main(["--config", CONFIG, *common, f"run.dir={run}", "train.sft_steps=2", "train.sft_batch=2",
                "train.steps=1", "train.micro_tokens=4096"])
    assert os.path.exists(run / "sft" / "hf" / "model.safetensors") and os.path.exists(run / "hf" / "config.json")
    with open(run / "metrics.jsonl") as f:
        assert [json.loads(x)["iter"] for x in f] == [1]
    capsys.readouterr()
    eval_py.main(["--config", CONFIG, *common, f"model.path={run}", "eval.limit=2", f"eval.out={tmp_path / 'ev'}"])
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["n"] == 2 and result["task"] == "cli" and 0.0 <= result["accuracy"] <= 1.0


class ScriptedGenerator:
    """Stands in for r1.generate.Generator (submit, launch, finish, release): each episode replays its
    row's expert turns as token ids, each ended by the stop token as a sampled turn would be."""

    def __init__(self, tok, scripts: dict, slots: int):
        self.tok, self.scripts, self.slots = tok, scripts, slots
        self.queue, self.launched, self.turn, self.prompts = [], [], {}, {}

    def submit(self, key, prompt_ids, max_new_tokens):
        self.queue.append(key)
        self.prompts.setdefault(key, []).append(list(prompt_ids))

    def release(self, key):
        pass

    def busy(self):
        return bool(self.queue or self.launched)

    def free_slots(self):
        return self.slots - len(self.queue) - len(self.launched)

    def launch(self):
        self.launched, self.queue = self.launched + self.queue, []

    def finish(self):
        from r1.generate import Completion

        out = []
        for key in self.launched:
            k = self.turn.get(key, 0)
            self.turn[key] = k + 1
            ids = self.tok.encode(self.scripts[key.rsplit("-", 1)[0]][k]) + [self.tok.stop_ids[0]]
            out.append(Completion(key, self.prompts[key][-1], ids, [0.0] * len(ids), "eos"))
        self.launched = []
        return out


def test_rollout_loop_runs_expert_episodes_and_removes_every_sandbox(tok, tmp_path, monkeypatch):
    """The real AgentEnvLoop (thread pool, several episodes at once) over CliEnv: the expert's turns
    earn reward 1 in every episode, the tool outputs are in the next prompt, and no sandbox is left."""
    from r1.rollout import AgentEnvLoop

    monkeypatch.setattr(cli.tempfile, "tempdir", str(tmp_path))  # count this test's sandboxes only
    rows = cli.make_dataset(6, 9, 2)
    scripts = {}
    for g, row in enumerate(rows):
        turns = []
        for m in cli.expert_messages(row):
            if m["role"] == "assistant":
                calls = m.get("tool_calls") or []
                turns.append(m["content"] + "".join(call(c["function"]["arguments"]["command"]) for c in calls))
        scripts[str(g)] = turns
    loop = AgentEnvLoop(ScriptedGenerator(tok, scripts, slots=4), tok, make_env(cfg_of(), tok), 128)
    trajs = loop.run(rows, n=2)
    assert len(trajs) == 12
    for t in trajs:
        assert t.termination == "answered" and sum(s.reward for s in t.steps) == 1.0, t.uid
        assert len(t.steps) >= 2 and t.steps[-1].info["correct"]
        tool_output = tok.decode(t.steps[1].prompt_ids[len(t.steps[0].prompt_ids):])
        assert "/sandbox" not in tool_output or "sandbox" in rows[t.group]["question"]
    cli.drain()
    assert os.listdir(tmp_path) == []
