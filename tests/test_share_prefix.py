"""train.share_prefix: a group's first prompt packed once per micro-batch gives what packing every sample whole gives.

The samples of one prompt begin with the same tokens; with sharing, the
second and later samples of a micro-batch are packed without that prompt,
their positions go on from its length, and their attention reads the first
sample's prompt rows (kernels.attention.varlen_attention's `kv`). On a tiny
random float64 model of each family, every response token's logprob and
entropy, every value, and every parameter's gradient equal the unshared
packing's to 1e-10; through the trainer, one whole update (score, credit,
update) gives the same metrics, gradients and parameters, to the float32
rounding of the learner's per-token terms. GPU backends with separate query and
key lengths are checked against the math path on CUDA (marked gpu).
"""
import random

import pytest
import torch

from kernels.attention import varlen_attention
from r1 import packing
from r1.model import Transformer, tiny_config
from r1.packing import collate, sequences, split_by_tokens, step_order
from r1.trajectory import Step, Trajectory
from test_packing import V, ids

FAMILIES = {"llama": {}, "qwen2": {"tie": False}, "qwen3": {}}  # tiny_config: qwen2 has q/k/v biases, qwen3 q/k norms


def make_trajs(seed=0):
    """Two groups of three samples each on one prompt (append-only, 1-3 steps, a forced token), one sample of
    the second group whose context was rewritten (each step its own sequence; its first step still shares),
    a sample alone, a sample of another group that happens to have group 0's prompt, an empty trajectory."""
    rng = random.Random(seed)
    out = []
    for g in range(2):
        prompt0 = ids(rng, 6 + g)
        for k in range(3):
            prompt, steps = prompt0, []
            for si in range(1 + (k + g) % 3):
                resp = ids(rng, 2 + si + k)
                mask = [1] * len(resp)
                if k == 1 and si == 0:
                    mask[0] = 0  # a forced token inside a response
                steps.append(Step(prompt, resp, [0.0] * len(resp), reward=float(si), response_mask=mask))
                prompt = prompt + resp + ids(rng, 3)
            if g == 1 and k == 1:  # the environment rewrote the context after step 0
                steps[1] = Step(prompt0[:2] + ids(rng, 4), ids(rng, 5), [0.0] * 5)
                steps = steps[:2]
            out.append(Trajectory(f"g{g}s{k}", g, f"p{g}", steps))
    out.append(Trajectory("alone", 2, "p2", [Step(ids(rng, 7), ids(rng, 3), [0.0] * 3)]))
    out.append(Trajectory("same-prompt", 3, "p3", [Step(list(out[0].steps[0].prompt_ids), ids(rng, 4), [0.0] * 4)]))
    out.append(Trajectory("empty", 4, "p4", []))
    return out


def models(family):
    torch.manual_seed(0)
    extra = dict(FAMILIES[family])
    tie = extra.pop("tie", True)
    cfg = tiny_config(family, tie=tie, vocab_size=V, num_layers=2, hidden_size=32,
                      intermediate_size=64, num_heads=4, num_kv_heads=2, head_dim=8, **extra)
    policy, critic = Transformer(cfg).double(), Transformer(cfg, value_head=True).double()
    with torch.no_grad():  # large random weights: logprobs and values that vary from token to token
        for p in [*policy.parameters(), *critic.parameters()]:
            if p.dim() == 2:
                p.normal_(0, 0.5)
    return policy, critic


