"""rollout.carry_tokens: an episode that sampled that many tokens in one run pauses at its step boundary and
resumes first in the next run (r1/rollout.py). Checked with the real KV-cache generator, a tiny random model and
the real SmolLM2 tokenizer: every episode ends exactly once, with every step, its prompts token-exact across the
pause (append policy: prompt_{t+1} = prompt_t + response_t + close + observation) and each step's policy_version
the run that sampled it; which episodes pause does not depend on the slot count; whole_groups returns whole
groups only; a run without carry (evaluation) leaves the paused episodes alone; a run that raised drops them.
A resumed step's logprobs are those of the new weights. Then the trainer, synchronous and with the rollout in a
thread or a process (train.overlap 1, 2): the key reaches the loop (groups numbered per iteration), carried_frac is
logged and each record counts its rollouts (meta.rollouts), a GRPO run trains whole groups; run.resume, a bad value
and carrying without a correction for the older steps are one-line config errors."""
import json
import os

import pytest
from r1.config import ConfigError, load_config
from r1.envs.base import Env, Observation
from r1.generate import Generator, Sampling
from r1.rollout import AgentEnvLoop
from r1.tasks.registry import Task, get_task
# the fixtures (one thread, SmolLM2's tokenizer, a tiny random model), the env and the rows of test_rollout.py
from test_rollout import TurnsEnv, model, one_thread, samples, tok  # noqa: F401

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMOKE = os.path.join(ROOT, "configs", "smoke.yaml")
MAX_NEW = 8


class Turns(TurnsEnv):
    """test_rollout's env (ends after sample["turns"] steps, observations name the step), counting closes."""

    closed = 0

    def close(self):
        Turns.closed += 1


def make_loop(tok, model, slots, env_cls=Turns):
    gen = Generator(model, slots, 256, stop_ids=tok.stop_ids)
    gen.set_sampling(Sampling(temperature=1.0, seed=1))
    return AgentEnvLoop(gen, tok, lambda: env_cls(tok, max_context=256, max_new_tokens=MAX_NEW), MAX_NEW)


def play_out(loop, data, n, carry, whole=False, max_runs=12):
    """Run until nothing is paused: the first run plays `data`, later ones resume. -> [(run, trajectories)]."""
    out = []
    for r in range(max_runs):
        rows = data if r == 0 else []
        groups = range(len(rows)) if r == 0 else []
        out.append(loop.run(rows, n=n, policy_version=r, uid_prefix="", groups=groups, carry_tokens=carry,
                            whole_groups=whole))
        if not loop.carried and not loop.held:
            return out
    raise AssertionError("episodes still paused after max_runs runs")


def check_exact(tok, t, turns):
    assert len(t.steps) == turns and t.termination == "answered"
    assert [s.done for s in t.steps] == [False] * (turns - 1) + [True]
    for i, (a, b) in enumerate(zip(t.steps, t.steps[1:]), start=1):
        obs = tok.render_next([{"role": "tool", "content": f"result {i}"}])
        assert b.prompt_ids == a.prompt_ids + a.response_ids + tok.close_turn_ids(a.response_ids) + obs
    assert all(len(s.logprobs) == len(s.response_ids) for s in t.steps)


def test_paused_episodes_resume_token_exact_and_end_once(tok, model):
    turns = [1, 4, 2, 3, 5, 2]
    data = samples(turns)
    runs = play_out(make_loop(tok, model, slots=4), data, n=2, carry=MAX_NEW)
    assert len(runs) > 2  # episodes did pause (a step of the random model mostly runs to max_new_tokens)
    seen = [t for trajs in runs for t in trajs]
    assert sorted(t.uid for t in seen) == sorted(f"{g}-{i}" for g in range(6) for i in range(2))
    for r, trajs in enumerate(runs):
        for t in trajs:
            check_exact(tok, t, turns[t.group])
            versions = [s.policy_version for s in t.steps]
            assert versions == sorted(versions) and versions[-1] == r  # each step: the run that sampled it
    spanning = [t for t in seen if len({s.policy_version for s in t.steps}) > 1]
    assert spanning
    for t in seen:  # its record says in how many rollouts it played
        assert t.meta.get("rollouts", 1) == len({s.policy_version for s in t.steps})
    # without carrying, the same loop plays the same first steps (the pause changes only what comes after it)
    plain = make_loop(tok, model, slots=4).run(data, n=2)
    first = {t.uid: t.steps[0].response_ids for t in seen}
    assert {t.uid: t.steps[0].response_ids for t in plain} == first


