"""r1.algos.advantages against plain float64 Python loops, plus edge cases and bad input.

Each reference below is written the slow, obvious way (lists of Python floats,
one element at a time) so a reader can check it by eye; the library versions
are vectorised and must agree to float64 precision.
"""

import math

import pytest
import torch

from r1.algos.advantages import (
    broadcast_to_steps,
    clip_advantages,
    discounted_returns,
    flatten_steps,
    grpo,
    reinforce_pp,
    rloo,
    step_gae,
    token_gae,
    unflatten_steps,
    whiten,
)

F64 = torch.float64


# ---------------------------------------------------------------- references


def ref_gae(rewards, values, mask, gamma, lam, last=None):
    """GAE over real positions of each row, skipping masked ones. Lists in, lists out."""
    B, L = len(rewards), len(rewards[0])
    adv = [[0.0] * L for _ in range(B)]
    ret = [[0.0] * L for _ in range(B)]
    for b in range(B):
        next_v = 0.0 if last is None else last[b]
        next_a = 0.0
        for t in reversed(range(L)):
            if not mask[b][t]:
                continue
            delta = rewards[b][t] + gamma * next_v - values[b][t]
            a = delta + gamma * lam * next_a
            adv[b][t] = a
            ret[b][t] = a + values[b][t]
            next_v, next_a = values[b][t], a
    return adv, ret


def ref_groups(scores, ids):
    groups = {}
    for i, g in enumerate(ids):
        groups.setdefault(g, []).append(i)
    return groups


def ref_grpo(scores, ids, std_norm, eps):
    out = [0.0] * len(scores)
    for members in ref_groups(scores, ids).values():
        vals = [scores[i] for i in members]
        n = len(vals)
        if n == 1 or max(vals) == min(vals):
            continue
        mean = sum(vals) / n
        std = math.sqrt(sum((x - mean) ** 2 for x in vals) / (n - 1))
        for i in members:
            out[i] = (scores[i] - mean) / (std + eps) if std_norm else scores[i] - mean
    return out


def ref_rloo(scores, ids):
    out = [0.0] * len(scores)
    for members in ref_groups(scores, ids).values():
        if len(members) == 1:
            continue
        for i in members:
            others = [scores[j] for j in members if j != i]
            out[i] = scores[i] - sum(others) / len(others)
    return out


def ref_whiten(x, w, shift_mean, eps):
    total = sum(w)
    mean = sum(wi * xi for wi, xi in zip(w, x)) / total
    var = sum(wi * (xi - mean) ** 2 for wi, xi in zip(w, x)) / (total - 1) if total > 1 else 0.0
    out = []
    for wi, xi in zip(w, x):
        if wi == 0:
            out.append(0.0)
            continue
        y = (xi - mean) / math.sqrt(var + eps)
        out.append(y + mean if not shift_mean else y)
    return out


# ---------------------------------------------------------------- inputs


def prefix_mask(lengths, width):
    return torch.tensor([[1 if t < n else 0 for t in range(width)] for n in lengths])


def random_steps(seed, lengths, width):
    g = torch.Generator().manual_seed(seed)
    B = len(lengths)
    mask = prefix_mask(lengths, width)
    rewards = torch.randn(B, width, generator=g, dtype=F64) * mask
    values = torch.randn(B, width, generator=g, dtype=F64)
    return rewards, values, mask


def close(a, b, tol=1e-12):
    assert torch.allclose(torch.as_tensor(a, dtype=F64), torch.as_tensor(b, dtype=F64), atol=tol, rtol=tol), (a, b)


# ---------------------------------------------------------------- step_gae


@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.99, 0.95), (0.5, 0.0), (0.0, 0.7)])
@pytest.mark.parametrize("bootstrap", [False, True])
def test_step_gae_matches_loop(gamma, lam, bootstrap):
    lengths = [5, 1, 3, 0, 5, 2]
    rewards, values, mask = random_steps(0, lengths, 5)
    last = torch.randn(len(lengths), generator=torch.Generator().manual_seed(1), dtype=F64) if bootstrap else None
    adv, ret = step_gae(rewards, values, mask, gamma, lam, last_values=last)
    ref_a, ref_r = ref_gae(rewards.tolist(), values.tolist(), mask.tolist(), gamma, lam,
                           None if last is None else last.tolist())
    close(adv, ref_a)
    close(ret, ref_r)
    assert adv.dtype == F64


