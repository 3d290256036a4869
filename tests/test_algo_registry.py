"""The estimator and policy-loss tables: config choices come from them, unknown names and keys that do not
apply are config errors, the worked example of docs/algorithms.md trains, and the pieces added with them
(CISPO, global whitening, reward normalisation) match float64 loops."""
import math
import os
import re
import statistics
import threading

import pytest
import torch

from r1.algos.cispo import cispo_policy_loss
from r1.algos.estimators import ESTIMATORS
from r1.algos.policy_losses import POLICY_LOSSES
from r1.algos.reward_norm import normalize_rewards, reward_moments
from r1.config import Algo, ConfigError, load_config
from r1.credit import CreditInputs, compute
from r1.overlap import Rollout
from test_trainer import ROOT, SMOKE

F64 = torch.float64
DOC = os.path.join(ROOT, "docs", "algorithms.md")


# ---------------------------------------------------------------- config from the tables
def test_every_table_entry_is_a_config_choice():
    for name, est in ESTIMATORS.items():
        cfg = load_config(SMOKE, [f"algo.advantage={name}"])
        assert cfg.algo.advantage == name
    for name in POLICY_LOSSES:
        assert load_config(SMOKE, [f"algo.policy_loss={name}"]).algo.policy_loss == name


@pytest.mark.parametrize("key, value, closest", [("algo.advantage", "grp", "grpo"),
                                                  ("algo.advantage", "reinforce_p", "reinforce_pp"),
                                                  ("algo.policy_loss", "cisp", "cispo")])
def test_unknown_name_is_a_config_error_with_the_closest_names(key, value, closest):
    with pytest.raises(ConfigError) as e:
        load_config(SMOKE, [f"{key}={value}"])
    msg = str(e.value)
    assert "\n" not in msg and f"'{key}'" in msg and f"closest: {closest}" in msg


@pytest.mark.parametrize("overrides, key", [
    (["algo.advantage=grpo", "algo.lam=0.95"], "algo.lam"),  # GAE's lambda, no GAE
    (["algo.advantage=rloo", "algo.grpo_std_norm=false"], "algo.grpo_std_norm"),
    (["algo.advantage=grpo", "algo.vf_coef=0.5"], "algo.vf_coef"),  # no critic
    (["algo.advantage=grpo", "algo.vf_epochs=2"], "algo.vf_epochs"),
    (["algo.advantage=reinforce_pp", "algo.critic_warmup=1"], "algo.critic_warmup"),
    (["algo.advantage=reinforce_pp", "algo.whiten=true"], "algo.whiten"),  # it whitens already
    (["algo.advantage=step_gae", "algo.reward_level=step"], "algo.reward_level"),
    (["algo.advantage=grpo", "algo.gamma=0.9"], "algo.gamma"),  # trajectory totals are undiscounted
    (["algo.policy_loss=cispo", "algo.dual_clip=3"], "algo.dual_clip"),
    (["algo.policy_loss=cispo", "algo.ratio_level=step"], "algo.ratio_level"),
    (["algo.clip_low=1.0"], "algo.clip_low"),  # PPO's lower clip bound would be 0
])
def test_keys_that_do_not_apply_are_refused(overrides, key):
    with pytest.raises(ConfigError) as e:
        load_config(SMOKE, overrides)
    msg = str(e.value)
    assert "\n" not in msg and f"'{key}'" in msg and "(command line)" in msg


def test_a_later_layer_that_switches_the_estimator_leaves_the_base_keys_dormant_with_a_warning():
    """gsm8k_tool.yaml sets lam and vf_coef for its PPO; `algo.advantage=grpo` on the command line (the README's
    GRPO run) switches the estimator, so those are dormant: a warning names them, the run starts."""
    base = os.path.join(ROOT, "configs", "gsm8k_tool.yaml")
    with pytest.warns(UserWarning, match=r"'algo.lam' in .*gsm8k_tool.yaml:\d+ does not apply") as record:
        cfg = load_config(base, ["algo.advantage=grpo"])
    assert cfg.algo.advantage == "grpo" and any("algo.vf_coef" in str(w.message) for w in record)
    with pytest.raises(ConfigError, match="'algo.lam' \\(command line\\) does not apply"):
        load_config(base, ["algo.advantage=grpo", "algo.lam=0.9"])  # set with the choice: refused