def run(mb, policy, critic, coef):
    """Per token logp, entropy, value at the scored positions, step values; and every gradient of a loss that
    weighs each of them by fixed random coefficients."""
    policy.zero_grad(set_to_none=True)
    critic.zero_grad(set_to_none=True)
    args = (mb.input_ids, mb.position_ids, mb.cu_seqlens, mb.max_seqlen)
    logp, ent = policy(*args, sel=mb.sel, targets=mb.targets, kv_rows=mb.kv_rows)
    values = critic(*args, kv_rows=mb.kv_rows)
    tok_v, step_v = values[mb.sel], values[mb.step_pos]
    m = logp.numel()
    loss = (logp * coef[:m]).sum() + (ent * coef[m:2 * m]).sum() + (tok_v * coef[2 * m:3 * m]).sum() \
        + (step_v * coef[3 * m:3 * m + step_v.numel()]).sum()
    loss.backward()
    grads = {f"p.{n}": p.grad.clone() for n, p in policy.named_parameters() if p.grad is not None}
    grads.update({f"c.{n}": p.grad.clone() for n, p in critic.named_parameters() if p.grad is not None})
    return [x.detach() for x in (logp, ent, tok_v, step_v)], grads


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_shared_prompt_gives_the_same_logprobs_values_and_gradients(family):
    policy, critic = models(family)
    trajs = make_trajs()
    order, seqs = step_order(trajs), sequences(trajs)
    whole, shared = collate(seqs, trajs, order, "cpu"), collate(seqs, trajs, order, "cpu", share=True)
    assert whole.kv_rows is None and whole.shared_tokens == 0
    assert shared.kv_rows is not None and shared.shared_tokens > 0
    assert shared.num_tokens + shared.shared_tokens == whole.num_tokens  # each shared prompt token computed once
    for name in ("targets", "mask", "tok_step", "tok_traj", "step_index"):
        assert torch.equal(getattr(whole, name), getattr(shared, name)), name
    g = torch.Generator().manual_seed(1)
    coef = torch.randn(4 * whole.sel.numel() + whole.step_pos.numel(), generator=g, dtype=torch.float64)
    (a, ga), (b, gb) = run(whole, policy, critic, coef), run(shared, policy, critic, coef)
    for x, y, name in zip(a, b, ("logp", "entropy", "token values", "step values")):
        assert torch.allclose(x, y, rtol=0, atol=1e-10), (name, (x - y).abs().max())
    assert ga.keys() == gb.keys()
    for k in ga:
        assert torch.allclose(ga[k], gb[k], rtol=0, atol=1e-10), (k, (ga[k] - gb[k]).abs().max())


def test_only_a_first_prompt_is_shared_and_only_within_a_micro_batch():
    trajs = make_trajs()
    order, seqs = step_order(trajs), sequences(trajs)
    heads = [s.head for s in seqs]
    # the rewritten sample's second step is a sequence of its own that starts with another prompt: no head
    assert heads.count(0) == 1
    mb = collate(seqs, trajs, order, "cpu", share=True)
    # group 0's three samples and the other group's sample with the same prompt share one prompt (3 copies
    # saved), group 1's three (the rewritten one included) another (2 saved)
    want = 3 * len(trajs[0].steps[0].prompt_ids) + 2 * len(trajs[3].steps[0].prompt_ids)
    assert mb.shared_tokens == want
    # positions go on from the prompt: every sequence's keys are as long as the sequence was
    index, cu_k, max_k = mb.kv_rows
    assert cu_k[-1].item() == index.numel() == sum(len(s.ids) for s in seqs) and max_k == max(len(s.ids) for s in seqs)
    # split one sequence a micro-batch: nothing to share
    for part in split_by_tokens(seqs, 1, share=True):
        assert collate(part, trajs, order, "cpu", share=True).kv_rows is None


def test_split_counts_a_shared_prompt_once():
    trajs = make_trajs()
    seqs = sequences(trajs)[:3]  # group 0's three samples
    total = sum(len(s.ids) for s in seqs)
    once = total - 2 * seqs[0].head
    assert len(split_by_tokens(seqs, once)) > 1  # whole, they do not fit
    assert len(split_by_tokens(seqs, once, share=True)) == 1  # sharing, they do
    assert len(split_by_tokens(seqs, once - 1, share=True)) == 2


