"""The RL trainer end to end on CPU: run folder, HF export, resume, 1 vs 2 processes, refusing to overwrite.

Every run is the smoke config shrunk further (2 prompts x 2 samples, 8 new
tokens), so an iteration takes about a second. Runs happen in this process
through `train.main` (the tokenizer loads once), except the two-process
run, which needs torchrun; subprocesses read the tokenizer from a folder
saved once, because building it from the GGUF file takes seconds.
"""
import json
import os
import socket
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

import train
from r1.config import load_config
from r1.overlap import Rollout
from r1.trainer import Trainer
from r1.trajectory import load as load_trajs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMOKE = os.path.join(ROOT, "configs", "smoke.yaml")
TINY = ["rollout.prompts=2", "rollout.n=2", "rollout.max_new_tokens=8", "data.train_size=16", "data.test_size=4"]
# the metrics the maintainers' design notes and docs/algorithms.md promise in every iteration's line
METRIC_KEYS = ["reward_mean", "reward_std", "accuracy", "mean_response_len", "mean_turns", "mean_tool_calls",
               "malformed_rate", "entropy", "kl_ref", "clip_frac", "approx_kl", "value_loss", "explained_variance",
               "grad_norm", "lr", "logprob_gap_mean", "logprob_gap_max", "rollout_tok_s", "train_tok_s"]
TIMING = ("time_", "peak_mem")




