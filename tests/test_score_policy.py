"""train.score_policy=auto: scoring skips the policy's forward when the update's own gives the old logprobs.

With one epoch of one mini-batch, the update's forward runs on the weights
scoring would, so the old logprobs it needs are its own, detached (ratio 1).
What must hold, on a float64 model: the same gradients, parameters and
metrics as scoring them (always), for each policy loss; the sampler gap still
logged, now from the update's forward; the scoring pass runs no policy forward;
and nothing is skipped where it is not exact (several mini-batches or epochs,
a reference model, the critic's warm-up, score_policy=always).
"""
import contextlib

import pytest
import torch

from r1 import packing
from r1.config import load_config
from r1.credit import compute, credit_inputs, sampler_logprobs, score_metrics, step_rewards
from r1.overlap import Rollout
from r1.trainer import Trainer
from test_trainer import SMOKE, TINY


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    run = tmp_path_factory.mktemp("score_policy") / "run"
    cfg = load_config(SMOKE, [f"run.dir={run}", *TINY, "rollout.n=3", "algo.minibatches=1", "algo.kl_coef=0",
                              "train.micro_tokens=64", "log.tensorboard=false", "log.trajectories=false"])
    return Trainer(cfg)


def restore(L, state):
    """The learner's models back to `state`, its optimizers' moments cleared."""
    for k, m in L.models.items():
        m.load_state_dict(state[k])
    for opt in L.optims.values():
        opt.state.clear()


def score_counted(L, plan, policy: bool):
    """L.score of the plan's micro-batches, and how many forwards the policy ran in it."""
    calls = []
    hook = L.policy.register_forward_hook(lambda *a: calls.append(1))
    try:
        return L.score(plan.micro_batches, 0, policy=policy), len(calls)
    finally:
        hook.remove()


def counting_score(L, calls: list):
    """L.score that appends to `calls` for each forward the policy runs in it (to put in its place)."""
    real_score = L.score

    def score(*args, **kwargs):
        hook = L.policy.register_forward_hook(lambda *a: calls.append(1))
        try:
            return real_score(*args, **kwargs)
        finally:
            hook.remove()
    return score


def grads_and_params(L):
    """Every model's gradients and state after an update, by qualified name."""
    grads = {f"{k}.{n}": p.grad.clone() for k, m in L.models.items() for n, p in m.named_parameters()
             if p.grad is not None}
    return grads, {f"{k}.{n}": v.clone() for k, m in L.models.items() for n, v in m.state_dict().items()}


@contextlib.contextmanager
def float64_models(tr, loss: str):
    """The learner's models in float64 and `loss` the policy loss inside; yields their state, to which
    they return, in float32, with their optimizers' moments cleared and the policy loss back to ppo."""
    tr.cfg.algo.policy_loss = loss
    for m in tr.learner.models.values():
        m.double()
    state = {k: {n: v.clone() for n, v in m.state_dict().items()} for k, m in tr.learner.models.items()}
    try:
        yield state
    finally:
        for m in tr.learner.models.values():
            m.float()
        restore(tr.learner, state)
        tr.cfg.algo.policy_loss = "ppo"


def assert_same_update(g_a, g_b, after_a, after_b, lr):
    """Gradients and parameters after the step equal to float32 rounding of the losses' inputs."""
    assert g_a.keys() == g_b.keys() and any(n.startswith("policy.") for n in g_a)
    for n, g in g_a.items():  # the losses take logprobs in float32 (.float()): a 1e-15 difference of the two
        # forwards can round to the next float32, 1e-7 of that token's term
        assert torch.allclose(g, g_b[n], rtol=0, atol=1e-6 * g.abs().max().item()), n
    for n, v in after_a.items():  # AdamW's first step: lr * g / (|g| + eps), see test_share_prefix
        assert torch.allclose(v, after_b[n], rtol=0, atol=1e-4 * lr), n


def one_update(tr, trajs, state, reuse: bool):
    """score (the policy's forwards counted), credit and update of `trajs` from `state`; returns
    (policy forwards in scoring, metrics, gradients, parameters after)."""
    L = tr.learner
    restore(L, state)
    plan = packing.plan(trajs, 1, tr.cfg.train.micro_tokens, tr.device)
    scores, calls = score_counted(L, plan, policy=not reuse)
    batch = credit_inputs(trajs, plan, scores, step_rewards(trajs), tr.cfg.algo, tr.d)
    credit = compute(batch, tr.cfg.algo)
    sampler = sampler_logprobs(trajs, batch.tok_step)
    metrics = score_metrics(batch, credit, sampler, tr.d, gap=not reuse)
    metrics.update(L.update(plan, [0], scores, credit, sampler, 5))
    return calls, len(plan.micro_batches), metrics, *grads_and_params(L)


