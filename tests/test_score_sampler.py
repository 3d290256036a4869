"""train.score_policy=sampler: the sampler's recorded logprobs are the old ones, and scoring runs no policy forward.

Not exact against scoring (a choice of algorithm: PPO's ratio against the
policy that sampled), so the reference is the scored update with its old
logprobs replaced by the sampler's, on a float64 model, with two mini-batches
so the weights move inside the update: the same gradients, parameters and
losses for each policy loss, no policy forward while scoring, and the
sampler-trainer gap logged from the first mini-batch alone (the weights
scoring would have used). In an iteration: a reference KL is taken against the
sampler's logprobs; during the critic's warm-up the policy is scored as before.
"""
import copy

import pytest
import torch

from r1 import packing
from r1 import trainer as trainer_module
from r1.config import ConfigError, load_config
from r1.credit import compute, credit_inputs, sampler_logprobs, score_metrics, step_rewards
from r1.trainer import Trainer
from test_score_policy import (assert_same_update, counting_score, float64_models, grads_and_params, restore,
                               score_counted)
from test_trainer import SMOKE, TINY

MINIBATCHES = 2


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    run = tmp_path_factory.mktemp("score_sampler") / "run"
    cfg = load_config(SMOKE, [f"run.dir={run}", *TINY, "rollout.n=3", f"algo.minibatches={MINIBATCHES}",
                              "algo.kl_coef=0", "train.micro_tokens=64", "train.score_policy=sampler",
                              "log.tensorboard=false", "log.trajectories=false"])
    return Trainer(cfg)


def one_update(tr, trajs, state, from_sampler: bool):
    """score (the policy's forwards counted), credit and update of `trajs` from `state`. from_sampler=False:
    the reference, the policy scored and its old logprobs then replaced by the sampler's. Returns (policy
    forwards in scoring, the plan, metrics, gradients, parameters after, the scored old logprobs)."""
    L = tr.learner
    restore(L, state)
    plan = packing.plan(trajs, MINIBATCHES, tr.cfg.train.micro_tokens, tr.device)
    scores, calls = score_counted(L, plan, policy=not from_sampler)
    batch = credit_inputs(trajs, plan, scores, step_rewards(trajs), tr.cfg.algo, tr.d)
    sampler = sampler_logprobs(trajs, batch.tok_step)
    scored_old = None
    if not from_sampler:
        scored_old = [s.old_logp.clone() for s in scores]
        sizes = [mb.sel.numel() for mb in plan.micro_batches]
        for s, part in zip(scores, torch.split(sampler, sizes)):
            s.old_logp = part.to(s.old_logp)
    credit = compute(batch, tr.cfg.algo)
    metrics = score_metrics(batch, credit, sampler, tr.d, gap=False)
    saved = tr.cfg.train.score_policy
    tr.cfg.train.score_policy = "sampler" if from_sampler else "always"
    try:
        metrics.update(L.update(plan, [0] * len(plan.minibatches), scores, credit, sampler, 5))
    finally:
        tr.cfg.train.score_policy = saved
    return calls, plan, metrics, *grads_and_params(L), (scored_old, sampler)


@pytest.mark.parametrize("loss", ["ppo", "decoupled_ppo", "cispo"])
def test_the_sampler_logprobs_are_the_old_ones(trainer, loss):
    tr = trainer
    assert tr.learner.old_from_sampler(5) and not tr.learner.reuses_logprobs(5)
    trajs = tr.rollout(0).trajectories
    with float64_models(tr, loss) as state:
        calls_r, plan, ref, g_r, after_r, (scored_old, sampler) = one_update(tr, trajs, state, from_sampler=False)
        calls_s, _, out, g_s, after_s, _ = one_update(tr, trajs, state, from_sampler=True)
    n_mb = len(plan.micro_batches)
    assert len(plan.minibatches) == MINIBATCHES and calls_r == n_mb and calls_s == 0
    assert_same_update(g_r, g_s, after_r, after_s, tr.cfg.train.lr)  # the same loss on the same weights
    for k in ("pg_loss", "value_loss", "entropy", "grad_norm", "critic_grad_norm", "clip_frac"):
        assert out[k] == pytest.approx(ref[k], rel=1e-6, abs=1e-12), k
    # the gap: of the first mini-batch's tokens only, on the weights the reference scored with
    first = len(plan.minibatches[0])
    masks = [mb.mask.bool() for mb in plan.micro_batches[:first]]
    sizes = [mb.sel.numel() for mb in plan.micro_batches]
    err = torch.cat([(o.double() - s.double()).abs()[m] for o, s, m in
                     zip(scored_old[:first], torch.split(sampler, sizes)[:first], masks)])
    assert err.numel() > 0 and first < n_mb
    assert out["logprob_gap_mean"] == pytest.approx(float(err.mean()), rel=1e-5)
    assert out["logprob_gap_max"] == pytest.approx(float(err.max()), rel=1e-5)
    # the sampler's logprobs differ from the trainer's, so old = sampler's is told apart from old = own here
    assert out["logprob_gap_max"] > 0


def test_the_iteration_scores_no_policy_and_takes_a_reference_kl_against_the_sampler(trainer, monkeypatch):
    L, calls, seen = trainer.learner, [], {}
    real_compute = trainer_module.compute_credit

    def compute_credit(batch, algo):
        seen["old"] = batch.old_logp
        seen["tok_step"] = batch.tok_step
        return real_compute(batch, algo)

    monkeypatch.setattr(L, "score", counting_score(L, calls))
    monkeypatch.setattr(trainer_module, "compute_credit", compute_credit)
    trajs = []
    real_trained = trainer.trained_trajectories
    monkeypatch.setattr(trainer, "trained_trajectories", lambda played: trajs.extend(real_trained(played)) or trajs)
    L.ref = L.ref_fwd = copy.deepcopy(L.policy)  # a reference model: its forward runs, the policy's does not
    trainer.cfg.algo.kl_coef = 0.1
    try:
        out = trainer.iteration(1)
    finally:
        L.ref, L.ref_fwd, trainer.cfg.algo.kl_coef = None, None, 0.0
    assert calls == [] and out["skipped_updates"] == 0
    assert torch.equal(seen["old"], sampler_logprobs(trajs, seen["tok_step"]))
    assert out["kl_ref"] >= 0 and out["logprob_gap_max"] >= out["logprob_gap_mean"] >= 0


def test_the_critic_warm_up_scores_the_policy(trainer):
    a = trainer.cfg.algo
    a.critic_warmup = 3
    try:
        assert not trainer.learner.old_from_sampler(2) and trainer.learner.old_from_sampler(3)
    finally:
        a.critic_warmup = 0
    trainer.cfg.train.score_policy = "always"
    try:
        assert not trainer.learner.old_from_sampler(5)
    finally:
        trainer.cfg.train.score_policy = "sampler"


def test_the_config_takes_it_and_names_the_choices(tmp_path):
    cfg = load_config(SMOKE, [f"run.dir={tmp_path}", "train.score_policy=sampler"])
    assert cfg.train.score_policy == "sampler"
    with pytest.raises(ConfigError, match="auto, always, sampler"):
        load_config(SMOKE, [f"run.dir={tmp_path}", "train.score_policy=behaviour"])