def test_a_resumed_step_is_sampled_on_the_new_weights(tok, model):
    """The paused episode's slot was freed, so its next step is prefilled and sampled by the weights of the run
    that resumes it: its recorded logprobs are those of a full forward of the new weights, not the old ones."""
    import copy

    import torch

    def logprobs(m, prompt, response):
        ids = torch.tensor(prompt + response)
        with torch.no_grad():
            logits = m(ids, torch.arange(len(ids)), torch.tensor([0, len(ids)], dtype=torch.int32), len(ids))
        lp = torch.log_softmax(logits[len(prompt) - 1:-1].float(), -1)
        return lp.gather(-1, torch.tensor(response)[:, None])[:, 0]

    m = copy.deepcopy(model)
    loop = make_loop(tok, m, slots=2)
    loop.run(samples([3]), n=1, carry_tokens=MAX_NEW)
    [(_, traj, _)] = loop.carried
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    [t] = loop.run([], n=1, policy_version=1, carry_tokens=100)
    assert t is traj and [s.policy_version for s in t.steps] == [0, 1, 1]
    old = copy.deepcopy(model)
    for k, s in enumerate(t.steps):
        now = logprobs(m if k else old, s.prompt_ids, s.response_ids)
        assert (now - torch.tensor(s.logprobs)).abs().max() < 1e-4, k
    other = logprobs(old, t.steps[1].prompt_ids, t.steps[1].response_ids)
    assert (other - torch.tensor(t.steps[1].logprobs)).abs().max() > 1e-2  # the two weights are told apart


def test_which_episodes_pause_does_not_depend_on_the_slot_count(tok, model):
    data = samples([3, 1, 4, 2])
    ids = lambda runs: [[(t.uid, [(s.prompt_ids, s.response_ids, s.policy_version) for s in t.steps])  # noqa: E731
                         for t in trajs] for trajs in runs]
    base = ids(play_out(make_loop(tok, model, slots=3), data, n=2, carry=MAX_NEW + 4))
    assert ids(play_out(make_loop(tok, model, slots=1), data, n=2, carry=MAX_NEW + 4)) == base
    assert ids(play_out(make_loop(tok, model, slots=8), data, n=2, carry=MAX_NEW + 4)) == base
    assert len(base) > 1


def test_whole_groups_come_back_together(tok, model):
    turns = [1, 4, 2, 3]
    runs = play_out(make_loop(tok, model, slots=3), samples(turns), n=3, carry=MAX_NEW, whole=True)
    for trajs in runs:
        by_group = {}
        for t in trajs:
            by_group.setdefault(t.group, []).append(int(t.uid.rsplit("-", 1)[1]))
        assert all(sorted(v) == [0, 1, 2] for v in by_group.values())
    assert sorted(t.group for trajs in runs for t in trajs) == sorted([0, 1, 2, 3] * 3)
    assert runs[0] and not [t for t in runs[0] if t.group == 1]  # group 1 (4 turns) waited


def test_a_group_number_still_playing_is_refused(tok, model):
    loop = make_loop(tok, model, slots=4)
    loop.run(samples([4]), n=2, groups=[7], carry_tokens=MAX_NEW, whole_groups=True)
    assert 7 in loop.group_left
    with pytest.raises(ValueError, match="group 7 is already playing in the loop"):
        loop.run(samples([1]), n=2, groups=[7], carry_tokens=MAX_NEW, whole_groups=True)