@pytest.mark.parametrize("overrides, refused_without", [
    ({"algo.advantage": "grpo", "algo.reward_level": "step", "algo.gamma": 0.9, "algo.whiten": True},
     ("algo.reward_level", "trajectory", "algo.gamma")),
    ({"algo.policy_loss": "cispo", "algo.clip_low": 1.0, "algo.clip_high": 0.28, "algo.tis_cap": 2.0},
     ("algo.policy_loss", "ppo", "algo.clip_low")),
    ({"algo.ratio_level": "step", "algo.loss_agg": "seq_mean_token_mean"},  # both segments carried
     ("algo.policy_loss", "cispo", "algo.ratio_level")),
    ({"algo.vf_epochs": 3, "algo.critic_warmup": 2, "algo.normalize_reward": "std"},
     ("algo.advantage", "grpo", "algo.vf_epochs")),
])
def test_keys_that_apply_are_accepted(overrides, refused_without):
    """Keys the chosen estimator and loss read are taken as given, without a warning that they are ignored; with
    another choice that does not read one of them, the same keys are refused naming it."""
    import warnings

    from r1.config import get

    args = [f"{k}={v}" for k, v in overrides.items()]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cfg = load_config(SMOKE, args)
    assert {k: get(cfg, k) for k in overrides} == overrides
    choice, other, culprit = refused_without
    with pytest.raises(ConfigError, match=re.escape(f"'{culprit}'")):
        load_config(SMOKE, args + [f"{choice}={other}"])


def test_every_ablation_layers_on_its_base_config():
    folder = os.path.join(ROOT, "configs", "ablations")
    names = sorted(f for f in os.listdir(folder) if f.endswith(".yaml"))
    assert {"whiten.yaml", "normalize_reward.yaml", "critic_warmup.yaml", "cispo.yaml"} <= set(names)
    for name in names:
        # lora.yaml is layered after synchronous.yaml (its adapters generator cannot run in a rollout process)
        base = ["gsm8k_tool.yaml"] + (["ablations/synchronous.yaml"] if name == "lora.yaml" else [])
        load_config([os.path.join(ROOT, "configs", b) for b in base] + [os.path.join(folder, name)])


