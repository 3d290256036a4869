"""Packing steps into micro-batches: one packed sequence per append-only trajectory scores like one per step.

Hand-built trajectories (append-only, one rewritten context, a single step,
a partly masked response) on a tiny random float64 model. Causal attention
means a step's response logprobs and values cannot see what comes after
it, so packing a trajectory into its last step's sequence must give the
per-step numbers for every response token.
"""
import random

import pytest
import torch

from r1.model import Transformer, tiny_config
from bench.host_score import list_collate
from r1.packing import MicroBatch, collate, filler, sequences, split_by_tokens, step_order
from r1.trajectory import Step, Trajectory

V = 97


def ids(rng, n):
    return [rng.randrange(3, V) for _ in range(n)]


def make_trajs():
    rng = random.Random(0)
    out = []
    for ti in range(3):  # append-only: prompt_{t+1} = prompt_t + response_t + observation_t
        prompt, steps = ids(rng, 5 + ti), []
        for si in range(3):
            resp = ids(rng, 2 + si + ti)
            mask = [1] * len(resp)
            if ti == 1 and si == 1:
                mask[0] = 0  # a forced token inside a response
            steps.append(Step(prompt, resp, [0.0] * len(resp), reward=float(si), response_mask=mask))
            prompt = prompt + resp + ids(rng, 3)
        out.append(Trajectory(f"a{ti}", ti, str(ti), steps))
    p0, r0 = ids(rng, 6), ids(rng, 4)
    rewritten = [Step(p0, r0, [0.0] * 4), Step(p0[:2] + ids(rng, 4), ids(rng, 5), [0.0] * 5)]
    out.append(Trajectory("w", 3, "3", rewritten))  # the environment rewrote the context: not append-only
    out.append(Trajectory("one", 4, "4", [Step(ids(rng, 7), ids(rng, 3), [0.0] * 3)]))
    out.append(Trajectory("empty", 5, "5", []))  # ended before its first step: contributes nothing
    return out


@pytest.fixture(scope="module")
def models():
    torch.manual_seed(0)
    cfg = tiny_config("llama", vocab_size=V, num_layers=2, hidden_size=32, intermediate_size=64, num_heads=4,
                      num_kv_heads=2, head_dim=8)
    # float64: packing changes which tokens share a matmul, and in float32 that moved these large random logprobs by
    # 1.05e-5 on one CPU (an AVX2 machine, 2026-12-02) and by less on others; in float64 it is far below 1e-9
    policy, critic = Transformer(cfg).double().eval(), Transformer(cfg, value_head=True).double().eval()
    with torch.no_grad():  # large random weights: logprobs and values that vary from token to token
        for p in [*policy.parameters(), *critic.parameters()]:
            if p.dim() == 2:
                p.normal_(0, 0.5)
    return policy, critic


@torch.no_grad()
def score(trajs, pack, models, max_tokens=10_000):
    """-> per token (step, logp, value, mask) lists in token order, per step values, tokens computed."""
    policy, critic = models
    order = step_order(trajs)
    seqs = sequences(trajs, pack_trajectories=pack)
    tok, step_val, n_tokens = [], {}, 0
    for group in split_by_tokens(seqs, max_tokens):
        mb = collate(group, trajs, order, "cpu")
        logp, _ = policy(mb.input_ids, mb.position_ids, mb.cu_seqlens, mb.max_seqlen, sel=mb.sel, targets=mb.targets)
        v = critic(mb.input_ids, mb.position_ids, mb.cu_seqlens, mb.max_seqlen)
        tok += list(zip(mb.tok_step.tolist(), mb.tok_traj.tolist(), logp.tolist(), v[mb.sel].tolist(),
                        mb.mask.tolist(), mb.targets.tolist()))
        step_val.update(zip(mb.step_index.tolist(), v[mb.step_pos].tolist()))
        n_tokens += mb.num_tokens
    return tok, step_val, n_tokens


def test_packed_equals_per_step(models):
    trajs = make_trajs()
    assert [t.is_append_only() for t in trajs] == [True, True, True, False, True, True]
    packed, sv_packed, n_packed = score(trajs, True, models)
    single, sv_single, n_single = score(trajs, False, models)
    assert n_packed < n_single  # the shared prefixes are computed once
    assert len(packed) == len(single) == sum(len(s.response_ids) for t in trajs for s in t.steps)
    assert [p[0:2] + p[4:] for p in packed] == [s[0:2] + s[4:] for s in single]  # same tokens, same order
    lp_p, lp_s = torch.tensor([p[2] for p in packed]), torch.tensor([s[2] for s in single])
    v_p, v_s = torch.tensor([p[3] for p in packed]), torch.tensor([s[3] for s in single])
    assert (lp_p - lp_s).abs().max() < 1e-9
    assert (v_p - v_s).abs().max() < 1e-9
    assert lp_s.std() > 0.1 and v_s.std() > 0.01  # the model is not trivially constant
    assert sv_packed.keys() == sv_single.keys() == set(range(len(step_order(trajs))))
    for k in sv_single:
        assert abs(sv_packed[k] - sv_single[k]) < 1e-9
    # masks travel with their tokens: the forced token of trajectory 1, step 1 is the only 0
    masks = [(p[0], p[4]) for p in packed]
    assert [m for _, m in masks].count(0.0) == 1
    assert masks[[m for _, m in masks].index(0.0)][0] == step_order(trajs)[(1, 1)]