def test_step_gae_lam1_is_return_minus_value():
    # Independent of the recursion: with lam = 1, A_t = sum_k gamma^k r_{t+k} + gamma^(n-t) V_last - V_t.
    rewards, values, mask = random_steps(2, [4, 2], 4)
    last = torch.tensor([0.3, -1.2], dtype=F64)
    gamma = 0.9
    adv, ret = step_gae(rewards, values, mask, gamma, 1.0, last_values=last)
    for b, n in enumerate([4, 2]):
        for t in range(n):
            g = sum(gamma ** (k - t) * rewards[b, k].item() for k in range(t, n)) + gamma ** (n - t) * last[b].item()
            close(adv[b, t], g - values[b, t].item())
            close(ret[b, t], g)


def test_step_gae_padding_garbage_does_not_leak():
    rewards, values, mask = random_steps(3, [3, 1], 4)
    dirty_v = torch.where(mask.bool(), values, torch.nan)
    dirty_r = torch.where(mask.bool(), rewards, torch.inf)
    adv, ret = step_gae(dirty_r, dirty_v, mask, 0.9, 0.9)
    clean_a, clean_r = step_gae(rewards, values, mask, 0.9, 0.9)
    close(adv, clean_a)
    close(ret, clean_r)


def test_step_gae_single_step_and_empty_rows():
    rewards = torch.tensor([[2.0], [5.0]], dtype=F64)
    values = torch.tensor([[0.5], [1.0]], dtype=F64)
    mask = torch.tensor([[1], [0]])
    adv, ret = step_gae(rewards, values, mask, 0.9, 0.95, last_values=torch.tensor([1.0, 7.0], dtype=F64))
    close(adv, [[2.0 + 0.9 * 1.0 - 0.5], [0.0]])
    close(ret, [[2.0 + 0.9 * 1.0], [0.0]])


def test_step_gae_computes_bf16_inputs_in_float32():
    rewards, values, mask = random_steps(4, [3, 2], 3)
    adv, _ = step_gae(rewards.to(torch.bfloat16), values.to(torch.bfloat16), mask, 1.0, 1.0)
    assert adv.dtype == torch.float32


def test_step_gae_bad_input():
    rewards, values, mask = random_steps(5, [2, 2], 2)
    with pytest.raises(ValueError, match="shapes differ"):
        step_gae(rewards, values[:, :1], mask, 1.0, 1.0)
    with pytest.raises(ValueError, match="gamma"):
        step_gae(rewards, values, mask, 1.5, 1.0)
    with pytest.raises(ValueError, match="last_values"):
        step_gae(rewards, values, mask, 1.0, 1.0, last_values=torch.zeros(3))
    with pytest.raises(ValueError, match=r"\[B, S\]"):
        step_gae(rewards[0], values[0], mask[0], 1.0, 1.0)


# ---------------------------------------------------------------- token_gae