def test_plan_deals_whole_groups_and_keeps_every_token():
    """With share, a group's trajectories sit in one mini-batch; every response token is still scored once,
    its target the stored token (the flat order credit.sampler_logprobs relies on)."""
    from r1.credit import sampler_logprobs
    trajs = make_trajs()
    rng = random.Random(3)
    for t in trajs:
        for s in t.steps:
            s.logprobs = [-rng.random() for _ in s.response_ids]
    for minibatches, tokens in ((1, 10_000), (2, 30), (3, 12), (2, 10_000)):
        plan = packing.plan(trajs, minibatches, tokens, "cpu", share=True)
        for mini in plan.minibatches:
            groups = {trajs[t].group for mb in mini for t in mb.tok_traj.tolist()}
            for g in groups:
                members = {i for i, t in enumerate(trajs) if t.group == g and t.steps}
                assert members <= {t for mb in mini for t in mb.tok_traj.tolist()}
        tok_step = torch.cat([mb.tok_step for mb in plan.micro_batches])
        targets = torch.cat([mb.targets for mb in plan.micro_batches])
        steps = [s for t in trajs for s in t.steps]
        seen, want = {}, []
        for k, gs in enumerate(tok_step.tolist()):
            j = seen.get(gs, 0)
            want.append(steps[gs].logprobs[j])
            seen[gs] = j + 1
            assert targets[k] == steps[gs].response_ids[j]
        assert sorted(seen.items()) == sorted((i, len(s.response_ids)) for i, s in enumerate(steps))
        assert torch.equal(sampler_logprobs(trajs, tok_step), torch.tensor(want, dtype=torch.float32))


def test_attention_with_shared_rows_is_attention_over_the_whole_sequence():
    """The math path with `kv` against each whole sequence's causal attention (uneven heads: GQA), and a
    second sequence that does not start with the first one's head gives something else (the test can fail)."""
    g = torch.Generator().manual_seed(0)
    head, tails = 5, [3, 4]
    whole = [head + t for t in tails]
    q, k, v = (torch.randn(sum(whole), h, 8, generator=g, dtype=torch.float64) for h in (4, 2, 2))
    for x in (q, k, v):  # the second sequence starts with the first one's head
        x[whole[0]:whole[0] + head] = x[:head]
    cu = torch.tensor([0, whole[0], sum(whole)], dtype=torch.int32)
    want = varlen_attention(q, k, v, cu, max(whole), backend="math")
    keep = torch.cat([torch.arange(whole[0]), torch.arange(whole[0] + head, sum(whole))])  # drop the 2nd head
    index = torch.cat([torch.arange(whole[0]), torch.arange(head), torch.arange(whole[0], whole[0] + tails[1])])
    cu_q = torch.tensor([0, whole[0], whole[0] + tails[1]], dtype=torch.int32)
    got = varlen_attention(q[keep], k[keep], v[keep], cu_q, whole[0], backend="math",
                           kv=(index, cu, max(whole)))
    assert torch.allclose(got, want[keep], rtol=0, atol=1e-12)
    k2 = k.clone()
    k2[whole[0]] += 1.0  # the second sequence's copy of the head differs: not what sharing computes
    other = varlen_attention(q, k2, v, cu, max(whole), backend="math")
    assert not torch.allclose(got, other[keep], rtol=0, atol=1e-6)