def test_micro_batch_split_does_not_change_scores(models):
    trajs = make_trajs()
    whole = score(trajs, True, models)[0]
    split = score(trajs, True, models, max_tokens=12)[0]  # mostly one sequence per micro-batch
    assert [w[:2] for w in whole] == [s[:2] for s in split]
    assert max(abs(w[2] - s[2]) for w, s in zip(whole, split)) < 1e-9


def test_split_by_tokens_greedy():
    trajs = make_trajs()
    seqs = sequences(trajs, pack_trajectories=False)
    groups = split_by_tokens(seqs, 20)
    assert [s for g in groups for s in g] == seqs  # order kept, nothing dropped
    for g in groups:
        assert len(g) == 1 or sum(len(s.ids) for s in g) <= 20
    long = [s for s in seqs if len(s.ids) > 20]
    assert long and all([s] in groups for s in long)  # an over-long sequence goes alone


def test_filler_trains_on_nothing(models):
    mb = filler(0, "cpu")
    policy, critic = models
    logp, ent = policy(mb.input_ids, mb.position_ids, mb.cu_seqlens, mb.max_seqlen, sel=mb.sel, targets=mb.targets)
    assert logp.shape == (1,) and float(mb.mask.sum()) == 0
    assert mb.cu_seqlens.tolist() == [0, mb.num_tokens] and mb.max_seqlen == mb.num_tokens


def test_sampler_logprobs_follow_the_micro_batch_order():
    """credit.sampler_logprobs puts each step's stored logprobs at its tokens' places in the flat
    micro-batch order (mini-batches deal trajectories round-robin; packed and per-step sequences):
    against a token-by-token loop, and token by token against the stored values."""
    from r1 import packing
    from r1.credit import sampler_logprobs

    trajs = make_trajs()
    rng = random.Random(3)
    for t in trajs:
        for s in t.steps:
            s.logprobs = [-rng.random() for _ in s.response_ids]
    for minibatches, tokens in ((1, 10_000), (2, 30), (3, 12)):
        plan = packing.plan(trajs, minibatches, tokens, "cpu")
        tok_step = torch.cat([mb.tok_step for mb in plan.micro_batches])
        targets = torch.cat([mb.targets for mb in plan.micro_batches])
        got = sampler_logprobs(trajs, tok_step)
        steps = [s for t in trajs for s in t.steps]
        seen, want = {}, []
        for g in tok_step.tolist():
            k = seen.get(g, 0)
            want.append(steps[g].logprobs[k])
            seen[g] = k + 1
            assert targets[len(want) - 1] == steps[g].response_ids[k]  # the logprob of that very token
        assert torch.equal(got, torch.tensor(want, dtype=torch.float32))
    assert sampler_logprobs(trajs, torch.zeros(0, dtype=torch.long)).numel() == 0


@pytest.mark.parametrize("pack", [True, False])
@pytest.mark.parametrize("max_tokens", [1, 12, 40, 10_000])
def test_collate_matches_a_token_by_token_reference(pack, max_tokens):
    rng = random.Random(max_tokens)
    trajs = make_trajs()
    for ti in range(6, 30):  # more, random: ragged steps, partial masks, some rewritten contexts
        prompt, steps = ids(rng, rng.randrange(1, 9)), []
        for _ in range(rng.randrange(1, 5)):
            resp = ids(rng, rng.randrange(1, 7))
            steps.append(Step(prompt, resp, [0.0] * len(resp), response_mask=[rng.choice([0, 1, 1]) for _ in resp]))
            prompt = prompt + resp + ids(rng, rng.randrange(0, 4)) if rng.random() < 0.8 else ids(rng, 5)
        trajs.append(Trajectory(f"r{ti}", ti, str(ti), steps))
    order = step_order(trajs)
    groups = split_by_tokens(sequences(trajs, pack_trajectories=pack), max_tokens)
    assert len(groups) > 1 or max_tokens == 10_000
    for group in groups:
        mb, ref = collate(group, trajs, order, "cpu"), list_collate(group, trajs, order, "cpu")
        for name in MicroBatch.__dataclass_fields__:
            got, want = getattr(mb, name), getattr(ref, name)
            if torch.is_tensor(want):
                assert got.dtype == want.dtype and torch.equal(got, want), name
            else:
                assert type(got) is type(want) and got == want, name


def test_a_response_mask_of_the_wrong_length_is_named():
    trajs = make_trajs()
    trajs[2].steps[1].response_mask = trajs[2].steps[1].mask + [1]
    order = step_order(trajs)
    with pytest.raises(ValueError, match=r"trajectory 'a2' step 1: response_mask has 6 values for 5 response tokens"):
        collate(sequences(trajs), trajs, order, "cpu")