def test_an_evaluation_between_runs_leaves_the_paused_episodes(tok, model):
    loop = make_loop(tok, model, slots=4)
    first = loop.run(samples([4, 1]), n=1, carry_tokens=MAX_NEW)
    paused = [traj.uid for _, traj, _ in loop.carried]
    assert paused == ["0-0"] and [t.uid for t in first] == ["1-0"]
    evaluated = loop.run(samples([2, 2]), n=1, uid_prefix="eval-")  # no carry: plays its own episodes whole
    assert [t.uid for t in evaluated] == ["eval-0-0", "eval-1-0"] and all(len(t.steps) == 2 for t in evaluated)
    assert [traj.uid for _, traj, _ in loop.carried] == paused
    rest = []
    for r in range(1, 6):
        rest += loop.run([], n=1, policy_version=r, carry_tokens=MAX_NEW)
    assert [t.uid for t in rest] == ["0-0"] and len(rest[0].steps) == 4 and not loop.carried


def test_a_run_that_raised_drops_the_paused_episodes(tok, model):
    boom = [False]

    class Raising(Turns):
        def step(self, action):
            if boom[0]:
                raise RuntimeError("tool crashed")
            return super().step(action)

    loop = make_loop(tok, model, slots=3, env_cls=Raising)
    loop.run(samples([4, 4]), n=1, carry_tokens=MAX_NEW)
    assert len(loop.carried) == 2
    Turns.closed, boom[0] = 0, True
    from r1.tasks.registry import TaskError

    with pytest.raises(TaskError, match="tool crashed"):
        loop.run(samples([3]), n=1, uid_prefix="next-", carry_tokens=MAX_NEW)
    assert not loop.carried and not loop.held and Turns.closed == 3  # the two resumed and the new one: closed
    boom[0] = False
    assert [len(t.steps) for t in loop.run(samples([2]), n=1)] == [2]


# -- the trainer -----------------------------------------------------------------------------------------------


class TaskTurns(Env):
    """The trainer's multi-turn env: every reply is a turn until the row's number of turns; reward 1 at the end
    when the last reply is short (something a tiny random model can move)."""

    def reset(self, sample):
        self.turns, self.t = 2 + int(sample["answer"]) % 3, 0
        return Observation(messages=[{"role": "user", "content": sample["question"]}])

    def step(self, action):
        self.t += 1
        if self.t >= self.turns:
            return None, float(len(action.ids) < 6), True, {"final": True}
        return Observation(messages=[{"role": "tool", "content": f"noted {self.t}"}]), 0.0, False, {}


def turns_env(cfg, tokenizer, tools):
    return TaskTurns(tokenizer, max_context=cfg.env.max_context, max_new_tokens=cfg.rollout.max_new_tokens)


# data.task=test_carry:TURNS_TASK: a module's Task, so that the rollout process (train.overlap=2) imports it too
TURNS_TASK = Task("carry_turns", get_task("synthetic").rows, turns_env, tools=())
turns_task = "test_carry:TURNS_TASK"


TINY = ["rollout.prompts=4", "rollout.n=2", "rollout.max_new_tokens=8", "data.train_size=16", "data.test_size=4",
        "log.tensorboard=false", "rollout.slots=8", "train.steps=4", "env.max_context=512"]


def episodes(run_dir, it):
    from r1.trajectory import iter_path, load

    return load(iter_path(str(run_dir), it))


@pytest.mark.parametrize("algo", [["algo.advantage=step_gae", "algo.tis_cap=2.0"],
                                  ["algo.advantage=grpo", "algo.lam=1.0", "algo.kl_coef=0",
                                   "train.score_policy=sampler"],
                                  ["algo.advantage=step_gae", "train.overlap=1", "algo.policy_loss=decoupled_ppo"],
                                  ["algo.advantage=step_gae", "train.overlap=2", "algo.policy_loss=decoupled_ppo"]])