@pytest.mark.parametrize("loss", ["ppo", "decoupled_ppo", "cispo"])
def test_the_updates_own_logprobs_give_the_scored_update(trainer, loss):
    tr = trainer
    assert tr.learner.ref is None and tr.learner.reuses_logprobs(5)
    trajs = tr.rollout(0).trajectories
    with float64_models(tr, loss) as state:
        calls_s, n_mb, scored, g_s, after_s = one_update(tr, trajs, state, reuse=False)
        calls_r, _, reused, g_r, after_r = one_update(tr, trajs, state, reuse=True)
    assert n_mb > 1 and calls_s == n_mb and calls_r == 0  # several micro-batches; none scored by the policy
    assert_same_update(g_s, g_r, after_s, after_r, tr.cfg.train.lr)
    for k in ("pg_loss", "value_loss", "entropy", "grad_norm", "critic_grad_norm", "logprob_gap_mean",
              "logprob_gap_max"):
        assert reused[k] == pytest.approx(scored[k], rel=1e-6, abs=1e-12), k
    assert scored["logprob_gap_max"] > 0 and scored["logprob_gap_max"] >= scored["logprob_gap_mean"]


def test_the_iteration_skips_it_and_still_logs_the_gap(trainer):
    L, calls = trainer.learner, []
    L.score = counting_score(L, calls)
    try:
        out = trainer.iteration(1)
    finally:
        del L.score
    assert calls == [] and out["skipped_updates"] == 0
    assert out["logprob_gap_max"] >= out["logprob_gap_mean"] >= 0


@pytest.mark.parametrize("change", [{"minibatches": 2}, {"ppo_epochs": 2}, {"critic_warmup": 3},
                                    {"score_policy": "always"}, {"ref": True}])
def test_not_skipped_where_it_is_not_exact(trainer, change):
    L, a = trainer.learner, trainer.cfg.algo
    saved = (a.minibatches, a.ppo_epochs, a.critic_warmup, trainer.cfg.train.score_policy, L.ref)
    try:
        a.minibatches = change.get("minibatches", 1)
        a.ppo_epochs = change.get("ppo_epochs", 1)
        a.critic_warmup = change.get("critic_warmup", 0)
        trainer.cfg.train.score_policy = change.get("score_policy", "auto")
        L.ref = L.policy if change.get("ref") else None
        assert not L.reuses_logprobs(2)
        if "critic_warmup" in change:
            assert L.reuses_logprobs(3)  # the warm-up is over at iteration 3
    finally:
        a.minibatches, a.ppo_epochs, a.critic_warmup, trainer.cfg.train.score_policy, L.ref = saved
    assert L.reuses_logprobs(2)


def test_the_config_names_its_choices(tmp_path):
    from r1.config import ConfigError

    with pytest.raises(ConfigError, match="train.score_policy"):
        load_config(SMOKE, [f"run.dir={tmp_path}", "train.score_policy=never"])


@pytest.mark.parametrize("score_policy", ["auto", "always"])
def test_lora_dropout_keeps_on_policy_behaviour_weights_exactly_one(tmp_path, score_policy):
    """model.lora_dropout > 0: the update's forward drops adapter inputs, scoring's does not, so `auto` must
    score. On on-policy data (each step's stored logprobs are the policy's scored ones, bit for bit) the
    decoupled-PPO weight old/sampler is then exactly 1 and the behaviour KL exactly 0; reusing the update's
    forward made them dropout noise."""
    cfg = load_config(SMOKE, [f"run.dir={tmp_path / 'run'}", *TINY, "model.lora_rank=4", "model.lora_alpha=8",
                              "model.lora_dropout=0.3", "algo.minibatches=1", "algo.kl_coef=0",
                              "algo.policy_loss=decoupled_ppo", f"train.score_policy={score_policy}",
                              "log.tensorboard=false", "log.trajectories=false"])
    tr = Trainer(cfg)
    tr.iteration(0)  # the adapters' B starts at 0, where dropout on their input changes nothing
    trajs = tr.rollout(1).trajectories
    plan = packing.plan(trajs, 1, tr.cfg.train.micro_tokens, tr.device, tr.cfg.train.share_prefix)
    scores = tr.learner.score(plan.micro_batches)
    tok_step = torch.cat([mb.tok_step for mb in plan.micro_batches])
    flat = torch.cat([s.old_logp for s in scores])[torch.sort(tok_step, stable=True).indices].tolist()
    k = 0
    for step in (s for t in trajs for s in t.steps):  # the sampler's logprobs := the policy's, exactly
        step.logprobs, k = flat[k:k + len(step.response_ids)], k + len(step.response_ids)
    assert k == len(flat)
    tr.rollout = lambda it: Rollout(trajs)
    m = tr.iteration(1)
    assert (m["behav_weight_mean"], m["behav_kl"], m["behav_capped_frac"]) == (1.0, 0.0, 0.0)
    assert not tr.learner.reuses_logprobs(1)
