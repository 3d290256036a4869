"""What a micro-batch costs the host in score and update, outside the models: no boolean gathers (each
reads its size back from the device, a sync) and at most one host read per micro-batch (the logprob
head's range check on its targets). docs/decisions.md ("Micro-batch size"): PPO's update was 8x slower with 16x more micro-batches
on a GPU; these are the per-micro-batch syncs found on the CPU and removed (the update's parameters stay
bit for bit what they were)."""
import collections

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from r1 import packing
from r1.config import load_config
from r1.credit import compute, credit_inputs, sampler_logprobs, step_rewards
from r1.learner import _accumulate, _explained_variance, _value_moments
from r1.trainer import Trainer
from test_trainer import SMOKE, TINY


def counted(fn):
    with profile(activities=[ProfilerActivity.CPU]) as p:
        out = fn()
    return out, collections.Counter(e.name for e in p.events())


@pytest.mark.parametrize("advantage, reuse", [("step_gae", False), ("token_gae", False), ("step_gae", True)])
def test_host_reads_per_micro_batch(tmp_path, advantage, reuse):
    """reuse: scoring leaves the old logprobs to the update (train.score_policy=auto), which logs the gap."""
    cfg = load_config(SMOKE, [f"run.dir={tmp_path / 'run'}", *TINY, f"algo.advantage={advantage}", "algo.kl_coef=0",
                              "algo.minibatches=1", "log.tensorboard=false", "log.trajectories=false"])
    tr = Trainer(cfg)
    trajs = tr.rollout(0).trajectories
    state = {k: {n: v.clone() for n, v in m.state_dict().items()} for k, m in tr.learner.models.items()}
    reads = {}
    for micro_tokens in (1, 10**6):  # every sequence alone, or all in one
        for k, m in tr.learner.models.items():
            m.load_state_dict(state[k])
        plan = packing.plan(trajs, 1, micro_tokens, tr.device)
        scores, ev_score = counted(lambda: tr.learner.score(plan.micro_batches, 0, not reuse))
        batch = credit_inputs(trajs, plan, scores, step_rewards(trajs), cfg.algo, tr.d)
        credit = compute(batch, cfg.algo)
        logp = sampler_logprobs(trajs, batch.tok_step)
        _, ev_update = counted(lambda: tr.learner.update(plan, [0], scores, credit, logp, 5))
        assert ev_update["aten::nonzero"] == 0 and ev_update["aten::bincount"] == 0
        reads[micro_tokens] = (len(plan.micro_batches), ev_score["aten::_local_scalar_dense"],
                               ev_update["aten::_local_scalar_dense"])
    (n_many, score_many, update_many), (n_one, score_one, update_one) = reads[1], reads[10**6]
    assert n_one == 1 and n_many >= 4
    extra = n_many - n_one
    assert score_many - score_one <= extra  # the policy's target check, one read each
    assert update_many - update_one <= extra * cfg.algo.ppo_epochs


def test_value_moments_without_a_gather_match_the_gathered_ones():
    g = torch.Generator().manual_seed(0)
    pred, target = torch.randn(12, generator=g), torch.randn(12, generator=g)
    mask = (torch.rand(12, generator=g) < 0.6).float()
    m = _value_moments(pred, target, mask)
    t = target.double()[mask.bool()]
    r = t - pred.double()[mask.bool()]
    want = {"ev_t": t.mean(), "ev_t2": (t * t).mean(), "ev_r": r.mean(), "ev_r2": (r * r).mean()}
    for k, v in want.items():
        assert float(m[k]) == pytest.approx(float(v), rel=1e-14, abs=1e-15)
    # an empty micro-batch adds nothing: its moments are 0 and so is its weight
    stats = {}
    _accumulate(stats, m, mask.sum())
    _accumulate(stats, _value_moments(pred, target, torch.zeros(12)), 0.0)
    ev = _explained_variance(*(stats[k][0] / stats[k][1] for k in ("ev_t", "ev_t2", "ev_r", "ev_r2")))
    assert ev == pytest.approx(_explained_variance(*(float(want[k]) for k in ("ev_t", "ev_t2", "ev_r", "ev_r2"))))