def read_metrics(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def comparable(line):
    """A metrics line without wall-clock quantities (times and throughputs)."""
    return {k: v for k, v in line.items() if not k.startswith(TIMING) and not k.endswith("_tok_s")}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_smoke_run_folder_and_hf_export(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from transformers import AutoModelForCausalLM

    run = str(tmp_path / "run")
    cfg = load_config(SMOKE, [f"run.dir={run}", *TINY])
    trainer = Trainer(cfg)
    trainer.fit()
    for name in ("config.yaml", "metrics.jsonl", "tb", "checkpoints", "trajectories", "hf"):
        assert os.path.exists(os.path.join(run, name)), name
    assert load_config(os.path.join(run, "config.yaml")) == cfg  # the resolved config round-trips
    lines = read_metrics(run)
    assert [m["iter"] for m in lines] == [1, 2]
    for m in lines:
        missing = [k for k in METRIC_KEYS if not isinstance(m.get(k), float)]
        assert not missing, f"metrics.jsonl lacks {missing}"
        assert m["grad_norm"] > 0 and m["lr"] == cfg.train.lr and m["skipped_updates"] == 0
        assert m["logprob_gap_max"] < 1e-4  # the sampler and trainer run the same float32 model
    ea = EventAccumulator(os.path.join(run, "tb"))
    ea.Reload()
    events = ea.Scalars("grad_norm")
    assert [e.step for e in events] == [1, 2]
    assert [e.value for e in events] == pytest.approx([m["grad_norm"] for m in lines], rel=1e-6)
    assert sorted(os.listdir(os.path.join(run, "trajectories"))) == ["iter_000001.jsonl.gz", "iter_000002.jsonl.gz"]
    assert open(os.path.join(run, "checkpoints", "latest")).read().strip() == "iter_000002"

    hf = AutoModelForCausalLM.from_pretrained(os.path.join(run, "hf"), dtype=torch.float32).eval()
    ids = torch.randint(0, trainer.model_cfg.vocab_size, (2, 11), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours, theirs = trainer.learner.policy(ids), hf(ids).logits
    assert ours.shape == theirs.shape
    assert (ours - theirs).abs().max() < 1e-4


def test_resume_reproduces_uninterrupted_run(tmp_path):
    straight, split = str(tmp_path / "straight"), str(tmp_path / "split")
    base = ["--config", SMOKE, *TINY, "log.tensorboard=false"]
    train.main(base + [f"run.dir={straight}", "train.steps=4"])
    train.main(base + [f"run.dir={split}", "train.steps=2"])
    assert [m["iter"] for m in read_metrics(split)] == [1, 2]
    train.main(base + [f"run.dir={split}", "train.steps=4", "run.resume=true"])
    a, b = read_metrics(straight), read_metrics(split)
    assert [m["iter"] for m in b] == [1, 2, 3, 4]
    assert [comparable(m) for m in a] == [comparable(m) for m in b]
    wa = load_file(os.path.join(straight, "hf", "model.safetensors"))
    wb = load_file(os.path.join(split, "hf", "model.safetensors"))
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k
    # the trajectories of the resumed iterations are the uninterrupted run's, token for token
    for it in (3, 4):
        name = os.path.join("trajectories", f"iter_{it:06d}.jsonl.gz")
        ta, tb = load_trajs(os.path.join(straight, name)), load_trajs(os.path.join(split, name))
        assert [[(s.prompt_ids, s.response_ids, s.logprobs) for s in t.steps] for t in ta] == \
               [[(s.prompt_ids, s.response_ids, s.logprobs) for s in t.steps] for t in tb]


def test_time_limit_stops_checkpoints_exports_and_resumes(tmp_path):
    """train.time_limit ends the run after the iteration that passes it, saved and exported; resume continues."""
    run = str(tmp_path / "run")
    base = ["--config", SMOKE, *TINY, "log.tensorboard=false", f"run.dir={run}", "train.steps=4",
            "train.checkpoint_every=100"]
    train.main(base + ["train.time_limit=1e-6"])
    assert [m["iter"] for m in read_metrics(run)] == [1]
    assert os.path.exists(os.path.join(run, "hf", "model.safetensors"))
    assert os.listdir(os.path.join(run, "checkpoints"))
    train.main(base + ["run.resume=true"])
    assert [m["iter"] for m in read_metrics(run)] == [1, 2, 3, 4]


def test_existing_run_dir_is_refused_untouched(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"iter": 1}\n')
    (run / "notes.txt").write_text("mine")
    before = {p: (os.stat(run / p).st_mtime_ns, (run / p).read_bytes()) for p in os.listdir(run)}
    with pytest.raises(SystemExit) as e:
        train.main(["--config", SMOKE, *TINY, f"run.dir={run}"])
    msg = e.value.code
    assert isinstance(msg, str) and msg.startswith("error:") and "\n" not in msg  # a str code exits with status 1
    assert str(run) in msg and "run.resume=true" in msg
    after = {p: (os.stat(run / p).st_mtime_ns, (run / p).read_bytes()) for p in os.listdir(run)}
    assert after == before


def said_on_failure(out: str) -> str:
    """A failed torchrun's output for an assertion message: the lines that name what went wrong (a rank's
    "terminate called", an error, a traceback's last line), wherever they are, then the last 3,000 characters.
    CI once showed only the tail, and rank 1's own abort line was not in it."""
    marks = ("terminate called", "error", "Error", "Traceback", "Signal", "what():")
    lines = [x for x in out.splitlines() if any(m in x for m in marks)]
    return "\n".join(lines[:40]) + "\n...\n" + out[-3000:]


def one_and_two_processes(common: list, tmp_path, keys, timeout=240):
    """train.py with `common` arguments under torchrun on 2 CPU ranks and, overlapping its start-up, in this
    process; both runs log 2 iterations of 6 episodes whose `keys` agree within 1e-4 and whose sampler-trainer
    gap stays under 1e-4. -> the two run folders (one process, two)."""
    one, two = str(tmp_path / "one"), str(tmp_path / "two")
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port()}",
           os.path.join(ROOT, "train.py"), *common, f"run.dir={two}"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    train.main(common + [f"run.dir={one}"])  # overlaps with the torchrun start-up
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, said_on_failure(out)
    a, b = read_metrics(one), read_metrics(two)
    assert len(a) == len(b) == 2
    for ma, mb in zip(a, b):
        assert ma["n"] == mb["n"] == 6 and ma["mean_response_len"] == mb["mean_response_len"]
        assert ma["logprob_gap_max"] < 1e-4 and mb["logprob_gap_max"] < 1e-4
        for k in keys:
            assert mb[k] == pytest.approx(ma[k], rel=1e-4, abs=1e-6), k
    return one, two


def test_two_processes_match_one(tmp_path, tok_dir):
    """torchrun with 2 CPU ranks (gloo, FSDP2) vs 1 process on the same global batch.

    Sampling at temperature 1: the generator's noise is keyed by (seed, uid,
    position) and uids carry global prompt indices, so dealing prompts to
    ranks does not change the batch. 3 prompts over 2
    ranks and one packed sequence per micro-batch give the ranks different
    micro-batch counts (2 + 1 prompts), which FSDP must survive (fillers).
    Losses and gradient norms are scale-sensitive, unlike Adam's first
    step, so they catch a gradient that is summed instead of averaged.
    """
    common = ["--config", SMOKE, f"model.tokenizer={tok_dir}", "rollout.prompts=3", "rollout.n=2",
              "rollout.max_new_tokens=8", "data.train_size=16", "rollout.temperature=1.0", "train.steps=2",
              "algo.minibatches=1", "train.micro_tokens=1", "log.tensorboard=false", "log.trajectories=false"]
    one, two = one_and_two_processes(common, tmp_path, ("pg_loss", "value_loss", "grad_norm", "critic_grad_norm",
                                                         "entropy", "reward_mean"))
    wa = load_file(os.path.join(one, "hf", "model.safetensors"))
    wb = load_file(os.path.join(two, "hf", "model.safetensors"))
    for k in wa:
        assert (wa[k] - wb[k]).abs().max() < 1e-5, k
    check_disk_estimate(two, "iter_000002")


def check_disk_estimate(run_dir: str, name: str, world: int = 2):
    """r1/disk.py's estimate of a checkpoint sharded over `world` ranks (each rank's files, metadata, RNG) bounds
    the checkpoint folder `name` of run_dir within 0.5%."""
    from r1 import disk
    from r1.model import ModelConfig

    with open(os.path.join(run_dir, "hf", "config.json")) as f:
        mc = ModelConfig.from_hf(json.load(f))
    folder = os.path.join(run_dir, "checkpoints", name)
    written = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))
    est = disk.checkpoint_bytes(load_config(os.path.join(run_dir, "config.yaml")), mc, world=world)
    assert written <= est < 1.005 * written, (est, written)


