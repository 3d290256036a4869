"""The trainer's real score -> credit -> update path against the textbook loss, in float64.

Hand-made trajectories replace the rollout: two groups of two episodes with
1 to 3 steps and different lengths, either append-only (one packed sequence
per episode) or with a rewritten context (each step its own sequence, as the
window / truncate / summary policies give). One iteration with one epoch and
one mini-batch has ratio 1, so the gradient of every surrogate is that of
    L = sum_j w_j sum_{i in j} -A_i log pi(token i),
with j a trajectory and w_j = 1 / J (seq_mean_token_sum) or 1 / (J n_j)
(seq_mean_token_mean), n_j the sampled tokens of trajectory j. The reference
recomputes every step's logprobs unpacked and builds L in float64; the
trainer's gradient (grad_clip off) must match it for any micro-batch split
(train.micro_tokens) and either ratio level (the ratio's segment is the step,
the aggregation's the trajectory).
"""
import math
import random
import shutil

import pytest
import torch

from r1.config import load_config
from r1.overlap import Rollout
from r1.trainer import Trainer
from r1.trajectory import Step, Trajectory
from test_trainer import SMOKE

REWARDS = {0: [[0.0, 1.0], [0.0]], 1: [[0.0, 0.0, 1.0], [0.5]]}  # group -> episodes -> step rewards


def hand_trajs(append_only: bool):
    rng = random.Random(1)
    out = []
    for g, episodes in REWARDS.items():
        for k, rewards in enumerate(episodes):
            prompt, steps = [rng.randrange(10, 900) for _ in range(4 + k)], []
            for si, r in enumerate(rewards):
                resp = [rng.randrange(10, 900) for _ in range(3 + 2 * si + g)]
                steps.append(Step(list(prompt), resp, [0.0] * len(resp), reward=r))
                tail = prompt + resp + [rng.randrange(10, 900) for _ in range(2)]
                prompt = tail if append_only else tail[-5:]  # a rewritten context: not a prefix
            out.append(Trajectory(f"0-{g}-{k}", g, str(g), steps, termination="answered"))
    return out


def grpo_textbook(trajs):
    """GRPO on trajectory totals: (s - mean_g) / (unbiased std_g + 1e-6), float64."""
    adv = []
    for t in trajs:
        scores = [u.total_reward for u in trajs if u.group == t.group]
        mu = sum(scores) / len(scores)
        sd = math.sqrt(sum((s - mu) ** 2 for s in scores) / (len(scores) - 1))
        adv.append((t.total_reward - mu) / (sd + 1e-6))
    return adv


def reference_grad(policy, trajs, adv, agg, temperature):
    policy.zero_grad(set_to_none=True)
    loss = torch.zeros((), dtype=torch.float64)
    for t, a in zip(trajs, adv):
        n = sum(len(s.response_ids) for s in t.steps)
        if agg == "token_mean":
            w = 1.0 / sum(len(s.response_ids) for u in trajs for s in u.steps)
        else:
            w = 1.0 / len(trajs) if agg == "seq_mean_token_sum" else 1.0 / (len(trajs) * n)
        for s in t.steps:
            ids = torch.tensor([s.prompt_ids + s.response_ids])
            logits = policy(ids)[0].double() / temperature
            logp = torch.log_softmax(logits, -1)[len(s.prompt_ids) - 1:-1].gather(
                1, torch.tensor(s.response_ids)[:, None])[:, 0]
            loss = loss + w * (-a * logp).sum()
    loss.backward()
    grad = torch.cat([p.grad.flatten().double() for p in policy.parameters() if p.grad is not None])
    policy.zero_grad(set_to_none=True)
    return grad


@pytest.fixture(scope="module")
def trainer(tmp_path_factory, tok_dir):
    run = tmp_path_factory.mktemp("textbook") / "run"
    cfg = load_config(SMOKE, [f"run.dir={run}", f"model.tokenizer={tok_dir}", "algo.advantage=grpo",
                              "algo.kl_coef=0", "algo.entropy_coef=0", "algo.minibatches=1", "train.grad_clip=0",
                              "log.tensorboard=false", "log.trajectories=false"])
    yield Trainer(cfg)
    shutil.rmtree(run.parent, ignore_errors=True)  # module-scoped: pytest's retention policy never removes it


@pytest.mark.parametrize("append_only", [True, False])
@pytest.mark.parametrize("micro_tokens", [4096, 12])
@pytest.mark.parametrize("ratio_level", ["token", "step"])
@pytest.mark.parametrize("agg", ["seq_mean_token_sum", "seq_mean_token_mean"])
def test_sequence_aggregation_matches_the_textbook_loss(trainer, agg, ratio_level, micro_tokens, append_only):
    trajs = hand_trajs(append_only)
    start = {k: v.clone() for k, v in trainer.learner.policy.state_dict().items()}
    a = trainer.cfg.algo
    a.loss_agg, a.ratio_level, trainer.cfg.train.micro_tokens = agg, ratio_level, micro_tokens
    want = reference_grad(trainer.learner.policy, trajs, grpo_textbook(trajs), agg, trainer.cfg.rollout.temperature)
    trainer.rollout = lambda it: Rollout(trajs)
    try:
        trainer.iteration(0)
        got = torch.cat([p.grad.flatten().double() for p in trainer.learner.policy.parameters() if p.grad is not None])
    finally:
        trainer.learner.policy.load_state_dict(start)
        del trainer.rollout
    err = float((got - want).norm() / want.norm())
    assert err < 1e-4, f"relative gradient error {err:.3g}"
