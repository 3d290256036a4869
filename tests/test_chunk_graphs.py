"""Prefill chunks in CUDA graphs (r1/chunk_graphs.py): the buckets, the padding, and that padding changes
nothing for the real rows (on the CPU, the padded layout run eagerly; on CUDA, the captured graphs)."""
import random
from types import SimpleNamespace

import pytest
import torch

from r1.chunk_graphs import MIN_Q, PAD_Q, TOKEN_BUCKETS, bucket, pad
from r1.generate import BUCKETS, Generator, Sampling
from r1.model import CacheStep, KVCache, Transformer, tiny_config


def test_bucket_holds_every_chunk():
    rng = random.Random(0)
    for _ in range(2000):
        B = rng.randint(1, 300)
        lens = [rng.randint(1, 200) for _ in range(B)]
        N, q = sum(lens), max(lens)
        shape = bucket(N, B, q, BUCKETS, 2048)
        if N > TOKEN_BUCKETS[-1]:
            assert shape is None
            continue
        if shape is None:  # only when the pad rows would pass the largest row bucket
            Qp = max(MIN_Q, 1 << (q - 1).bit_length())
            assert B + -(-(min(b for b in TOKEN_BUCKETS if b >= N) - N) // Qp) > BUCKETS[-1]
            continue
        Np, Bp, Qp = shape
        assert Np in TOKEN_BUCKETS and Np >= N and Np < 1.5 * max(N, 16) + 1
        assert Bp in BUCKETS and Bp >= B and Qp >= max(q, MIN_Q) and Qp & (Qp - 1) == 0
        assert (Bp - B) * Qp >= Np - N
    assert bucket(10, 2, 600, BUCKETS, 512) is None  # a row longer than the cache's positions: eager
    assert bucket(64, 4, 16, BUCKETS, 2048) == (64, 4, 16)  # exact fit: no pad row
    # chunks that extend live rows (by_row) need no max_q: their shape does not depend on it, pad rows of PAD_Q
    assert bucket(100, 5, 90, BUCKETS, 2048, by_row=True) == bucket(100, 5, 1, BUCKETS, 2048, by_row=True) == (
        128, 8, PAD_Q)


def test_pad_layout():
    ids, pos, rows, cu = [5, 6, 7, 8, 9], [10, 11, 3, 4, 5], [2, 0], [0, 2, 5]
    token_rows, kv_lens = [0, 0, 1, 1, 1], [12, 6]
    shape = bucket(5, 2, 3, BUCKETS, 64)
    assert shape == (16, 4, 16)  # one pad row of 11 tokens, one empty row (the row bucket after 2 is 4)
    pids, ppos, ptr, prows, pcu, plens = pad(ids, pos, token_rows, rows, cu, kv_lens, shape, scratch=9)
    assert pids[:5] == ids and ppos[:5] == pos and ptr[:5] == token_rows and prows == [2, 0, 9, 9]
    assert pids[5:] == [0] * 11 and ppos[5:] == list(range(11)) and ptr[5:] == [2] * 11
    assert pcu == [0, 2, 5, 16, 16] and plens == [12, 6, 11, 0]
    # more rows than pad tokens need: the rest are empty
    out = pad([1] * 47, list(range(47)), [0] * 47, [0], [0, 47], [47], (48, 4, 64), scratch=3)
    assert out[4] == [0, 47, 48, 48, 48] and out[5] == [47, 1, 0, 0] and out[3] == [0, 3, 3, 3]
    with pytest.raises(ValueError, match="does not pad"):
        pad([1] * 40, list(range(40)), [0] * 40, [0], [0, 40], [40], (64, 2, 16), scratch=3)


def _chunk(model, cache, ids, pos, token_rows, rows, cu, kv_lens, fresh, shape=None, scratch=0):
    """model.hidden over one chunk, as it is (shape None) or padded to shape, eagerly -> the real tokens'."""
    n = len(ids)
    if shape is not None:
        ids, pos, token_rows, rows, cu, kv_lens = pad(ids, pos, token_rows, rows, cu, kv_lens, shape, scratch)
    step = CacheStep(torch.tensor(rows), torch.tensor(token_rows), torch.tensor(cu, dtype=torch.int32),
                     max(b - a for a, b in zip(cu, cu[1:])) if shape is None else shape[2],
                     torch.tensor(kv_lens, dtype=torch.int32), fresh=fresh, max_kv=max(kv_lens))
    with torch.no_grad():
        return model.hidden(torch.tensor(ids), torch.tensor(pos), cache=cache, step=step)[:n]


def _layout(chunks):
    """[(slot, start, ids)] -> the host lists of one chunk."""
    ids, pos, token_rows, cu = [], [], [], [0]
    for i, (_, start, t) in enumerate(chunks):
        ids += t
        pos += range(start, start + len(t))
        token_rows += [i] * len(t)
        cu.append(cu[-1] + len(t))
    return ids, pos, token_rows, [s for s, _, _ in chunks], cu, [s + len(t) for _, s, t in chunks]


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_padded_chunks_change_nothing_for_real_rows(arch):
    """First prompts then continuations, each run as is and padded to its bucket: the same hidden states
    for the real tokens, and the same keys and values in the real rows' slots."""
    torch.manual_seed(0)
    model = Transformer(tiny_config(arch, vocab_size=256)).eval()
    rng = random.Random(1)
    slots, L = 6, 160
    caches = [KVCache.empty(model.cfg, slots + 1, L, torch.float32, "cpu") for _ in range(2)]
    prompts = {s: [rng.randrange(256) for _ in range(rng.randint(3, 40))] for s in (4, 0, 2, 5)}
    first = [(s, 0, p) for s, p in prompts.items()]
    for turn in range(3):
        chunks = first if turn == 0 else [(s, len(prompts[s]) - n, prompts[s][-n:])
                                          for s, n in new.items()]
        lay = _layout(chunks)
        shape = bucket(len(lay[0]), len(chunks), max(len(t) for _, _, t in chunks), BUCKETS, L)
        assert shape[0] > len(lay[0]) or shape[1] > len(chunks)  # something is padded
        want = _chunk(model, caches[0], *lay, fresh=turn == 0)
        got = _chunk(model, caches[1], *lay, fresh=turn == 0, shape=shape, scratch=slots)
        assert (got - want).abs().max() < 1e-5
        for s, p in prompts.items():
            n = len(p)
            assert torch.allclose(caches[0].k[:, s, :n], caches[1].k[:, s, :n], atol=1e-5)
            assert torch.allclose(caches[0].v[:, s, :n], caches[1].v[:, s, :n], atol=1e-5)
        new = {s: rng.randint(1, 30) for s in rng.sample(sorted(prompts), 3)}  # observations of some rows
        for s, n in new.items():
            prompts[s] += [rng.randrange(256) for _ in range(n)]


@pytest.mark.gpu
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_gpu_chunk_graphs_match_eager_chunks(arch):
    """A generator's first-prompt and continuation chunks through captured graphs give the eager
    chunks' hidden states (bf16 rounding of another matmul shape) and fill the cache alike."""
    torch.manual_seed(0)
    model = Transformer(tiny_config(arch, vocab_size=256)).cuda().to(torch.bfloat16).eval()
    model.requires_grad_(False)
    graphed = Generator(model, 4, 128, cuda_graphs=True)
    eager = Generator(model, 4, 128, cuda_graphs=True)
    eager.chunk_graphs = None
    assert graphed.chunk_graphs.on
    rng = random.Random(0)
    rows = [SimpleNamespace(slot=s, prompt=[rng.randrange(256) for _ in range(rng.randint(5, 50))])
            for s in (3, 0, 1)]
    batches = [([(r.slot, 0, r.prompt) for r in rows], None)]
    for r in rows[:2]:
        r.prompt = r.prompt + [rng.randrange(256) for _ in range(rng.randint(1, 40))]
    batches.append(([(r.slot, len(r.prompt) - n, r.prompt[-n:]) for r, n in zip(rows[:2], (7, 20))], None))
    # a mixed step: row 1 decodes one token (its id on the device) and row 0 appends 25 more tokens
    new = [rng.randrange(256) for _ in range(25)]
    mixed = [(1, len(rows[2].prompt), [0]), (0, len(rows[0].prompt), new)]
    batches.append((mixed, torch.tensor([rng.randrange(256)], device="cuda")))
    with torch.no_grad():
        for batch, dev_ids in batches:
            a, b = graphed._forward_chunk(batch, dev_ids), eager._forward_chunk(batch, dev_ids)
            assert a.shape == b.shape and (a.float() - b.float()).abs().max() < 0.05
            a2 = graphed._forward_chunk(batch, dev_ids)  # a replay of the captured graph, same result
            assert torch.equal(a, a2)
    # the continuation (27 tokens, 2 rows, the longest 20) and the mixed step (26 tokens, 2 rows, the longest
    # 25) share their token and row buckets: by_row chunks need no max_q, so one graph serves both
    assert graphed.chunk_graphs.calls["graph"] == 6 and len(graphed.chunk_graphs.graphs) == 2
    rows[0].prompt += new
    for r in rows:
        n = len(r.prompt)
        assert (graphed.cache.k[:, r.slot, :n].float() - eager.cache.k[:, r.slot, :n].float()).abs().max() < 0.05


@pytest.mark.gpu
def test_gpu_multi_turn_generation_with_chunk_graphs():
    """Greedy multi-turn generation with chunk graphs against chunks run eagerly: the same tokens, also
    when one admission runs several chunks (each graph replay overwrites the shared output buffer)."""
    torch.manual_seed(0)
    model = Transformer(tiny_config("qwen2", vocab_size=256)).cuda().to(torch.bfloat16).eval()
    model.requires_grad_(False)
    outs = []
    for graphs in (True, False):
        # prefill_tokens=32: the first prompts take several chunks, one row split across two of them
        gen = Generator(model, 4, 256, cuda_graphs=True, prefill_tokens=32)
        gen.set_sampling(Sampling(temperature=0))
        if not graphs:
            gen.chunk_graphs = None
        prompts = {"a": list(range(1, 21)), "b": list(range(30, 55)), "c": [9] * 17}
        tokens = []
        for turn in range(3):  # the same keys, never released: turns 2 and 3 are continuation chunks
            for k, p in prompts.items():
                gen.submit(k, p, 12)
            done = {}
            while gen.busy():
                for c in gen.step():
                    done[c.key] = c
            prompts = {k: c.prompt_ids + c.token_ids + [7, 7, 7 + turn] for k, c in done.items()}
            tokens.append({k: c.token_ids for k, c in done.items()})
        outs.append(tokens)
        if graphs:
            assert gen.chunk_graphs.calls["graph"] >= 3 and gen.chunk_graphs.calls["eager"] == 0
    assert outs[0] == outs[1]