def test_explained_variance_is_over_the_iteration_not_a_mean_of_micro_batches():
    """The trainer sums count-weighted moments over micro-batches; the result equals the float64
    explained variance of all positions at once, which a mean of per-micro-batch ratios misses
    (a micro-batch without a success has nearly constant returns and a huge negative ratio)."""
    from r1.algos.losses import explained_variance
    from r1.learner import _accumulate, _explained_variance, _value_moments

    g = torch.Generator().manual_seed(0)
    target = (torch.rand(300, generator=g) < 0.05).double()
    target[40:100] = 0.0  # a micro-batch without a success: its lambda-returns barely vary
    target = target + 0.002 * torch.randn(300, generator=g, dtype=torch.float64)
    pred = 0.05 + 0.02 * torch.randn(300, generator=g, dtype=torch.float64) + 0.5 * target
    mask = torch.rand(300, generator=g) < 0.9
    stats, ratios = {}, []
    for lo, hi in [(0, 40), (40, 100), (100, 101), (101, 300)]:
        _accumulate(stats, _value_moments(pred[lo:hi], target[lo:hi], mask[lo:hi]), mask[lo:hi].sum())
        ratios.append(float(explained_variance(pred[lo:hi], target[lo:hi], mask[lo:hi])))
    m = {k: tot / cnt for k, (tot, cnt) in stats.items()}
    ev = _explained_variance(m["ev_t"], m["ev_t2"], m["ev_r"], m["ev_r2"])
    want = float(explained_variance(pred, target, mask))
    assert abs(ev - want) < 1e-9 and want > 0.5
    assert min(ratios) < 0  # what the per-micro-batch mean used to average in
    assert _explained_variance(0.0, 0.0, 0.1, 0.02) == 0.0  # constant returns


def test_drop_uniform_groups_trains_on_informative_groups_only(tmp_path, monkeypatch):
    """algo.drop_uniform_groups: trained_frac is the share of episodes in groups whose total rewards differ,
    the saved trajectories keep every episode, and with a token-mean loss and no other term the first
    gradient is the unfiltered one scaled by (all response tokens / kept ones): the dropped tokens only
    diluted it. An iteration where no group is informative runs too; other estimators refuse the key."""
    from r1.config import ConfigError
    from r1.credit import informative_groups

    assert informative_groups([0, 0, 1, 1, 2], [1.0, 1.0, 0.0, 1.0, 0.5]) == [False, False, True, True, False]
    real_rollout = Trainer.rollout

    def rollout(self, it):  # the tiny model never earns a reward: give one to episode 0 of groups 0 and 1
        got = real_rollout(self, it)
        for t in got.trajectories:
            if it == 0 and t.group in (0, 1) and t.uid.endswith("-0"):
                t.steps[-1].reward = 1.0
        return got

    monkeypatch.setattr(Trainer, "rollout", rollout)
    base = [*TINY, "rollout.prompts=4", "rollout.n=2", "algo.advantage=grpo", "algo.kl_coef=0",
            "algo.entropy_coef=0", "algo.minibatches=1", "train.steps=2"]
    norms = {}
    for drop in (False, True):
        run = str(tmp_path / f"run-{drop}")
        Trainer(load_config(SMOKE, [f"run.dir={run}", *base, f"algo.drop_uniform_groups={str(drop).lower()}"])).fit()
        lines = read_metrics(run)
        norms[drop] = lines[0]["grad_norm"]
    trajs = load_trajs(os.path.join(run, "trajectories", "iter_000001.jsonl.gz"))
    assert len(trajs) == 8  # every played episode is saved
    keep = informative_groups([t.group for t in trajs], [t.total_reward for t in trajs])
    assert sum(keep) == 4 and lines[0]["trained_frac"] == pytest.approx(0.5)
    assert lines[1]["trained_frac"] == 0.0 and lines[1]["skipped_updates"] == 0  # nothing to learn from
    tokens = [sum(len(s.response_ids) for s in t.steps) for t in trajs]
    kept_tokens = sum(n for n, k in zip(tokens, keep) if k)
    assert norms[True] == pytest.approx(norms[False] * sum(tokens) / kept_tokens, rel=1e-4)
    for bad in (["algo.advantage=step_gae"], ["algo.advantage=reinforce_pp_baseline"],
                ["algo.advantage=grpo", "algo.whiten=true"],
                ["algo.advantage=rloo", "algo.kl_in_reward=true", "algo.kl_coef=0.01"]):
        with pytest.raises(ConfigError, match="drop_uniform_groups"):  # a dropped group's advantage is not 0 there
            load_config(SMOKE, [*bad, "algo.drop_uniform_groups=true"])


