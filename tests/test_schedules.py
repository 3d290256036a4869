"""Each optimizer's learning-rate schedule is as long as the steps that optimizer takes.

The policy steps algo.ppo_epochs x algo.minibatches times an iteration, but not
during algo.critic_warmup; the critic steps vf_epochs (0 = ppo_epochs) x
minibatches times every iteration. The trainer runs hand-made trajectories
(no rollout) and, after every iteration, each scheduler's factor is compared
with a float64 warm-up + cosine of the steps taken so far over the steps the
run will take: both reach the floor 0.1 at the last iteration, not before.
"""
import math

import pytest

from r1.config import load_config
from r1.overlap import Rollout
from r1.trainer import Trainer
from test_trainer import SMOKE
from test_update_textbook import hand_trajs


def factor(step: int, total: int, warmup: int) -> float:
    """r1.run.lr_lambda's cosine written out: linear warm-up, then cosine to 10%."""
    if warmup and step < warmup:
        return (step + 1) / warmup
    p = min(1.0, (step - warmup) / max(1, total - warmup))
    return 0.1 + 0.45 * (1.0 + math.cos(math.pi * p))


@pytest.mark.parametrize("advantage,ppo_epochs,vf_epochs,critic_warmup,minibatches", [
    ("step_gae", 1, 3, 2, 2),  # the critic steps 3x as often as the policy, which also starts late
    ("step_gae", 2, 0, 0, 1),  # vf_epochs 0 = ppo_epochs
    ("step_gae", 1, 1, 3, 1),  # the policy trains in 2 of 5 iterations
    ("grpo", 2, 0, 0, 2),  # no critic
])
def test_schedule_factor_every_iteration(tmp_path, tok_dir, advantage, ppo_epochs, vf_epochs, critic_warmup,
                                         minibatches):
    steps, warmup = 5, 1
    args = [f"run.dir={tmp_path / 'run'}", f"model.tokenizer={tok_dir}", f"algo.advantage={advantage}",
            "algo.kl_coef=0", f"algo.ppo_epochs={ppo_epochs}", f"algo.minibatches={minibatches}",
            f"train.steps={steps}", "train.schedule=cosine", f"train.warmup={warmup}", "log.tensorboard=false",
            "log.trajectories=false"]
    critic = advantage == "step_gae"
    if critic:
        args += [f"algo.vf_epochs={vf_epochs}", f"algo.critic_warmup={critic_warmup}"]
    trainer = Trainer(load_config(SMOKE, args))
    trajs = hand_trajs(append_only=True)
    trainer.rollout = lambda it: Rollout(trajs)
    learner = trainer.learner
    policy_total = (steps - (critic_warmup if critic else 0)) * ppo_epochs * minibatches
    critic_total = steps * (vf_epochs or ppo_epochs) * minibatches
    for it in range(steps):
        m = trainer.iteration(it)
        assert m["skipped_updates"] == 0
        taken = max(0, it + 1 - (critic_warmup if critic else 0)) * ppo_epochs * minibatches
        assert learner.sched.last_epoch == taken
        assert learner.sched.get_last_lr()[0] / 1e-4 == pytest.approx(factor(taken, policy_total, warmup),
                                                                       rel=1e-12, abs=0), it
        if critic:
            c_taken = (it + 1) * (vf_epochs or ppo_epochs) * minibatches
            assert learner.csched.last_epoch == c_taken
            assert learner.csched.get_last_lr()[0] / 1e-4 == pytest.approx(factor(c_taken, critic_total, warmup),
                                                                            rel=1e-12, abs=0), it
    # the floor at the end of the run, for each model
    assert learner.sched.get_last_lr()[0] / 1e-4 == pytest.approx(0.1, rel=1e-12)
    if critic:
        assert learner.csched.get_last_lr()[0] / 1e-4 == pytest.approx(0.1, rel=1e-12)