# ---------------------------------------------------------------- the worked example of the docs
def doc_example() -> str:
    text = open(DOC).read()
    section = text[text.index("## Add your own estimator or loss"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_doc_example_registers_and_trains_with_the_textbook_gradient(tmp_path, tok_dir):
    """The docs' code, run as written: REINFORCE (no baseline) + a plain policy gradient train one iteration,
    whose gradient is that of sum_i -R_traj(i) log pi(token i) / tokens (token_mean), in float64."""
    from r1.trainer import Trainer
    from test_update_textbook import hand_trajs, reference_grad

    exec(compile(doc_example(), DOC, "exec"), {})
    try:
        assert not ESTIMATORS["reinforce"].needs_critic
        cfg = load_config(SMOKE, [f"run.dir={tmp_path / 'run'}", f"model.tokenizer={tok_dir}",
                                  "algo.advantage=reinforce", "algo.policy_loss=vanilla_pg", "algo.kl_coef=0",
                                  "algo.entropy_coef=0", "algo.minibatches=1", "train.grad_clip=0",
                                  "log.tensorboard=false", "log.trajectories=false"])
        trainer = Trainer(cfg)
        assert trainer.learner.critic is None
        trajs = hand_trajs(append_only=False)
        want = reference_grad(trainer.learner.policy, trajs, [t.total_reward for t in trajs], "token_mean", 1.0)
        trainer.rollout = lambda it: Rollout(trajs)
        m = trainer.iteration(0)
        got = torch.cat([p.grad.flatten().double() for p in trainer.learner.policy.parameters() if p.grad is not None])
        assert float((got - want).norm() / want.norm()) < 1e-4
        assert m["skipped_updates"] == 0 and m["pg_loss"] < 0  # value -A per token, rewards >= 0
    finally:
        ESTIMATORS.pop("reinforce", None)
        POLICY_LOSSES.pop("vanilla_pg", None)


# ---------------------------------------------------------------- CISPO against a float64 loop
def ref_token_weights(mask, a, b, seg, agg):
    """(valid, scale) per token for the float64 loss loops: a token counts where its mask is on and both
    logprobs a, b are finite; scale is 1 / valid tokens (token_mean) or 1 / (segments * the segment's valid
    tokens) (seq_mean_token_mean)."""
    valid = [m > 0 and math.isfinite(x) and math.isfinite(y) for m, x, y in zip(mask, a, b)]
    n_seg = {}
    for v, j in zip(valid, seg):
        if v:
            n_seg[j] = n_seg.get(j, 0) + 1
    denom = sum(valid) if agg == "token_mean" else len(n_seg)
    scale = [0.0 if not v else 1.0 / denom if agg == "token_mean" else 1.0 / (denom * n_seg[j])
             for v, j in zip(valid, seg)]
    return valid, scale


def ref_cispo(logp, old, adv, mask, sampler, clip_low, clip_high, tis_cap, seg, agg):
    """Loss value and d loss / d logp, token by token in Python floats."""
    valid, scales = ref_token_weights(mask, old, sampler, seg, agg)
    loss, grad = 0.0, [0.0] * len(logp)
    for i, v in enumerate(valid):
        if not v:
            continue
        rho = math.exp(max(-20.0, min(20.0, logp[i] - old[i])))
        w = min(max(rho, 1 - clip_low), 1 + clip_high)
        if tis_cap:
            w *= min(math.exp(old[i] - sampler[i]), tis_cap)
        scale = scales[i]
        loss += -w * adv[i] * scale
        grad[i] = -w * adv[i] * scale
    return loss, grad


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean"])
@pytest.mark.parametrize("clip_low, clip_high, tis_cap", [(1.0, 0.28, 0.0), (0.2, 0.2, 2.0)])
def test_cispo_matches_float64_loop(agg, clip_low, clip_high, tis_cap):
    g = torch.Generator().manual_seed(3)
    n = 40
    logp = -torch.rand(n, generator=g, dtype=F64) * 3
    old = logp + 0.4 * torch.randn(n, generator=g, dtype=F64)
    sampler = old + 0.3 * torch.randn(n, generator=g, dtype=F64)
    adv = torch.randn(n, generator=g, dtype=F64)
    mask = (torch.rand(n, generator=g) < 0.85).to(F64)
    old[3], sampler[7] = float("nan"), float("-inf")  # dropped, counted
    seg = torch.sort(torch.randint(0, 6, (n,), generator=g)).values
    x = logp.clone().requires_grad_(True)
    loss, metrics = cispo_policy_loss(x, old, adv, mask, clip_low=clip_low, clip_high=clip_high,
                                      sampler_logp=sampler, tis_cap=tis_cap, seg_ids=seg, agg=agg)
    loss.backward()
    want, want_grad = ref_cispo(logp.tolist(), old.tolist(), adv.tolist(), mask.tolist(), sampler.tolist(),
                                clip_low, clip_high, tis_cap, seg.tolist(), agg)
    assert abs(float(loss.detach()) - want) < 1e-10
    assert torch.allclose(x.grad, torch.tensor(want_grad, dtype=F64), atol=1e-10)
    assert float(metrics["dropped_nonfinite"]) == float(mask[3] + mask[7])
    assert 0 < float(metrics["clip_frac"]) < 1


def test_cispo_keeps_the_gradient_of_tokens_ppo_clips():
    from r1.algos.losses import ppo_policy_loss

    logp = torch.tensor([0.0, 0.0], dtype=F64, requires_grad=True)
    old = torch.tensor([-1.0, 1.0], dtype=F64)  # ratios e and 1/e: both outside [0.8, 1.2]
    adv = torch.tensor([1.0, -1.0], dtype=F64)
    for fn in (ppo_policy_loss, cispo_policy_loss):
        logp.grad = None
        fn(logp, old, adv, torch.ones(2), clip_low=0.2, clip_high=0.2)[0].backward()
        if fn is ppo_policy_loss:
            assert torch.equal(logp.grad, torch.zeros(2))
        else:
            assert torch.allclose(logp.grad, torch.tensor([-1.2, 0.8], dtype=F64) / 2)


# ---------------------------------------------------------------- global batch statistics
def two_rank_batches(seed=0):
    """8 trajectories in 4 groups of 2, 1-3 steps each: the whole batch, and the two 'ranks' that deal the
    groups by parity (rank r holds groups r, r + 2, as torchrun deals prompts)."""
    g = torch.Generator().manual_seed(seed)
    trajs = []
    for ti in range(8):
        steps = int(torch.randint(1, 4, (1,), generator=g))
        lens = torch.randint(1, 4, (steps,), generator=g).tolist()
        rewards = (torch.rand(steps, generator=g) < 0.4).double().tolist()
        values = torch.rand(sum(lens), generator=g).tolist()  # critic values per token; a step's is its first
        trajs.append((ti // 2, lens, rewards, values))

    def batch(items):
        step_reward, step_traj, step_index, tok_step, tok_value, step_value = [], [], [], [], [], []
        for b, (_, lens, rewards, values) in enumerate(items):
            tok_value += values
            for si, (n, r) in enumerate(zip(lens, rewards)):
                step_value.append(values[sum(lens[:si])])
                tok_step += [len(step_reward)] * n
                step_reward.append(r)
                step_traj.append(b)
                step_index.append(si)
        tok_step = torch.tensor(tok_step, dtype=torch.long)
        step_traj = torch.tensor(step_traj, dtype=torch.long)
        M = tok_step.numel()
        return CreditInputs(groups=[item[0] for item in items], step_reward=torch.tensor(step_reward, dtype=F64),
                            step_traj=step_traj, step_index=torch.tensor(step_index, dtype=torch.long),
                            tok_step=tok_step, tok_traj=step_traj[tok_step], mask=torch.ones(M),
                            old_logp=torch.zeros(M), step_value=torch.tensor(step_value),
                            tok_value=torch.tensor(tok_value))

    return batch(trajs), [batch([t for t in trajs if t[0] % 2 == r]) for r in (0, 1)]


def threaded_all_sum(n):
    """An all-reduce (sum) for n threads: each contributes, waits for the others, reads the total."""
    barrier, lock, box = threading.Barrier(n), threading.Lock(), {}

    def all_sum(x):
        with lock:
            box["sum"] = box.get("sum", 0) + x
        barrier.wait()
        out = box["sum"].clone()
        if barrier.wait() == 0:
            box.clear()
        barrier.wait()
        return out
    return all_sum


WHITENED = [("reinforce_pp", {}), ("reinforce_pp_baseline", {}), ("grpo", {"whiten": True}),
            ("rloo", {"whiten": True, "reward_level": "step"}), ("step_gae", {"whiten": True}),
            ("token_gae", {"whiten": True, "gamma": 0.9}), ("reinforce_pp", {"reward_level": "step", "gamma": 0.5})]


@pytest.mark.parametrize("name, extra", WHITENED)
def test_whitening_is_over_the_global_batch(name, extra):
    """Two 'ranks' (threads) with an all-reduce give each trajectory the advantages of the whole batch."""
    whole, parts = two_rank_batches()
    algo = Algo(advantage=name, **extra)
    want = compute(whole, algo).advantages
    all_sum = threaded_all_sum(2)
    out = [None, None]

    def rank(r):
        parts[r].all_sum = all_sum
        out[r] = compute(parts[r], algo).advantages

    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    [t.start() for t in threads]
    [t.join(timeout=60) for t in threads]
    per_traj_want = _per_traj(whole.tok_traj, want)
    order = [[i for i in range(8) if (i // 2) % 2 == r] for r in (0, 1)]  # rank r's trajectories, globally
    got = {order[r][b]: v for r, part in enumerate(parts) for b, v in _per_traj(part.tok_traj, out[r]).items()}
    for b, v in per_traj_want.items():
        assert got[b] == pytest.approx(v, abs=1e-6), b
    local = compute(two_rank_batches()[1][0], algo).advantages  # without the all-reduce: rank 0 alone
    assert not torch.allclose(local, out[0], atol=1e-3)


def _per_traj(tok_traj, adv):
    out = {}
    for b, a in zip(tok_traj.tolist(), adv.tolist()):
        out.setdefault(b, []).append(a)
    return out


def test_an_empty_rank_still_joins_the_whitening():
    whole, _ = two_rank_batches()
    empty = CreditInputs(groups=[], step_reward=torch.zeros(0, dtype=F64), step_traj=torch.zeros(0, dtype=torch.long),
                         step_index=torch.zeros(0, dtype=torch.long), tok_step=torch.zeros(0, dtype=torch.long),
                         tok_traj=torch.zeros(0, dtype=torch.long), mask=torch.zeros(0), old_logp=torch.zeros(0))
    algo = Algo(advantage="reinforce_pp")
    all_sum = threaded_all_sum(2)
    out = [None, None]
    whole.all_sum = empty.all_sum = all_sum

    def rank(b, r):
        out[r] = compute(b, algo).advantages

    threads = [threading.Thread(target=rank, args=(b, r)) for b, r in ((whole, 0), (empty, 1))]
    [t.start() for t in threads]
    [t.join(timeout=60) for t in threads]
    whole.all_sum = None
    assert out[1].numel() == 0 and torch.allclose(out[0], compute(whole, algo).advantages)


# ---------------------------------------------------------------- reward normalisation
@pytest.mark.parametrize("mode", ["std", "mean_std"])
def test_reward_normalisation_matches_a_float64_running_loop(mode):
    g = torch.Generator().manual_seed(5)
    running, seen = torch.zeros(3, dtype=F64), []
    for it in range(4):
        rewards = (torch.randn(5 + it, generator=g, dtype=F64) * 3 + 10)
        running = running + reward_moments(rewards)
        out = normalize_rewards(rewards, running, mode)
        seen += rewards.tolist()
        mu, sd = statistics.fmean(seen), statistics.stdev(seen)
        want = [((r - mu) if mode == "mean_std" else r) / sd for r in rewards.tolist()]
        assert out.tolist() == pytest.approx(want, rel=1e-10, abs=1e-10)
    flat = torch.ones(3, dtype=F64)  # no spread: left unscaled, never multiplied by 1 / sqrt(eps)
    assert torch.equal(normalize_rewards(flat, reward_moments(flat), "std"), flat)


def test_reward_moments_count_every_reward_seen_also_dropped_groups(tmp_path, tok_dir):
    """algo.normalize_reward with algo.drop_uniform_groups: the running moments are those of every step
    reward of every episode played (the docs' and the key's "every reward seen"), also of the uniform group
    the update leaves out; the kept episodes' rewards are divided by that std (float64)."""
    from r1.trainer import Trainer
    from test_update_textbook import hand_trajs

    trajs = hand_trajs(append_only=True)
    for t in trajs:  # group 1 uniform: both its episodes total 1.0
        if t.group == 1:
            t.steps[-1].reward = 1.0 - sum(s.reward for s in t.steps[:-1])
    args = [f"run.dir={tmp_path / 'run'}", f"model.tokenizer={tok_dir}", "algo.advantage=grpo", "algo.kl_coef=0",
            "algo.drop_uniform_groups=true", "algo.normalize_reward=std", "algo.grpo_std_norm=false",
            "log.tensorboard=false", "log.trajectories=false"]
    trainer = Trainer(load_config(SMOKE, args))
    trainer.rollout = lambda it: Rollout(trajs)
    seen_by_credit = []
    import r1.trainer as trainer_module
    real = trainer_module.compute_credit
    trainer_module.compute_credit = lambda batch, algo: seen_by_credit.append(batch.step_reward) or real(batch, algo)
    try:
        m = trainer.iteration(0)
    finally:
        trainer_module.compute_credit = real
    every = [s.reward for t in trajs for s in t.steps]
    kept = [s.reward for t in trajs if t.group == 0 for s in t.steps]
    assert m["trained_frac"] == 0.5 and len(kept) < len(every)
    want = [float(len(every)), math.fsum(every), math.fsum(r * r for r in every)]
    assert trainer.reward_moments.tolist() == pytest.approx(want, rel=1e-14)
    sd = statistics.stdev(every)
    assert seen_by_credit[0].tolist() == pytest.approx([r / sd for r in kept], rel=1e-12)


# ---------------------------------------------------------------- every registry: one register(), no silent overwrite
def registries():
    from r1.algos.losses import KL_ESTIMATORS
    from r1.algos.reward_norm import MODES
    from r1.envs.context import CONTEXT_POLICIES
    from r1.envs.rewards import REWARDS
    from r1.envs.tools import TOOLS
    from r1.tasks.registry import TASKS, get_task

    get_task("synthetic")  # the built-in tasks register on first use
    return {"advantage estimator": ESTIMATORS, "policy loss": POLICY_LOSSES, "KL estimator": KL_ESTIMATORS,
            "reward normalisation": MODES, "reward term": REWARDS, "context policy": CONTEXT_POLICIES,
            "task": TASKS, "tool": TOOLS}


@pytest.mark.parametrize("what", list(registries()))
def test_a_registry_refuses_a_second_entry_under_a_name_it_holds(what):
    import copy

    table = registries()[what]
    assert table.what == what
    name, entry = next(iter(table.items()))
    other = copy.copy(entry) if table.kind else (lambda *a, **k: entry(*a, **k))  # an equal, other object
    assert other is not entry
    assert table.register(name, entry) is entry  # the same object again: no second entry
    with pytest.raises(ValueError, match=rf"^{what} '{name}' is already registered \(pass replace=True"):
        table.register(name, other)
    assert table[name] is entry
    try:
        assert table.register(name, other, replace=True) is other and table[name] is other
    finally:
        table.register(name, entry, replace=True)
    # what help texts list: a one-line description of every entry, from the entry itself
    described = table.describe()
    assert list(described) == list(table)
    assert all(line and "\n" not in line for line in described.values()), described


def test_item_assignment_cannot_overwrite_silently_either():
    from r1.envs.rewards import REWARDS, Reward

    fmt = REWARDS["format"]
    with pytest.raises(ValueError, match="^reward term 'format' is already registered"):
        REWARDS["format"] = Reward(lambda env, action, info: 1.0, "always 1")
    assert REWARDS["format"] is fmt
    REWARDS["format"] = fmt  # the same entry: nothing changes
