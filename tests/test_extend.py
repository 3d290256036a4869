"""The edit path of docs/algorithms.md and docs/tasks.md, run as written: each doc's code adds an
estimator, a loss, a context policy and a reward term as a function plus a table line, the config
takes them from YAML at once, and each does what its doc says (so docs and code cannot drift)."""
import os
import re

import pytest
import torch

from r1.algos.estimators import ESTIMATORS
from r1.algos.policy_losses import POLICY_LOSSES
from r1.config import ConfigError, load_config
from r1.envs.base import Action
from r1.envs.context import CONTEXT_POLICIES
from r1.envs.rewards import REWARDS
from r1.envs.tool_env import ToolEnv
from r1.overlap import Rollout
from r1.tasks import gsm8k
from test_env import FIRST, RESPONSES, RawEnv, act, call, play
from test_trainer import ROOT, SMOKE

TABLES = (ESTIMATORS, POLICY_LOSSES, CONTEXT_POLICIES, REWARDS)
DOCS = {"algorithms": ("docs/algorithms.md", "## Add your own estimator or loss"),
        "tasks": ("docs/tasks.md", "## The edit path")}


def blocks(doc: str, lang: str = "python") -> list:
    path, heading = DOCS[doc]
    text = open(os.path.join(ROOT, path)).read()
    section = text[text.index(heading):]
    nxt = re.search(r"\n## ", section[3:])
    section = section[: nxt.start() + 3] if nxt else section
    return re.findall(rf"```{lang}\n(.*?)```", section, re.S)


@pytest.fixture
def added():
    """Run a doc's python blocks; the tables are put back as they were afterwards -> the names added."""
    before = [dict(t) for t in TABLES]

    def run(doc):
        for code in blocks(doc):
            exec(compile(code, DOCS[doc][0], "exec"), {})
        return [sorted(set(t) - set(b)) for t, b in zip(TABLES, before)]

    yield run
    for t, b in zip(TABLES, before):
        t.clear()
        t.update(b)


@pytest.fixture(scope="module")
def tok():
    from r1.tokenizer import load_tokenizer

    return load_tokenizer("smollm2-135m-instruct")


@pytest.mark.parametrize("doc", ["algorithms", "tasks"])
def test_each_doc_adds_one_of_each_and_the_config_takes_them(added, doc):
    (est,), (loss,), (policy,), (reward,) = added(doc)
    cfg = load_config(SMOKE, [f"algo.advantage={est}", f"algo.policy_loss={loss}",
                              f"env.context_policy={policy}", f"env.rewards={{{reward}: -0.5}}"])
    assert (cfg.algo.advantage, cfg.algo.policy_loss, cfg.env.context_policy) == (est, loss, policy)
    assert cfg.env.rewards == {reward: -0.5}


def test_the_yaml_of_docs_tasks_md_loads(added, tmp_path):
    added("tasks")
    (text,) = blocks("tasks", "yaml")
    (tmp_path / "extend.yaml").write_text(text)
    cfg = load_config([SMOKE, str(tmp_path / "extend.yaml")])
    assert (cfg.algo.advantage, cfg.algo.policy_loss) == ("outcome_sign", "plain_ppo")
    assert cfg.env.context_policy == "last_two" and cfg.env.rewards == {"first_try": 0.1}


@pytest.mark.parametrize("key, value, closest", [("env.context_policy", "windw", "window"),
                                                  ("env.rewards", "{formatt: 0.1}", "format")])
def test_unknown_names_are_config_errors_with_the_closest_names(key, value, closest):
    with pytest.raises(ConfigError, match=rf"'{re.escape(key)}'.*{closest}"):
        load_config(SMOKE, [f"{key}={value}"])


def test_a_shaping_weight_is_a_term_of_env_rewards():
    with pytest.raises(ConfigError, match=r"'env.format_reward' \(command line\) was removed: write env.rewards.format=0.1"):
        load_config(SMOKE, ["env.format_reward=0.1"])
    assert load_config(SMOKE, ["env.rewards={format: 0.1}"]).env.rewards == {"format": 0.1}