def test_one_update_through_the_trainer_is_the_same(tmp_path):
    """score, credit and update of one rollout, packed whole then shared (one mini-batch, so both deal the
    same trajectories), on a float64 model: the same metrics, gradients and parameters, to the float32 rounding
    of the learner's per-token terms (the models themselves agree to 1e-10: the test above)."""
    from r1.config import load_config
    from r1.credit import compute, credit_inputs, sampler_logprobs, step_rewards
    from r1.trainer import Trainer
    from test_trainer import SMOKE, TINY

    cfg = load_config(SMOKE, [f"run.dir={tmp_path / 'run'}", *TINY, "rollout.n=3", "algo.minibatches=1",
                              "log.tensorboard=false", "log.trajectories=false"])
    tr = Trainer(cfg)
    trajs = tr.rollout(0).trajectories
    for m in (tr.learner.policy, tr.learner.critic, tr.learner.ref):
        m.double()
    state = {k: {n: v.clone() for n, v in m.state_dict().items()} for k, m in tr.learner.models.items()}
    after, metrics, grads = {}, {}, {}
    for share in (False, True):
        for k, m in tr.learner.models.items():
            m.load_state_dict(state[k])
        for opt in tr.learner.optims.values():
            opt.state.clear()
        plan = packing.plan(trajs, 1, 10**6, tr.device, share=share)
        assert (plan.micro_batches[0].shared_tokens > 0) == share
        scores = tr.learner.score(plan.micro_batches)
        batch = credit_inputs(trajs, plan, scores, step_rewards(trajs), cfg.algo, tr.d)
        credit = compute(batch, cfg.algo)
        metrics[share] = tr.learner.update(plan, [0], scores, credit, sampler_logprobs(trajs, batch.tok_step), 5)
        after[share] = {f"{k}.{n}": v.clone() for k, m in tr.learner.models.items()
                        for n, v in m.state_dict().items()}
        grads[share] = {f"{k}.{n}": p.grad.clone() for k, m in tr.learner.models.items()
                        for n, p in m.named_parameters() if p.grad is not None}  # the one optimizer step's
    for k in ("pg_loss", "value_loss", "entropy", "grad_norm", "critic_grad_norm"):
        assert metrics[False][k] == pytest.approx(metrics[True][k], rel=1e-9, abs=1e-12), k
    assert grads[False].keys() == grads[True].keys() and len(grads[False]) > 0
    for n, g in grads[False].items():  # the learner's losses take logprobs and values in float32 (.float()), so a
        # 1e-14 difference in a float64 model's output can round to the next float32: 1e-7 of that token's term
        assert torch.allclose(g, grads[True][n], rtol=0, atol=1e-6 * g.abs().max().item()), n
    moved = 0
    for n in after[False]:
        # AdamW's first step is lr * g / (|g| + eps): a gradient entry at rounding noise (1e-15) moves its
        # parameter by lr * 1e-7 either way, so parameters agree to a small fraction of lr, not to 1e-10
        assert torch.allclose(after[False][n], after[True][n], rtol=0, atol=1e-4 * cfg.train.lr), n
        moved += not torch.equal(after[False][n], state[n.split(".")[0]][n.split(".", 1)[1]])
    assert moved > 0  # the update did change the parameters
    # the trainer's own iteration with the key on logs what it saved
    for m in (tr.learner.policy, tr.learner.critic, tr.learner.ref):
        m.float()  # the generator samples in float32 and takes the policy's weights at each refresh
    for opt in tr.learner.optims.values():
        opt.state.clear()
    tr.cfg.train.share_prefix = True
    out = tr.iteration(1)
    assert 0 < out["shared_prefix_frac"] < 1 and out["skipped_updates"] == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_backends_with_shared_rows_match_the_math_path():
    """Every CUDA backend here with separate query and key lengths (bottom-right causal), forward and backward,
    bf16, against the math path in float32 on the same inputs."""
    from kernels import attention
    g = torch.Generator(device="cuda").manual_seed(0)
    head, tails = 37, [21, 50, 9]
    whole = [head + t for t in tails]
    n_q = whole[0] + sum(tails[1:])
    q = torch.randn(n_q, 8, 64, device="cuda", generator=g, dtype=torch.bfloat16)
    k, v = (torch.randn(n_q, 2, 64, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(2))
    index = torch.cat([torch.arange(whole[0])] + [torch.cat([torch.arange(head), whole[0] + sum(tails[1:i])
                                                             + torch.arange(tails[i])]) for i in (1, 2)]).cuda()
    cu_q = torch.tensor([0, whole[0], whole[0] + tails[1], n_q], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, whole[0], whole[0] + whole[1], sum(whole)], dtype=torch.int32, device="cuda")
    kv = (index, cu_k, max(whole))
    ref = [x.float().requires_grad_() for x in (q, k, v)]
    want = varlen_attention(*ref, cu_q, max(whole), backend="math", kv=kv)
    want.square().sum().backward()
    backends = [b for b in ("fa4", "flash_attn", "torch_flash")
                if (b == "fa4" and attention.fa4_varlen_func is not None)
                or (b == "flash_attn" and attention.flash_attn_varlen_func is not None)
                or (b == "torch_flash" and attention.varlen_attn is not None)]
    assert backends, "no CUDA varlen backend"
    for b in backends:
        xs = [x.clone().requires_grad_() for x in (q, k, v)]
        got = varlen_attention(*xs, cu_q, max(whole), backend=b, kv=kv)
        got.float().square().sum().backward()
        assert (got.float() - want).abs().max() < 3e-2, b
        for x, r in zip(xs, ref):
            assert (x.grad.float() - r.grad).abs().max() < 0.15 * r.grad.abs().max().clamp(min=1), b