def random_tokens(seed, B, T):
    """Rows like an agent transcript: prompt (0), response (1), tool output (0), response (1), padding."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.zeros(B, T, dtype=torch.long)
    rewards = torch.zeros(B, T, dtype=F64)
    for b in range(B):
        t = int(torch.randint(0, 3, (1,), generator=g))
        while t < T:
            n = int(torch.randint(1, 4, (1,), generator=g))
            end = min(t + n, T)
            mask[b, t:end] = 1
            rewards[b, end - 1] = float(torch.randn(1, generator=g, dtype=F64))
            t = end + int(torch.randint(1, 4, (1,), generator=g))
            if bool(torch.rand(1, generator=g) < 0.3):
                break
    values = torch.randn(B, T, generator=g, dtype=F64)
    return rewards, values, mask


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.99, 0.9)])
def test_token_gae_matches_loop(seed, gamma, lam):
    rewards, values, mask = random_tokens(seed, 5, 17)
    mask[2] = 0  # an all-masked row
    rewards[2] = 0
    adv, ret = token_gae(rewards, values, mask, gamma, lam)
    ref_a, ref_r = ref_gae(rewards.tolist(), values.tolist(), mask.tolist(), gamma, lam)
    close(adv, ref_a)
    close(ret, ref_r)
    assert torch.all(adv[2] == 0) and torch.all(ret[2] == 0)


def test_token_gae_skips_holes():
    # Two sampled tokens separated by a tool output: the first token's next value is the second's.
    rewards = torch.tensor([[0.0, 0.0, 0.0, 0.0, 1.0]], dtype=F64)
    values = torch.tensor([[9.0, 0.5, 9.0, 9.0, 0.25]], dtype=F64)
    mask = torch.tensor([[0, 1, 0, 0, 1]])
    adv, _ = token_gae(rewards, values, mask, 1.0, 1.0)
    close(adv, [[0.0, 0.0 + 0.25 - 0.5 + (1.0 - 0.25), 0.0, 0.0, 1.0 - 0.25]])


def test_token_gae_single_token():
    adv, ret = token_gae(torch.tensor([[3.0]], dtype=F64), torch.tensor([[1.0]], dtype=F64),
                         torch.tensor([[1]]), 0.9, 0.9)
    close(adv, [[2.0]])
    close(ret, [[3.0]])


def test_token_gae_rejects_reward_on_masked_token():
    rewards = torch.tensor([[0.0, 1.0]], dtype=F64)
    with pytest.raises(ValueError, match="1 masked tokens"):
        token_gae(rewards, torch.zeros_like(rewards), torch.tensor([[1, 0]]), 1.0, 1.0)


def test_discounted_returns_matches_loop():
    rewards, _, mask = random_tokens(7, 4, 12)
    gamma = 0.9
    ret = discounted_returns(rewards, mask, gamma)
    ref = [[0.0] * 12 for _ in range(4)]
    for b in range(4):
        g = 0.0
        for t in reversed(range(12)):
            if mask[b, t]:
                g = rewards[b, t].item() + gamma * g
                ref[b][t] = g
    close(ret, ref)


# ---------------------------------------------------------------- grpo / rloo


def random_groups(seed, sizes, ids=None, discrete=False):
    g = torch.Generator().manual_seed(seed)
    ids = ids or list(range(len(sizes)))
    group_ids = torch.tensor([gid for gid, n in zip(ids, sizes) for _ in range(n)])
    perm = torch.randperm(len(group_ids), generator=g)  # members of a group need not be adjacent
    group_ids = group_ids[perm]
    if discrete:
        scores = torch.randint(0, 2, (len(group_ids),), generator=g).to(F64)
    else:
        scores = torch.randn(len(group_ids), generator=g, dtype=F64)
    return scores, group_ids


@pytest.mark.parametrize("std_norm", [True, False])
@pytest.mark.parametrize("discrete", [False, True])
def test_grpo_matches_loop(std_norm, discrete):
    scores, ids = random_groups(0, [4, 1, 6, 2, 8], ids=[30, 7, -2, 1000, 5], discrete=discrete)
    adv = grpo(scores, ids, std_norm=std_norm, eps=1e-6)
    close(adv, ref_grpo(scores.tolist(), ids.tolist(), std_norm, 1e-6))


def test_grpo_edge_groups_are_exactly_zero():
    scores = torch.tensor([0.1, 0.1, 0.1, 0.7, 1.0, 0.0], dtype=F64)
    ids = torch.tensor([0, 0, 0, 1, 2, 2])
    adv = grpo(scores, ids)
    assert adv[:4].tolist() == [0.0, 0.0, 0.0, 0.0]  # zero variance and size 1: exactly 0
    # Two members, unbiased std = |a - b| / sqrt(2): advantages are +-1/sqrt(2) (minus eps).
    close(adv[4:], [1 / math.sqrt(2), -1 / math.sqrt(2)], tol=1e-5)


def test_rloo_matches_loop():
    scores, ids = random_groups(1, [4, 1, 3, 2], ids=[9, 8, 7, 6])
    close(rloo(scores, ids), ref_rloo(scores.tolist(), ids.tolist()))


def test_rloo_equals_scaled_dr_grpo():
    # Known identity: s_i - mean(others) = n/(n-1) * (s_i - mean(all)).
    scores, ids = random_groups(2, [5, 5], discrete=True)
    close(rloo(scores, ids), grpo(scores, ids, std_norm=False) * 5 / 4)


def test_group_functions_bad_input():
    with pytest.raises(ValueError, match="integer"):
        grpo(torch.zeros(3), torch.zeros(3))
    with pytest.raises(ValueError, match="non-finite"):
        rloo(torch.tensor([1.0, torch.nan]), torch.tensor([0, 0]))
    with pytest.raises(ValueError, match="group_ids shape"):
        grpo(torch.zeros(3), torch.zeros(2, dtype=torch.long))


# ---------------------------------------------------------------- whiten / reinforce++


@pytest.mark.parametrize("shift_mean", [True, False])
def test_whiten_matches_loop(shift_mean):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, 7, generator=g, dtype=F64) * 3 + 1
    mask = (torch.rand(4, 7, generator=g) < 0.6).long()
    out = whiten(x, mask, shift_mean=shift_mean)
    ref = ref_whiten(x.flatten().tolist(), mask.flatten().tolist(), shift_mean, 1e-8)
    close(out.flatten(), ref)


def test_whiten_single_element_and_padding_nan():
    x = torch.tensor([5.0, torch.nan], dtype=F64)
    out = whiten(x, torch.tensor([1, 0]))
    assert out.tolist() == [0.0, 0.0]


def test_reinforce_pp_matches_loop():
    scores, _ = random_groups(4, [3, 3, 3])
    close(reinforce_pp(scores), ref_whiten(scores.tolist(), [1.0] * 9, True, 1e-8))


def test_reinforce_pp_baseline_matches_loop():
    scores, ids = random_groups(5, [4, 1, 3, 4], discrete=False)
    s, gid = scores.tolist(), ids.tolist()
    centred = [0.0] * len(s)
    for members in ref_groups(s, gid).values():
        mean = sum(s[i] for i in members) / len(members)
        for i in members:
            centred[i] = s[i] - mean
    close(reinforce_pp(scores, group_ids=ids), ref_whiten(centred, [1.0] * len(s), True, 1e-8))


def test_reinforce_pp_weights_equal_token_broadcast():
    # Whitening trajectory scores with token-count weights == whitening them broadcast to every token.
    scores = torch.tensor([1.0, -0.5, 2.0, 0.25], dtype=F64)
    tokens = torch.tensor([3, 1, 5, 2])
    per_traj = reinforce_pp(scores, weights=tokens.to(F64))
    per_token = whiten(scores.repeat_interleave(tokens), torch.ones(int(tokens.sum())))
    close(per_traj.repeat_interleave(tokens), per_token)


def test_clip_advantages():
    x = torch.tensor([-3.0, -0.5, 0.0, 2.5], dtype=F64)
    close(clip_advantages(x, 1.0), [-1.0, -0.5, 0.0, 1.0])
    assert clip_advantages(x, 0.0) is x  # the config's 0 = off
    with pytest.raises(ValueError, match="max_abs"):
        clip_advantages(x, -1.0)


# ---------------------------------------------------------------- level helpers


def test_step_level_helpers_round_trip():
    mask = prefix_mask([2, 0, 3], 3)
    x = torch.arange(9, dtype=F64).reshape(3, 3)
    flat = flatten_steps(x, mask)
    assert flat.tolist() == [0.0, 1.0, 6.0, 7.0, 8.0]
    close(unflatten_steps(flat, mask), x * mask)
    per_step_ids = broadcast_to_steps(torch.tensor([4, 5, 6]), mask, fill=-1)
    assert per_step_ids.tolist() == [[4, 4, -1], [-1, -1, -1], [6, 6, 6]]
    # Step-level GRPO: one score per real step, grouped by the trajectory's prompt group.
    adv = unflatten_steps(grpo(flat, flatten_steps(per_step_ids, mask)), mask)
    assert adv.shape == (3, 3) and torch.all(adv[1] == 0)
    with pytest.raises(ValueError, match="unflatten_steps"):
        unflatten_steps(flat[:2], mask)


def test_whiten_with_all_sum_uses_the_global_moments():
    """Two halves whitened with an all_sum that adds the other half's moments equal the whole whitened at once."""
    from r1.algos.advantages import whiten_moments

    g = torch.Generator().manual_seed(2)
    x = torch.randn(20, generator=g, dtype=F64) * 2 + 1
    w = torch.randint(0, 3, (20,), generator=g).to(F64)
    whole = whiten(x, w)
    a, b = slice(0, 7), slice(7, 20)
    total = whiten_moments(x[a], w[a]) + whiten_moments(x[b], w[b])
    halves = torch.cat([whiten(x[s], w[s], all_sum=lambda m: total) for s in (a, b)])
    close(halves, whole)
    assert not torch.allclose(whiten(x[a], w[a]), whole[a])  # the half alone is another whitening