def test_the_context_policies_of_the_docs_keep_what_they_say(added):
    added("algorithms")
    added("tasks")
    chunks = [RESPONSES[t] + [500 + 10 * (t + 1) + j for j in range(3)] for t in range(8)]  # 7 ids each
    prompts, reason = play(RawEnv(FIRST, policy="keep_last", max_context=40, max_new_tokens=10), RESPONSES)
    assert reason is None and prompts[3] == FIRST + chunks[2]  # 10 + 3 x 7 > 30: the first prompt and c2
    assert prompts[4] == FIRST + chunks[2] + chunks[3] and prompts[-1] == FIRST + chunks[6] + chunks[7]
    prompts, reason = play(RawEnv(FIRST, policy="last_two", max_context=40, max_new_tokens=10), RESPONSES)
    assert reason is None and prompts[3] == FIRST + chunks[1] + chunks[2] and prompts[-1] == FIRST + chunks[6] + chunks[7]
    prompts, reason = play(RawEnv(FIRST, policy="last_two", max_context=30, max_new_tokens=10), RESPONSES)
    assert reason == "context_budget" and len(prompts) == 2  # budget 20: the first prompt and two steps (24) do not fit


def test_the_reward_terms_of_the_docs_pay_what_they_say(added, tok):
    added("algorithms")
    added("tasks")
    sample = {"id": "q", "question": "What is 20 + 7?", "answer": "27"}
    env = ToolEnv(tok, gsm8k.make_prompt, gsm8k.score, rewards={"length": -0.01, "first_try": 0.5})
    env.reset(sample)
    action = act(tok, "#### 27")
    _, reward, done, info = env.step(action)
    assert done and info["correct"] and reward == pytest.approx(1.0 - 0.01 * len(action.ids) + 0.5)
    env.reset(sample)
    first = act(tok, call(expression="20+7"))
    _, reward, _, _ = env.step(first)
    assert reward == pytest.approx(-0.01 * len(first.ids))  # a tool step: no answer, no first_try
    _, reward, _, _ = env.step(act(tok, "#### 27"))
    assert reward == pytest.approx(1.0 - 0.01 * len(act(tok, "#### 27").ids))  # right, but not at the first step


def test_the_estimator_and_loss_of_docs_tasks_md_train(added, tmp_path, tok_dir):
    from r1.trainer import Trainer
    from test_update_textbook import hand_trajs

    added("tasks")
    cfg = load_config(SMOKE, [f"run.dir={tmp_path / 'run'}", f"model.tokenizer={tok_dir}",
                              "algo.advantage=outcome_sign", "algo.policy_loss=plain_ppo", "algo.kl_coef=0",
                              "algo.entropy_coef=0", "log.tensorboard=false", "log.trajectories=false"])
    trainer = Trainer(cfg)
    assert trainer.learner.critic is None
    trainer.rollout = lambda it: Rollout(hand_trajs(append_only=False))
    m = trainer.iteration(0)
    grads = [p.grad for p in trainer.learner.policy.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    assert m["skipped_updates"] == 0 and "clip_frac" in m


def test_the_design_contract_still_imports_the_sandbox():
    from r1.envs import cli, sandbox

    assert cli.Sandbox is sandbox.Sandbox


def test_readme_layout_lists_every_module():
    text = open(os.path.join(ROOT, "README.md")).read()
    layout = text[text.index("## Layout"):]
    layout = layout[:layout.index("\n## ", 5)]
    missing = []
    for folder, _, files in os.walk(os.path.join(ROOT, "r1")):
        for f in files:
            rel = os.path.relpath(os.path.join(folder, f), ROOT)
            if f.endswith(".py") and f != "__init__.py" and f"`{rel}`" not in layout:
                missing.append(rel)
    assert not missing, f"README Layout leaves out {missing}"
