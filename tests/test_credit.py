"""r1/credit.py: batch layout for the algorithms, checked by hand on a small batch.

Layout used throughout: trajectory 0 has two steps (2 and 3 sampled tokens),
trajectory 1 one step (2 tokens). Tokens arrive in a shuffled order, as
micro-batches may deliver them; results must follow the tokens.
"""
import math

import pytest
import torch

from r1.config import Algo
from r1.credit import CreditInputs, compute

STEP_TRAJ = torch.tensor([0, 0, 1])
STEP_IDX = torch.tensor([0, 1, 0])
TOK_STEP = torch.tensor([0, 0, 1, 1, 1, 2, 2])
PERM = torch.tensor([6, 2, 0, 4, 1, 5, 3])


def inputs(step_reward, step_value=None, tok_value=None, ref=None, groups=(0, 0)):
    ts = TOK_STEP[PERM]
    return CreditInputs(groups=list(groups), step_reward=torch.tensor(step_reward, dtype=torch.float64),
                        step_traj=STEP_TRAJ, step_index=STEP_IDX, tok_step=ts, tok_traj=STEP_TRAJ[ts],
                        mask=torch.ones(7), old_logp=torch.zeros(7),
                        ref_logp=None if ref is None else torch.tensor(ref)[PERM],
                        step_value=torch.tensor(step_value or [0.0] * 3),
                        tok_value=None if tok_value is None else torch.tensor(tok_value)[PERM])


def run(algo, step_reward, step_value=None, tok_value=None, ref=None, groups=(0, 0)):
    out = compute(inputs(step_reward, step_value, tok_value, ref, groups), algo)
    return out.advantages[torch.argsort(PERM)], out


def test_step_gae_by_hand():
    adv, out = run(Algo(advantage="step_gae", gamma=1.0, lam=1.0), [0.0, 1.0, 0.0], step_value=[0.5, 0.8, 0.3])
    # traj 0: A1 = 1 - 0.8 = 0.2; A0 = 0 + 0.8 - 0.5 + A1 = 0.5; traj 1: A = 0 - 0.3 = -0.3
    assert torch.allclose(adv, torch.tensor([0.5, 0.5, 0.2, 0.2, 0.2, -0.3, -0.3]), atol=1e-6)
    assert out.value_level == "step" and torch.allclose(out.value_target, torch.tensor([1.0, 1.0, 0.0]), atol=1e-6)


def test_step_gae_discounts_across_steps():
    adv, _ = run(Algo(advantage="step_gae", gamma=0.5, lam=0.5), [0.0, 1.0, 0.0], step_value=[0.0, 0.0, 0.0])
    # A1 = 1; A0 = 0 + 0.5 * 0 - 0 + 0.5 * 0.5 * A1 = 0.25
    assert torch.allclose(adv[:2], torch.tensor([0.25, 0.25]), atol=1e-6)


def test_token_gae_reward_on_the_last_token_of_each_step():
    values = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7]
    adv, out = run(Algo(advantage="token_gae", gamma=1.0, lam=1.0), [0.0, 1.0, 0.5], tok_value=values)
    # gamma = lam = 1: A_t = (sum of rewards from t on, within the trajectory) - V_t
    want = [1.0 - 0.1, 1.0 - 0.2, 1.0 - 0.3, 1.0 - 0.4, 1.0 - 0.5, 0.5 - 0.6, 0.5 - 0.7]
    assert torch.allclose(adv, torch.tensor(want), atol=1e-6)
    assert out.value_level == "token" and out.value_target.shape == (7,)


def test_grpo_trajectory_level_broadcasts_to_every_token():
    adv, out = run(Algo(advantage="grpo"), [0.0, 1.0, 0.0])
    s = 1 / math.sqrt(2)  # scores [1, 0], unbiased std 0.7071
    a = (1 - 0.5) / (s + 1e-6)
    assert torch.allclose(adv, torch.tensor([a] * 5 + [-a] * 2), atol=1e-5)
    assert out.value_target is None and out.value_level is None


def test_kl_as_reward_penalty_lowers_the_step_reward():
    ref = [-1.0, -1.0, -2.0, -2.0, -2.0, 0.0, 0.0]  # old logp is 0: k1 = 0 - ref
    algo = Algo(advantage="step_gae", gamma=1.0, lam=1.0, kl_coef=0.1, kl_estimator="k1", kl_in_reward=True)
    adv, out = run(algo, [0.0, 1.0, 0.0], step_value=[0.0, 0.0, 0.0], ref=ref)
    # step 0 reward -0.1*2, step 1 reward 1 - 0.1*6: A1 = 0.4, A0 = -0.2 + 0.4 = 0.2
    assert torch.allclose(adv[:5], torch.tensor([0.2, 0.2, 0.4, 0.4, 0.4]), atol=1e-6)
    assert torch.allclose(out.kl[torch.argsort(PERM)].float(), torch.tensor(ref).neg(), atol=1e-6)


@pytest.mark.parametrize("kind", ["rloo", "reinforce_pp", "reinforce_pp_baseline"])
def test_outcome_estimators_are_constant_within_a_trajectory(kind):
    adv, _ = run(Algo(advantage=kind), [0.0, 1.0, 0.0])
    assert len(set(adv[:5].tolist())) == 1 and len(set(adv[5:].tolist())) == 1
    assert adv[0] > adv[5]


def test_step_rewards_are_discounted_returns_to_go_compared_at_the_same_step():
    """reward_level=step: a step's score is its discounted return-to-go within its own episode, so the tool
    call of an episode that later succeeds gets credit, and the group baseline compares that return with
    the same step of the group's other episodes (bug D: immediate rewards, gamma ignored)."""
    # traj 0: a tool step (reward 0), then a correct answer (1); traj 1: a wrong answer at once (0)
    adv, _ = run(Algo(advantage="grpo", reward_level="step", gamma=0.5), [0.0, 1.0, 0.0])
    # step 0 returns: traj 0 -> 0 + 0.5 * 1 = 0.5, traj 1 -> 0: compared at step 0, group std 0.3536
    a0 = (0.5 - 0.25) / (math.sqrt(0.125) + 1e-6)
    assert torch.allclose(adv[:2], torch.tensor([a0, a0]), atol=1e-5)
    assert torch.allclose(adv[5:], torch.tensor([-a0, -a0]), atol=1e-5)
    assert torch.allclose(adv[2:5], torch.zeros(3))  # step 1 exists in traj 0 only: no baseline, no signal