def test_the_trainer_carries_and_trains_what_ended(tmp_path, algo):
    from r1.trainer import Trainer

    run = tmp_path / "run"
    cfg = load_config(SMOKE, [f"run.dir={run}", f"data.task={turns_task}", *TINY, "rollout.carry_tokens=8", *algo])
    trainer = Trainer(cfg)
    trainer.fit()
    lines = [json.loads(ln) for ln in open(run / "metrics.jsonl") if ln.strip()]
    assert len(lines) == 4 and all("carried_frac" in m for m in lines)
    assert lines[1]["carried_frac"] > 0  # episodes paused in the first rollout ended in the second
    whole = algo[0] == "algo.advantage=grpo"
    lag = int("train.overlap=1" in algo or "train.overlap=2" in algo)  # overlap: one version back
    uids = []
    for it in range(1, 5):
        eps = episodes(run, it)
        uids += [e.uid for e in eps]
        groups = {}
        for e in eps:
            start = int(e.uid.split("-")[0])  # the iteration it began in numbers its group
            assert start * 4 <= e.group < start * 4 + 4
            groups[e.group] = groups.get(e.group, 0) + 1
            versions = [s.policy_version for s in e.steps]
            assert versions == sorted(versions) and versions[0] == max(start - lag, 0)
            assert versions[-1] == max(it - 1 - lag, 0)
            assert e.meta.get("rollouts", 1) == it - start  # from iteration start's rollout to iteration it's
        if whole:
            assert all(v == 2 for v in groups.values())
    assert len(uids) == len(set(uids))  # no episode trained twice


def test_resume_a_bad_value_and_no_correction_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="rollout.carry_tokens"):
        load_config(SMOKE, [f"run.dir={tmp_path / 'bad'}", "rollout.carry_tokens=-1"])
    # plain PPO, no weight, old logprobs scored on today's weights: the older steps would pass as on-policy
    with pytest.raises(ConfigError, match=r"'rollout.carry_tokens' \(command line\)=8 resumes paused episodes on "
                                          r"newer weights.*policy_loss=ppo tis_cap=0.0 score_policy=auto"):
        load_config(SMOKE, [f"run.dir={tmp_path / 'bad'}", "rollout.carry_tokens=8", "algo.policy_loss=ppo",
                            "algo.tis_cap=0"])
    from r1.trainer import Trainer

    run = tmp_path / "run"
    base = [f"run.dir={run}", f"data.task={turns_task}", *TINY, "train.steps=1", "log.trajectories=false",
            "rollout.carry_tokens=8", "algo.tis_cap=2.0"]
    Trainer(load_config(SMOKE, base)).fit()
    with pytest.raises(ConfigError, match=r"'rollout.carry_tokens'=8: run.resume cannot continue .* exactly"):
        Trainer(load_config(SMOKE, [*base, "run.resume=true", "train.steps=2"]))


def test_auto_slots_leave_room_for_the_resumed_episodes():
    """Paused episodes resume first, so a batch of new ones beside them needs more slots than the batch: auto gives
    a quarter more (r1/memory.CARRY_HEADROOM), past the 512 a batch alone gets, in a CUDA-graph bucket (640)."""
    from r1 import memory
    from r1.generate import BUCKETS
    from r1.model import ModelConfig

    fast = "configs/gsm8k_tool.yaml"
    assert memory.slots_needed(load_config(fast, []), 1) == 512
    carrying = load_config(fast, ["rollout.carry_tokens=200"])
    assert memory.slots_needed(carrying, 1) == 640 and 640 in BUCKETS and BUCKETS == memory.SLOT_STEPS
    assert memory.slots_needed(load_config(fast, ["rollout.carry_tokens=200", "eval.every=0"]), 2) == 320  # a rank's
    assert memory.slots_needed(carrying, 2) == 512  # its validation reads (500 problems, eval.limit=0) take more
    assert memory.slots_needed(load_config(fast, ["rollout.carry_tokens=200", "rollout.prompts=128"]), 1) == 640
    assert memory.slots_needed(load_config(SMOKE, ["rollout.carry_tokens=8", "algo.tis_cap=2"]), 1) == 8 + 2
    plan = memory.plan(carrying, ModelConfig(), 1, "cuda", int(139.8 * 2 ** 30))
    assert plan.fits and plan.slots == 640
