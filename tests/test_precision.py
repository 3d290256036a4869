"""train.precision=bf16: a bf16 copy of the weights computes, the float32 master weights learn (r1/precision.py).

What must hold: the copy is the master rounded to bf16 (after it is made,
and after every optimizer step); the master's gradient is the float32 sum,
micro-batch by micro-batch, of the copy's bf16 gradients (FSDP's
reduce-scatter in float32 on several GPUs makes the same sum); scoring runs
the copy; tied weights stay tied; the config refuses what it cannot mean;
the memory plan counts the copies and the bf16 residual stream. CPU: bf16
runs on the CPU as on a GPU, only slower. The GPU test (marked gpu) checks
that the copy's logprobs sit closer to the bf16 generator's than autocast's.
"""
import copy

import pytest
import torch

from r1 import memory
from r1.config import ConfigError, load_config
from r1.model import ModelConfig, Transformer, tiny_config
from r1.precision import Compute
from test_trainer import SMOKE, TINY


def tiny(tie=True, seed=0):
    torch.manual_seed(seed)
    mc = tiny_config("llama", tie=tie, vocab_size=97, num_layers=2, hidden_size=32, intermediate_size=64,
                     num_heads=4, num_kv_heads=2, head_dim=8)
    return Transformer(mc)


def batch(seed, n=2, L=9, vocab=97):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (n * L,), generator=g)
    pos = torch.arange(L).repeat(n)
    cu = torch.arange(0, (n + 1) * L, L, dtype=torch.int32)
    sel = torch.arange(n * L - 1)
    return (ids, pos, cu, L), dict(sel=sel, targets=ids[1:])


def loss_of(model, seed):
    args, kw = batch(seed)
    logp, ent = model(*args, **kw)
    return -(logp.float().sum()) + 0.1 * ent.float().sum()


@pytest.mark.parametrize("tie", [True, False])
def test_the_copy_is_the_master_in_bf16_and_tied_weights_stay_tied(tie):
    master = tiny(tie)
    c = Compute(master, torch.bfloat16)
    named = dict(c.module.named_parameters())
    assert named.keys() == dict(master.named_parameters()).keys()
    for n, p in master.named_parameters():
        assert named[n].dtype == torch.bfloat16 and torch.equal(named[n], p.detach().to(torch.bfloat16)), n
        assert named[n].data_ptr() != p.data_ptr()
    assert (c.module.head_weight is c.module.model.embed_tokens.weight) == tie
    assert (master.head_weight is master.model.embed_tokens.weight) == tie
    assert all(p.dtype == torch.float32 for p in master.parameters())  # the master is untouched


def test_master_gradient_is_the_float32_sum_of_the_copys_and_refresh_follows_the_step():
    master = tiny()
    c = Compute(master, torch.bfloat16)
    ref = copy.deepcopy(master).to(torch.bfloat16)  # what the copy is: the master rounded
    want = {}
    for seed in (1, 2, 3):  # three micro-batches of one optimizer step
        loss_of(c, seed).backward()
        assert all(p.grad is not None for p in c.copies)
        c.fold_grads()
        assert all(p.grad is None for p in c.copies)  # freed after the fold
        ref.zero_grad(set_to_none=True)
        loss_of(ref, seed).backward()
        for n, p in ref.named_parameters():
            g = p.grad.float()
            want[n] = g if n not in want else want[n].add_(g)
    for n, p in master.named_parameters():
        assert p.grad.dtype == torch.float32 and torch.equal(p.grad, want[n]), n
    opt = torch.optim.AdamW(master.parameters(), lr=1e-2)
    before = [p.detach().clone() for p in master.parameters()]
    opt.step()
    assert any(not torch.equal(a, p) for a, p in zip(before, master.parameters()))
    stale = [p.detach().clone() for p in c.copies]
    c.refresh()
    for p, q, s in zip(master.parameters(), c.copies, stale):
        assert torch.equal(q, p.detach().to(torch.bfloat16))
    assert any(not torch.equal(q, s) for q, s in zip(c.copies, stale))


def test_a_float64_copy_gives_the_masters_own_gradients():
    """The plumbing alone (a copy in the master's own dtype): folding gives exactly the master's gradients."""
    master = tiny().double()
    c = Compute(master, torch.float64)
    twin = copy.deepcopy(master)
    for seed in (4, 5):
        loss_of(c, seed).backward()
        c.fold_grads()
        loss_of(twin, seed).backward()
    for p, q in zip(master.parameters(), twin.parameters()):
        assert torch.equal(p.grad, q.grad)