def test_critic_warmup_and_extra_critic_epochs(tmp_path, tok_dir):
    """algo.critic_warmup=1, vf_epochs=3: the first iteration leaves the policy, its Adam state and its schedule
    untouched and steps the critic 3 times; the next one steps both (policy once, critic 3 more). With
    critic_lr=0 every critic pass sees the same critic, so its gradient must be that of the float64 textbook
    value loss 0.5 * mean_t (V(s_t) - G_t)^2, V at each step's last prompt token, G_t the return-to-go
    (step GAE with gamma = lam = 1)."""
    from test_update_textbook import hand_trajs

    cfg = load_config(SMOKE, [f"run.dir={tmp_path / 'run'}", f"model.tokenizer={tok_dir}", "algo.kl_coef=0",
                              "algo.entropy_coef=0", "algo.minibatches=1", "train.grad_clip=0", "train.critic_lr=0",
                              "algo.critic_warmup=1", "algo.vf_epochs=3", "log.tensorboard=false",
                              "log.trajectories=false"])
    trainer = Trainer(cfg)
    trajs = hand_trajs(append_only=True)
    trainer.rollout = lambda it: Rollout(trajs)
    critic = trainer.learner.critic
    critic.zero_grad(set_to_none=True)
    loss = torch.zeros((), dtype=torch.float64)
    steps = [(s, sum(u.reward for u in t.steps[si:])) for t in trajs for si, s in enumerate(t.steps)]
    for s, ret in steps:
        value = critic(torch.tensor([s.prompt_ids]))[0, len(s.prompt_ids) - 1].double()
        loss = loss + 0.5 * (value - ret) ** 2 / len(steps)
    loss.backward()
    want = torch.cat([p.grad.flatten().double() for p in critic.parameters() if p.grad is not None])
    critic.zero_grad(set_to_none=True)
    policy_before = {k: v.clone() for k, v in trainer.learner.policy.state_dict().items()}

    def steps_taken(opt):
        return [int(st["step"]) for st in opt.state.values()]

    m = trainer.iteration(0)
    assert all(torch.equal(v, trainer.learner.policy.state_dict()[k]) for k, v in policy_before.items())
    assert steps_taken(trainer.learner.opt) == [] and trainer.learner.sched.last_epoch == 0
    assert set(steps_taken(trainer.learner.copt)) == {3} and "grad_norm" not in m and m["critic_grad_norm"] > 0
    got = torch.cat([p.grad.flatten().double() for p in critic.parameters() if p.grad is not None])
    assert float((got - want).norm() / want.norm()) < 1e-4
    m = trainer.iteration(1)
    assert set(steps_taken(trainer.learner.opt)) == {1} and set(steps_taken(trainer.learner.copt)) == {6} and m["grad_norm"] > 0


def test_reward_moments_run_over_iterations_and_resume(tmp_path, tok_dir):
    """algo.normalize_reward: the running (count, sum, sum of squares) add every iteration's step rewards
    (float64 sums of the hand-made batch, twice) and come back from the checkpoint on resume."""
    from test_update_textbook import hand_trajs

    trajs = hand_trajs(append_only=False)
    rewards = [s.reward for t in trajs for s in t.steps]
    args = [f"run.dir={tmp_path / 'run'}", f"model.tokenizer={tok_dir}", "algo.normalize_reward=std",
            "train.steps=2", "log.tensorboard=false", "log.trajectories=false"]
    trainer = Trainer(load_config(SMOKE, args))
    trainer.rollout = lambda it: Rollout(trajs)
    trainer.fit()
    want = [2.0 * len(rewards), 2.0 * sum(rewards), 2.0 * sum(r * r for r in rewards)]
    assert trainer.reward_moments.tolist() == pytest.approx(want, rel=1e-12)
    resumed = Trainer(load_config(SMOKE, args + ["run.resume=true", "train.steps=3"]))
    assert resumed.start == 2 and resumed.reward_moments.tolist() == pytest.approx(want, rel=1e-12)
