"""rollout.share_prompt: identical new prompts of one admission are prefilled once (r1/generate.py _admit).

Checked on a tiny model: the same completions (tokens, and logprobs within
float32 rounding) with and without sharing, sampled at temperature 1 with
groups of identical prompts beside distinct ones; the prompt tokens the
forward sees (each distinct prompt once); the followers' cache rows equal the
leader's at the prompt's positions, bit for bit; a row whose slot holds a
prefix (a continuation) is not shared; the key reaches the agent loop's
generator from the config, and a run with it samples what the trainer scores.
"""
import pytest
import torch

from r1.generate import Generator, Sampling
from r1.model import Transformer, tiny_config


def tiny():
    torch.manual_seed(0)
    return Transformer(tiny_config("llama", tie=False, vocab_size=256)).eval()


def prompts():
    g = torch.Generator().manual_seed(1)
    a, b = (torch.randint(0, 256, (n,), generator=g).tolist() for n in (9, 5))
    c = torch.randint(0, 256, (7,), generator=g).tolist()
    return [a, a, a, b, c, b, a, b]  # two groups of identical prompts beside a distinct one, interleaved


def counted(gen):
    """The generator with its prefill forward counting the prompt tokens it is given."""
    seen = []
    forward = gen._forward_chunk

    def chunk(items, dev_ids=None):
        seen.extend(len(ids) for _, _, ids in items)
        return forward(items, dev_ids)

    gen._forward_chunk = chunk
    return seen


@pytest.mark.parametrize("slots", [8, 3])
def test_same_completions_with_one_prefill_a_prompt(slots):
    model = tiny()
    runs, seen = [], []
    for share in (False, True):
        gen = Generator(model, slots, 64, share_prompt=share)
        seen.append(counted(gen))
        runs.append(gen.generate(prompts(), 12, Sampling(temperature=1.0, seed=7)))
    plain, shared = runs
    assert [c.token_ids for c in plain] == [c.token_ids for c in shared]
    for a, b in zip(plain, shared):
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5)
    assert sum(seen[0]) == sum(len(p) for p in prompts())
    if slots == 8:  # all eight admitted at once: each distinct prompt forwarded once
        assert sorted(seen[1]) == [5, 7, 9]
    else:  # three at a time (slots): the groups repeat across admissions, and only within one is a prompt shared
        assert sum(seen[1]) < sum(seen[0])
    assert len({tuple(c.token_ids) for c in shared}) > 3  # each row samples with its own noise


def test_followers_hold_the_leaders_cache_rows():
    model = tiny()
    p = prompts()
    gen = Generator(model, 8, 64, share_prompt=True)
    gen.set_sampling(Sampling(temperature=1.0, seed=3))
    for i, q in enumerate(p):
        gen.submit(i, q, 4)
    gen.launch(1)
    gen.finish()
    slot = gen.owner
    for i, q in enumerate(p):
        lead = p.index(q)
        n = len(q)
        for t in (gen.cache.k, gen.cache.v):
            assert torch.equal(t[:, slot[i], :n], t[:, slot[lead], :n])
    ref = Generator(model, 8, 64)
    ref.set_sampling(Sampling(temperature=1.0, seed=3))
    for i, q in enumerate(p):
        ref.submit(i, q, 4)
    ref.launch(1)
    ref.finish()
    for i, q in enumerate(p):  # what the row's own prefill writes, within float32 rounding
        assert torch.allclose(gen.cache.k[:, slot[i], :len(q)], ref.cache.k[:, ref.owner[i], :len(q)], atol=1e-5)


def test_continuations_are_not_shared():
    """Two rows whose slots already hold the same prefix extend it with the same observation: each prefills its
    own suffix (only rows with nothing cached are shared)."""
    model = tiny()
    gen = Generator(model, 4, 64, share_prompt=True, mix=False)
    gen.set_sampling(Sampling(temperature=0))
    for k in (0, 1):
        gen.submit(k, [1, 2, 3], 3)
    outs = {}
    while gen.busy():  # keys keep their slots (no release): their caches hold the first turn
        outs.update((c.key, c) for c in gen.step())
    assert outs[0].token_ids == outs[1].token_ids  # greedy: the same first turns
    seen = counted(gen)
    for k in (0, 1):  # the same observation appended: identical new prompts, each extending its own cache
        gen.submit(k, outs[k].prompt_ids + outs[k].token_ids + [9, 9], 2)
    while gen.busy():
        gen.step()
    assert seen == [3, 3]  # each row its own suffix: its last sampled token (fed, not yet cached) and the two


def test_the_config_key_reaches_the_loops_generator(tmp_path):
    import train
    from r1.config import load_config
    from test_trainer import SMOKE, TINY, read_metrics

    cfg = load_config(SMOKE, ["rollout.share_prompt=true"])
    assert cfg.rollout.share_prompt is True and load_config(SMOKE).rollout.share_prompt is False
    from r1 import actor

    seen = []
    real = actor.Generator

    def spy(*args, **kw):
        seen.append(kw.get("share_prompt"))
        return real(*args, **kw)

    actor.Generator = spy
    try:
        run = str(tmp_path / "run")
        train.main(["--config", SMOKE, *TINY, "rollout.share_prompt=true", "log.tensorboard=false", f"run.dir={run}"])
    finally:
        actor.Generator = real
    assert seen and all(seen)
    m = read_metrics(run)
    assert len(m) == 2 and all(x["logprob_gap_max"] < 1e-4 for x in m)


@pytest.mark.gpu
def test_on_cuda_with_graphs_the_followers_hold_the_leaders_rows():
    """The same on the GPU, prefill chunks and decode in CUDA graphs, a chunk in flight while the next is queued
    (kernels.launch_ahead's default), in bf16 (prefill graphs need a half-precision model): the leader's hidden state is read
    out of a graph's output buffer; the followers' cache rows are the leader's, bit for bit, after a few chunks,
    and the first tokens' logprobs are the unshared run's within bf16 rounding."""
    model = tiny().cuda().to(torch.bfloat16)
    p = prompts()
    firsts = []
    for share in (False, True):
        gen = Generator(model, 8, 64, cuda_graphs=True, share_prompt=share)
        gen.set_sampling(Sampling(temperature=1.0, seed=3))
        for i, q in enumerate(p):
            gen.submit(i, q, 6)
        out = {}
        while gen.busy():
            out.update((c.key, c) for c in gen.step())
        firsts.append([(out[i].token_ids[0], out[i].logprobs[0]) for i in range(len(p))])
        assert gen.chunk_graphs.calls["graph"] > 0  # the prefill ran in a captured graph
        if share:
            for i, q in enumerate(p):
                lead = p.index(q)
                for t in (gen.cache.k, gen.cache.v):
                    assert torch.equal(t[:, gen.owner[i], :len(q)], t[:, gen.owner[lead], :len(q)])
    same = [(a[1], b[1]) for a, b in zip(*firsts) if a[0] == b[0]]  # bf16 rounding may flip a near-tied draw
    assert len(same) >= len(p) // 2
    assert all(abs(a - b) < 5e-2 for a, b in same), same
