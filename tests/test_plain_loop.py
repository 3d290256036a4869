"""The trainer is the algorithm: a plain synchronous loop of the building blocks, written here, trains as it.

The loop below is what r1/trainer.py's module docstring says an iteration is
(actor play -> learner score -> credit -> learner update), with nothing
around it: no overlap, no telemetry, no checks, one process. On the smoke
config (CPU, float32, one thread count for both) every step is the same
computation in the same order on the same weights, so the comparison is
exact: every metric that is not a clock, and every parameter of the policy
and the critic after the last update, bit for bit.
"""
import torch

from r1 import packing
from r1.actor import Actor
from r1.config import load_config
from r1.credit import compute, credit_inputs, normalized_rewards, sampler_logprobs, score_metrics, step_rewards
from r1.distributed import Dist
from r1.generate import Sampling
from r1.learner import Learner, build_models
from r1.rollout_stats import summarize, traj_stats
from r1.run import run_tokenizer
from r1.tasks.data import epoch_order, load_rows
from r1.trainer import Trainer
from test_trainer import SMOKE, TINY

STEPS = 3
CLOCKS = ("time_", "cpu_")  # and the *_tok_s throughputs: wall-clock quantities, never equal twice


def plain_loop(cfg, steps: int) -> tuple:
    """The RL loop of the building blocks -> (each iteration's metrics, the learner)."""
    d = Dist(0, 1, 0, torch.device("cpu"))
    torch.manual_seed(cfg.run.seed)
    tok = run_tokenizer(cfg)
    rows = load_rows(cfg, "train")
    policy, critic, ref = build_models(cfg, tok, d.device)
    learner = Learner(cfg, tok, d, torch.float32, policy, critic, ref, checkpointing=False)
    actor = Actor(cfg, tok, policy, cfg.rollout.slots, d)  # one float32 process: it samples with the policy itself
    r, algo, moments = cfg.rollout, cfg.algo, torch.zeros(3, dtype=torch.float64)
    lines = []
    for it in range(steps):
        order = [epoch_order(len(rows), f"{cfg.run.seed}:{k // len(rows)}")[k % len(rows)]
                 for k in range(it * r.prompts, (it + 1) * r.prompts)]
        sampling = Sampling(r.temperature, r.top_p, r.top_k, seed=hash((cfg.run.seed, it)) % 2**31)
        trajs = actor.play([rows[i] for i in order], r.n, sampling,  # 1. rollout
                           policy_version=it, uid_prefix=f"{it}-", groups=range(r.prompts))
        plan = packing.plan(trajs, algo.minibatches, cfg.train.micro_tokens, d.device, cfg.train.share_prefix)
        scores = learner.score(plan.micro_batches)  # 2. score
        rewards = normalized_rewards(step_rewards(trajs), moments, algo.normalize_reward, d)
        batch = credit_inputs(trajs, plan, scores, rewards, algo, d)
        sampler_logp = sampler_logprobs(trajs, batch.tok_step)
        credit = compute(batch, algo)  # 3. credit
        metrics = summarize([traj_stats(t) for t in trajs])
        metrics.update(score_metrics(batch, credit, sampler_logp, d))
        metrics.update(learner.update(plan, [0] * len(plan.minibatches), scores, credit, sampler_logp, it))  # 4.
        metrics["lr"] = learner.sched.get_last_lr()[0]
        lines.append(metrics)
    return lines, learner


def test_a_plain_loop_of_the_building_blocks_trains_as_the_trainer(tmp_path, monkeypatch):
    cfg = load_config(SMOKE, [f"run.dir={tmp_path / 'run'}", *TINY, f"train.steps={STEPS}", "run.save=false",
                              "log.tensorboard=false", "log.trajectories=false"])
    trainer = Trainer(cfg)
    logged = []
    monkeypatch.setattr(trainer.logger, "log", lambda it, m: logged.append(m))
    trainer.fit()
    plain, learner = plain_loop(cfg, STEPS)

    assert len(logged) == len(plain) == STEPS
    for it, (got, want) in enumerate(zip(logged, plain)):
        got = {k: v for k, v in got.items() if not k.startswith(CLOCKS) and not k.endswith("_tok_s")}
        assert got == want, it  # the same keys, every value bit for bit
    assert logged[-1]["grad_norm"] > 0 and logged[0]["n"] == cfg.rollout.prompts * cfg.rollout.n
    for name in ("policy", "critic"):
        mine, theirs = getattr(trainer.learner, name).state_dict(), getattr(learner, name).state_dict()
        assert mine.keys() == theirs.keys()
        assert all(torch.equal(mine[k], theirs[k]) for k in mine), name
    # the updates moved the weights: the comparison is of trained models, not of two copies of the start
    torch.manual_seed(cfg.run.seed)
    start = build_models(cfg, trainer.tok, torch.device("cpu"))[0].state_dict()
    trained = trainer.learner.policy.state_dict()
    assert any(not torch.equal(start[k], trained[k]) for k in start)