def test_one_update_through_the_trainer(tmp_path):
    """Trainer with train.precision=bf16 on the CPU: scoring runs the copy (the same old logprobs as the
    master's weights rounded to bf16 give), each optimizer step's master gradient is the float32 sum of the
    copy's micro-batch gradients, and after the update the copy is the new master rounded."""
    from r1 import learner as learner_mod
    from r1.credit import compute, credit_inputs, sampler_logprobs, step_rewards
    from r1.packing import plan as make_plan
    from r1.trainer import Trainer

    cfg = load_config(SMOKE, [f"run.dir={tmp_path / 'run'}", *TINY, "rollout.n=3", "algo.minibatches=1",
                              "train.micro_tokens=64", "train.grad_clip=0", "train.precision=bf16",
                              "log.tensorboard=false", "log.trajectories=false"])
    tr = Trainer(cfg)
    L = tr.learner
    assert set(L.copies) == {"policy", "critic", "ref"} and L.policy_fwd is L.copies["policy"]
    trajs = tr.rollout(0).trajectories
    plan = make_plan(trajs, 1, 64, tr.device)
    assert len(plan.micro_batches) > 1  # several micro-batches: the sum is tested
    scores = L.score(plan.micro_batches)
    rounded = copy.deepcopy(L.policy).to(torch.bfloat16)
    for mb, s in zip(plan.micro_batches, scores):
        want, _ = rounded(mb.input_ids, mb.position_ids, mb.cu_seqlens, mb.max_seqlen, sel=mb.sel,
                          targets=mb.targets, temperature=cfg.rollout.temperature or 1.0)
        assert torch.equal(s.old_logp, want.float())
    folded = {"policy": [], "critic": []}
    real_fold = Compute.fold_grads

    def record(self):
        name = "policy" if self is L.copies["policy"] else "critic"
        folded[name].append([None if p.grad is None else p.grad.float().clone() for p in self.copies])
        real_fold(self)

    batch_ = credit_inputs(trajs, plan, scores, step_rewards(trajs), cfg.algo, tr.d)
    credit = compute(batch_, cfg.algo)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(learner_mod.Compute, "fold_grads", record)
        before = {k: [p.detach().clone() for p in m.parameters()] for k, m in L.models.items()}
        out = L.update(plan, [0], scores, credit, sampler_logprobs(trajs, batch_.tok_step), 5)
    assert out["skipped_updates"] == 0
    for name, model in L.models.items():
        # one optimizer step (minibatches=1, ppo_epochs=1): its gradient is still on the master
        assert len(folded[name]) == len(plan.micro_batches), name
        for i, p in enumerate(model.parameters()):
            parts = [f[i] for f in folded[name] if f[i] is not None]
            want = parts[0].clone()
            for g in parts[1:]:
                want.add_(g)
            assert torch.equal(p.grad, want), (name, i)
        assert any(not torch.equal(a, p) for a, p in zip(before[name], model.parameters())), name
        for p, q in zip(model.parameters(), L.copies[name].copies):
            assert torch.equal(q, p.detach().to(torch.bfloat16)), name
    assert all(p.dtype == torch.float32 for m in L.models.values() for p in m.parameters())


def test_the_config_refuses_an_unknown_precision_and_lora(tmp_path):
    with pytest.raises(ConfigError, match="train.precision"):
        load_config(SMOKE, [f"run.dir={tmp_path}", "train.precision=fp16"])
    with pytest.raises(ConfigError, match="train.precision.*lora_rank"):
        load_config(SMOKE, [f"run.dir={tmp_path}", "train.precision=bf16", "model.lora_rank=4"])


def test_the_memory_plan_counts_the_copies_and_a_bf16_residual_stream():
    cfg = load_config("configs/gsm8k_tool.yaml", ["rollout.slots=512", "train.micro_tokens=65536",
                                                 "train.precision=autocast", "train.overlap=0"])
    mc = ModelConfig()  # SmolLM2-135M's shape
    auto = memory.estimate(cfg, mc, 1, "cuda", int(139.2 * 2**30), micro_tokens=65536, slots=512)
    cfg.train.precision = "bf16"
    bf16 = memory.estimate(cfg, mc, 1, "cuda", int(139.2 * 2**30), micro_tokens=65536, slots=512)
    assert "autocast copies" in auto.items and "autocast copies" not in bf16.items
    P, Pc = memory.param_count(mc), memory.param_count(mc, value_head=True)
    assert bf16.items["bf16 copies"] == 2 * (2 * P + 2 * Pc)  # policy and critic, each weights + gradients
    assert bf16.update < auto.update  # a bf16 residual stream, no per-linear casts
    # several GPUs: FSDP's mixed precision either way, the key changes nothing
    cfg2 = copy.deepcopy(cfg)
    cfg2.train.precision = "autocast"
    assert memory.estimate(cfg, mc, 2, "cuda", int(139.2 * 2**30), micro_tokens=65536, slots=256).items == \
        memory.estimate(cfg2, mc, 2, "cuda", int(139.2 * 2**30), micro_tokens=65536, slots=256).items


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_the_copy_scores_closer_to_the_bf16_generator_than_autocast():
    """On CUDA: the old logprobs of the bf16 copy against those of autocast over the float32 master, both
    against a bf16 model's (the generator's weights): the copy's gap is no larger, and both are small."""
    master = tiny().cuda()
    with torch.no_grad():
        for p in master.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.3)
    gen = copy.deepcopy(master).to(torch.bfloat16)
    c = Compute(master, torch.bfloat16)
    args, kw = batch(7, n=8, L=64)
    args = tuple(a.cuda() if torch.is_tensor(a) else a for a in args)
    kw = {k: v.cuda() for k, v in kw.items()}
    with torch.no_grad():
        g, _ = gen(*args, **kw)
        b, _ = c(*args, **kw)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            a, _ = master(*args, **kw)
    gap_copy, gap_auto = (b.float() - g.float()).abs().mean(), (a.float() - g.float()).abs().mean()
    assert gap_copy <= gap_auto + 1e-6 and gap_auto < 0.1, (gap_copy, gap_auto)
