"""The KV-cache generator against full forwards, a naive greedy loop and the trainer's logprobs."""
import random

import pytest
import torch

from r1.generate import Generator, Sampling, sample
from r1.model import CacheStep, KVCache, Transformer, pack, tiny_config


def tiny(arch="llama", seed=0, vocab=256, tie=False):
    """Untied by default: a tied random model mostly repeats its input token."""
    torch.manual_seed(seed)
    return Transformer(tiny_config(arch, tie=tie, vocab_size=vocab)).eval()


def full_logits(model, seq):
    ids, pos, cu, mx = pack([seq])
    with torch.no_grad():
        return model(ids, pos, cu, mx)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_cache_decode_matches_full_forward(arch):
    """Prefill rows of different lengths, decode through the cache, compare every step."""
    model = tiny(arch)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (3, 9, 5)]
    cache = KVCache.empty(model.cfg, 4, 32, torch.float32, "cpu")
    rows = torch.tensor([2, 0, 3])
    ids, pos, cu, mx = pack(prompts)
    lens = torch.tensor([len(p) for p in prompts])
    step = CacheStep(rows, torch.repeat_interleave(torch.arange(3), lens), cu, mx, lens.to(torch.int32))
    with torch.no_grad():
        h = model.hidden(ids, pos, cache=cache, step=step)
        ref = model(ids, pos, cu, mx)
        assert (model.head(h) - ref).abs().max() < 1e-4
        seqs = [list(p) for p in prompts]
        for _ in range(6):
            nxt = torch.randint(0, 256, (3,), generator=g)
            p = torch.tensor([len(s) for s in seqs])
            for s, t in zip(seqs, nxt.tolist()):
                s.append(t)
            st = CacheStep(rows, torch.arange(3), torch.arange(4, dtype=torch.int32), 1, (p + 1).to(torch.int32))
            got = model(nxt, p, cache=cache, step=st)
            for b in range(3):
                want = full_logits(model, seqs[b])[-1]
                assert (got[b] - want).abs().max() < 1e-4


def test_compiled_ops_write_the_cache_like_eager():
    """compile_ops() fuses RoPE with both cache writes (OPS.rope_write): the cache holds the same keys and
    values at the same slots and positions, and decode through it gives the eager logits."""
    from r1.model import compile_ops, default_ops

    model = tiny("qwen2")
    prompts, rows = [[5, 6, 7], [1, 2, 3, 4, 8, 9, 10]], torch.tensor([3, 1])
    ids, pos, cu, mx = pack(prompts)
    lens = torch.tensor([3, 7])
    runs = []
    for on in (False, True):
        cache = KVCache.empty(model.cfg, 4, 16, torch.float32, "cpu")
        compile_ops(on)
        try:
            with torch.no_grad():
                st = CacheStep(rows, torch.repeat_interleave(torch.arange(2), lens), cu, mx, lens.to(torch.int32))
                model.hidden(ids, pos, cache=cache, step=st)  # fresh prefill: writes, attends within
                one = CacheStep(rows, torch.arange(2), torch.arange(3, dtype=torch.int32), 1, (lens + 1).to(torch.int32))
                out = model(torch.tensor([11, 12]), lens, cache=cache, step=one)  # decode: reads the cache
        finally:
            default_ops()
        runs.append((cache, out))
    (c0, o0), (c1, o1) = runs
    assert c1.k.abs().sum() > 0 and c1.k[:, [0, 2]].abs().sum() == 0  # only the rows' slots were written
    assert (c0.k - c1.k).abs().max() < 1e-5 and (c0.v - c1.v).abs().max() < 1e-5
    assert (o0 - o1).abs().max() < 1e-4


def naive_greedy(model, prompt, n, stop=()):
    seq = list(prompt)
    for _ in range(n):
        t = int(full_logits(model, seq)[-1].argmax())
        seq.append(t)
        if t in stop:
            break
    return seq[len(prompt):]


def test_greedy_equals_naive_loop_with_continuous_batching():
    model = tiny()
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (4, 7, 2, 11, 5, 3)]
    gen = Generator(model, slots=2, max_len=64)  # fewer slots than prompts: slots are refilled
    outs = gen.generate(prompts, 10, Sampling(temperature=0))
    for p, o in zip(prompts, outs):
        assert o.token_ids == naive_greedy(model, p, 10)
        assert o.finish == "length"


def test_rows_with_different_max_new_share_full_decode_chunks():
    """Each row keeps exactly its max_new tokens (or stops at EOS within them), while a decode chunk runs
    as many steps as the neediest row wants: rows near their limit no longer cut every chunk short. A stop
    token sampled past a row's max_new does not count."""
    model = tiny()
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (4, 7, 2)]
    limits = [3, 9, 14]
    free = [naive_greedy(model, p, 14) for p in prompts]
    stop = free[0][5]  # row 0 would sample this at its 6th token, past its max_new of 3
    gen = Generator(model, slots=3, max_len=64, sync_every=8, stop_ids=[stop])
    gen.set_sampling(Sampling(temperature=0))
    for k, (p, m) in enumerate(zip(prompts, limits)):
        gen.submit(k, p, m)
    launches, done = 0, {}
    while gen.busy():
        launches += 1
        for c in gen.step():
            done[c.key] = c
    for k, (p, m) in enumerate(zip(prompts, limits)):
        want = naive_greedy(model, p, m, stop=[stop])
        assert done[k].token_ids == want
        assert done[k].finish == ("eos" if want[-1] == stop else "length")
        assert len(done[k].logprobs) == len(want)
    assert done[0].token_ids == free[0][:3] and done[0].finish == "length"
    assert launches == 2  # 1 + 8 + 5 tokens for the longest row (the old rule: chunks of 2, 6 and 4 steps)


def test_sampler_logprobs_equal_trainer_logprobs():
    model = tiny(seed=3)
    prompts = [[1, 2, 3], [9, 8, 7, 6, 5, 4], [42]]
    for s in (Sampling(temperature=0.7, seed=5), Sampling(temperature=1.3, top_p=0.9, top_k=20, seed=6)):
        gen = Generator(model, slots=3, max_len=40)
        for c in gen.generate(prompts, 12, s):
            seq = c.prompt_ids + c.token_ids
            logits = full_logits(model, seq)[len(c.prompt_ids) - 1:-1] / s.temperature
            ref = torch.log_softmax(logits, -1).gather(-1, torch.tensor(c.token_ids)[:, None])[:, 0]
            assert (ref - torch.tensor(c.logprobs)).abs().max() < 1e-4


def test_seeded_sampling_is_reproducible():
    model = tiny()
    runs = [Generator(model, 2, 40).generate([[1, 2], [3, 4, 5]], 8, Sampling(temperature=1.0, seed=11))
            for _ in range(2)]
    assert [c.token_ids for c in runs[0]] == [c.token_ids for c in runs[1]]


def test_top_k_and_top_p_restrict_support():
    torch.manual_seed(0)
    logits = torch.randn(2000, 10)
    tok, _ = sample(logits, Sampling(temperature=1.0, top_k=3))
    top3 = logits.topk(3, -1).indices
    assert (top3 == tok[:, None]).any(-1).all()
    logits = torch.tensor([[3.0, 2.0, 0.0, -1.0]]).repeat(2000, 1)
    tok, _ = sample(logits, Sampling(temperature=1.0, top_p=0.5))
    assert set(tok.tolist()) == {0}  # p(token 0) = 0.69 > 0.5 alone covers the nucleus


def test_stops_eos_and_length():
    model = tiny()
    prompt = [5, 6, 7]
    free = naive_greedy(model, prompt, 12)
    eos = free[4]
    gen = Generator(model, 1, 64, stop_ids=[eos])
    c = gen.generate([prompt], 12, Sampling(temperature=0))[0]
    first = free.index(eos)
    assert c.token_ids == free[: first + 1] and c.finish == "eos"
    c = Generator(model, 1, 64).generate([prompt], 3, Sampling(temperature=0))[0]
    assert c.token_ids == free[:3] and c.finish == "length"


def test_stop_string_split_across_tokens():
    """A stop string spanning several tokens (and starting mid-token) ends the response at its last token."""
    model = tiny()
    prompt = [5, 6, 7]
    s = Sampling(temperature=1.0, seed=3)
    free = Generator(model, 1, 64).generate([prompt], 16, s)[0].token_ids
    assert len(set(free[5:8])) > 1
    decode = lambda ids: "".join(f"<{t}>" for t in ids)  # noqa: E731 - a toy detokenizer
    stop = f"{free[5]}><{free[6]}><{free[7]}"[1:]  # starts inside token 5, ends inside token 7
    for sync in (1, 3, 16):
        gen = Generator(model, 1, 64, stop_strings=[stop], decode=decode, sync_every=sync)
        c = gen.generate([prompt], 16, s)[0]
        assert c.token_ids == free[:8] and c.finish == "stop"


@pytest.mark.parametrize("attn", ["default", "sdpa"])
def test_multi_turn_continuation_matches_fresh_prefill(attn, monkeypatch):
    """Turn 2 extends turn 1's ids: only the suffix is prefilled, and results equal a fresh run.
    `sdpa` runs the GPU's cache paths on the CPU: gather+SDPA decode and the batched chunk path."""
    if attn == "sdpa":
        monkeypatch.setattr("kernels.attention.PATHS.attention", "sdpa")
    model = tiny(seed=2)
    gen = Generator(model, 2, 96)
    gen.set_sampling(Sampling(temperature=0))
    gen.submit("ep", [1, 2, 3, 4], 6)
    (c1,) = run_until_done(gen)
    obs = [77, 78, 79]
    prompt2 = c1.prompt_ids + c1.token_ids + obs
    calls = []
    orig = gen._forward_chunk
    gen._forward_chunk = lambda batch, *a: calls.append(sum(len(t) for _, _, t in batch)) or orig(batch, *a)
    gen.submit("ep", prompt2, 6)
    (c2,) = run_until_done(gen)
    assert calls == [len(obs) + 1]  # the last sampled token + the observation, not the whole history
    assert c2.token_ids == naive_greedy(model, prompt2, 6)
    # the environment rewrote the context: the slot is re-prefilled from the new ids
    prompt3 = [9, 9] + c2.token_ids
    calls.clear()
    gen.submit("ep", prompt3, 4)
    (c3,) = run_until_done(gen)
    assert calls == [len(prompt3)]
    assert c3.token_ids == naive_greedy(model, prompt3, 4)


def run_until_done(gen):
    out = []
    while gen.busy():
        out += gen.step()
    return out


def test_bad_requests_are_clear_errors():
    gen = Generator(tiny(), 1, 16)
    with pytest.raises(ValueError, match="empty prompt"):
        gen.submit("a", [], 4)
    with pytest.raises(ValueError, match="does not fit the KV cache"):
        gen.submit("b", list(range(16)), 4)
    c = gen.generate([list(range(14))], 10, Sampling(temperature=0))[0]
    assert len(c.token_ids) == 2 and c.finish == "length"  # clipped to the cache


@pytest.mark.gpu
def test_gpu_graph_decode_matches_eager():
    torch.manual_seed(0)
    model = Transformer(tiny_config(vocab_size=256)).cuda().to(torch.bfloat16).eval()
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8], [9]]
    eager = Generator(model, 4, 64).generate(prompts, 16, Sampling(temperature=0))
    graphed = Generator(model, 4, 64, cuda_graphs=True).generate(prompts, 16, Sampling(temperature=0))
    assert [c.token_ids for c in eager] == [c.token_ids for c in graphed]


@pytest.mark.gpu
def test_gpu_capture_waits_for_another_threads_trace():
    """chunk_graphs.capture under train.overlap: while another thread FX-traces (compiles), compiled ops run eager,
    and a graph captured then would keep eager kernels for good. capture() waits for the trace to end, so no
    compiled-op call of the captured run fell back, and the replay computes what the op does."""
    import threading

    from torch.fx.experimental.proxy_tensor import make_fx

    from r1.chunk_graphs import capture
    from r1.model import OPS, compile_ops, default_ops, eager_fallbacks, swiglu

    tracing, release = threading.Event(), threading.Event()

    def held_trace(x):
        tracing.set()
        release.wait(60)
        return x + 1

    other = threading.Thread(target=lambda: make_fx(held_trace)(torch.ones(2)))
    gate, up = torch.randn(64, 128, device="cuda"), torch.randn(64, 128, device="cuda")
    try:
        compile_ops()
        OPS.swiglu(gate, up)  # compiled before the trace opens
        other.start()
        assert tracing.wait(60)
        threading.Timer(0.5, release.set).start()  # the trace ends while capture() waits
        before = eager_fallbacks()
        graph, out = capture(lambda: OPS.swiglu(gate, up))
        assert eager_fallbacks() == before
        graph.replay()
        torch.cuda.synchronize()
    finally:
        release.set()
        other.join()
        default_ops()
    assert torch.allclose(out, swiglu(gate, up), atol=1e-5)


@pytest.mark.gpu
def test_gpu_compiled_ops_graph_decode_matches_eager():
    """Compiled ops (the default on CUDA) inside the captured decode graph: the greedy tokens of eager ops, and sampled
    logprobs within bf16 rounding of them."""
    from r1.model import compile_ops, default_ops

    torch.manual_seed(0)
    model = Transformer(tiny_config("qwen2", vocab_size=256)).cuda().to(torch.bfloat16).eval()
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8], [9]]
    s = Sampling(temperature=1.0, seed=3)
    try:
        compile_ops(False)
        eager = Generator(model, 4, 64, cuda_graphs=True).generate(prompts, 16, s)
        compile_ops()
        fused = Generator(model, 4, 64, cuda_graphs=True).generate(prompts, 16, s)
    finally:
        default_ops()
    assert [c.token_ids for c in eager] == [c.token_ids for c in fused]
    gap = max(abs(a - b) for e, f in zip(eager, fused) for a, b in zip(e.logprobs, f.logprobs))
    assert gap < 0.05


def test_generator_fuses_projections_of_generation_only_models(monkeypatch):
    """fuse=True gives the greedy tokens and logprobs of separate projections; by default (kernels.fuse=true) the
    generator fuses only a CUDA model without gradients (fusing replaces Parameter objects an optimizer may
    hold), so never on the CPU."""
    from r1.model import _fused_live

    prompts = [[1, 2, 3], [4, 5, 6, 7, 8], [9]]
    ref = Generator(tiny(), 4, 64).generate(prompts, 12, Sampling(temperature=0))
    model = tiny().requires_grad_(False)
    out = Generator(model, 4, 64, fuse=True).generate(prompts, 12, Sampling(temperature=0))
    attn = model.model.layers[0].self_attn
    assert _fused_live(attn.fused)
    assert [c.token_ids for c in out] == [c.token_ids for c in ref]
    assert max(abs(a - b) for o, r in zip(out, ref) for a, b in zip(o.logprobs, r.logprobs)) < 1e-5
    cpu_default = tiny().requires_grad_(False)
    Generator(cpu_default, 2, 16)
    assert cpu_default.model.layers[0].self_attn.fused is None


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_fused_projections_graph_decode(dtype):
    """kernels.fuse=true's path (fused q/k/v and gate/up matmuls) under CUDA graphs: the greedy tokens and
    logprobs of the separate projections (bf16: the Triton decode kernel reads the strided v)."""
    torch.manual_seed(0)
    model = Transformer(tiny_config("qwen2", vocab_size=256)).cuda().to(dtype).eval().requires_grad_(False)
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8], [9]]
    ref = Generator(model, 4, 64, cuda_graphs=True, fuse=False).generate(prompts, 16, Sampling(temperature=0))
    out = Generator(model, 4, 64, cuda_graphs=True, fuse=True).generate(prompts, 16, Sampling(temperature=0))
    assert model.model.layers[0].self_attn.fused is not None
    assert [c.token_ids for c in out] == [c.token_ids for c in ref]
    tol = 1e-4 if dtype == torch.float32 else 0.05
    assert max(abs(a - b) for o, r in zip(out, ref) for a, b in zip(o.logprobs, r.logprobs)) < tol


def test_sampling_does_not_depend_on_batch_composition():
    """Counter-based noise: each request's sample is a function of (seed, key, position), not of its neighbours."""
    model = tiny()
    prompts = {"a": [1, 2], "b": [3, 4, 5], "c": [6], "d": [7, 8, 9, 10]}

    def run(keys, slots, seed=7):
        gen = Generator(model, slots, 40, sampling=Sampling(temperature=1.0, seed=seed))
        for k in keys:
            gen.submit(k, prompts[k], 10)
        out = {}
        while gen.busy():
            for c in gen.step():
                out[c.key] = c.token_ids
                gen.release(c.key)  # a finished key frees its slot for the next one
        return out

    together = run("abcd", 4)
    for k in "abcd":
        assert run(k, 1)[k] == together[k]
    assert run("dcba", 2) == together
    assert run("abcd", 4, seed=8) != together


def test_row_noise_is_exponential():
    from r1.generate import row_noise

    q = row_noise(torch.arange(64), torch.full((64,), 5), 4096)
    assert q.shape == (64, 4096) and (q > 0).all()
    assert abs(q.mean().item() - 1.0) < 0.02 and abs(q.var().item() - 1.0) < 0.05
    assert not torch.equal(q, row_noise(torch.arange(64), torch.full((64,), 6), 4096))


def test_slot_bookkeeping_many_requests():
    """Slots: lowest free first, reused after release, free_slots() counts queued newcomers, and a
    running or queued key cannot be released. Admitting thousands of requests stays linear (the
    old free-slot scan was quadratic in the slot count): counted in lines of r1/generate.py run, not
    in seconds, so the check holds on a loaded machine."""
    import sys

    import r1.generate

    def lines_to_admit(n):
        gen = Generator(tiny(), slots=n, max_len=8)
        count = [0]

        def tracer(frame, event, arg):
            if frame.f_code.co_filename != r1.generate.__file__:
                return None
            if event == "line":
                count[0] += 1
            return tracer

        previous = sys.gettrace()
        sys.settrace(tracer)
        try:
            for i in range(n):
                gen.submit(i, [1, 2], 1)
            gen._admit()
        finally:
            sys.settrace(previous)
        return count[0]

    small, large = lines_to_admit(250), lines_to_admit(1000)
    assert large < 4.5 * small, (small, large)  # linear: 4x the lines for 4x the requests; quadratic: 16x

    model = tiny()
    gen = Generator(model, slots=3000, max_len=8)
    assert gen.free_slots() == 3000
    for i in range(3000):
        gen.submit(i, [1, 2], 1)
    assert gen.free_slots() == 0
    gen._admit()
    assert [gen.owner[i] for i in (0, 1, 2999)] == [0, 1, 2999]
    with pytest.raises(ValueError, match="still queued or running"):
        gen.release(5)
    with pytest.raises(ValueError, match="already queued or running"):
        gen.submit(5, [1, 2, 3], 1)
    gen.running.clear()  # as if every row had finished
    gen.release(7)
    gen.release(3)
    assert gen.free_slots() == 2
    gen.submit("a", [4], 1)
    gen.submit(8, [1, 2, 5], 1)  # a key that keeps its slot takes no free one
    assert gen.free_slots() == 1
    gen._admit()
    assert gen.owner["a"] == 3 and gen.owner[8] == 8 and gen.free_slots() == 1


def test_launch_then_finish_is_step_and_takes_requests_in_between():
    """launch() queues a decode chunk and returns; finish() collects it (the agent loop steps environments in
    between). A request submitted in between joins at the next launch; the tokens are step()'s."""
    model = tiny()
    s = Sampling(temperature=1.0, seed=3)

    def play(split):
        gen = Generator(model, slots=2, max_len=32, sampling=s)
        gen.submit("a", [1, 2, 3], 5)
        out, late = {}, True
        while gen.busy():
            if split:
                gen.launch()
                with pytest.raises(RuntimeError, match="twice"):
                    gen.launch()
                if late:  # submitted while the chunk is in flight
                    gen.submit("b", [4, 5], 4)
                    late = False
                done = gen.finish()
            else:
                done = gen.step()
                if late:
                    gen.submit("b", [4, 5], 4)
                    late = False
            for c in done:
                out[c.key] = (c.token_ids, c.logprobs)
                gen.release(c.key)
        assert gen.finish() == [] and not gen.pending
        return out

    assert play(True) == play(False) and set(play(True)) == {"a", "b"}


def play_episodes(gen, starts, turns, obs_len=3, pipelined=False):
    """An agent loop in miniature: each key plays `turns[k]` turns; after a turn its next prompt is the last
    prompt + the response + `obs_len` observation ids, submitted at once (a slot's cache is reused). With
    `pipelined`, the loop keeps one launch in flight (finish(keep=1)), as r1/rollout.py does on the GPU."""
    left = dict(enumerate(turns))
    for k, p in enumerate(starts):
        gen.submit(k, p, 5 + k % 4)
    got, launches = {}, 0
    while gen.busy():
        launched = gen.launch()
        launches += launched
        for c in gen.finish(keep=int(launched and pipelined)):
            got.setdefault(c.key, []).append((c.prompt_ids, c.token_ids, c.logprobs, c.finish))
            left[c.key] -= 1
            if left[c.key]:
                obs = [(7 * c.key + j + len(got[c.key])) % 200 + 3 for j in range(obs_len)]
                gen.submit(c.key, c.prompt_ids + c.token_ids + obs, 5 + c.key % 4)
            else:
                gen.release(c.key)
    assert not gen.pending and not gen.running
    return got, launches


@pytest.mark.parametrize("slots", [1, 2, 5])
def test_a_launch_in_flight_changes_no_token(slots):
    """overlap=True (the CUDA default): launch() queues a chunk behind the one in flight and finish(keep=1)
    collects only the older one, so rows that stopped there ride along one chunk; their extra tokens are
    dropped and the keys they wrote are overwritten before any read. Every turn of every episode (sampled,
    stop ids, continuations that reuse the cache, slots refilled) equals the one-chunk-at-a-time run's,
    with and without mix (continuations prefilled in a decode step)."""
    model = tiny(seed=3)
    g = torch.Generator().manual_seed(5)
    starts = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (4, 9, 2, 6, 3)]
    turns = [3, 1, 4, 2, 2]
    stop = [int(t) for t in torch.randint(0, 256, (24,), generator=g)]  # frequent stops: uneven turns
    runs = []
    for overlap, mix in ((False, False), (True, False), (False, True), (True, True)):
        gen = Generator(model, slots, 80, stop_ids=stop, sync_every=3, overlap=overlap, mix=mix,
                        sampling=Sampling(temperature=1.0, seed=4))
        runs.append(play_episodes(gen, starts, turns, pipelined=overlap))
    want = runs[0][0]
    assert sum(len(v) for v in want.values()) == sum(turns)
    assert "eos" in {f for v in want.values() for *_, f in v}  # some turns stopped mid-chunk
    for got, _ in runs[1:]:
        assert got.keys() == want.keys()
        for k in want:
            assert [(p, t, f) for p, t, _, f in got[k]] == [(p, t, f) for p, t, _, f in want[k]]
            for (_, _, a, _), (_, _, b, _) in zip(got[k], want[k]):
                assert a == pytest.approx(b, abs=1e-5)


def test_a_continuation_joins_the_decode_step_of_its_chunk():
    """mix=True (the CUDA default): an observation appended to a live row is prefilled in the same forward
    as the other rows' next decode step (one forward where there were two), and the turn is the same."""
    model = tiny(seed=4)
    forwards = []
    hidden = model.hidden
    model.hidden = lambda *a, **k: forwards.append((k["step"].by_row, a[0].shape[0])) or hidden(*a, **k)
    got = []
    for mix in (False, True):
        gen = Generator(model, 2, 64, sync_every=2, mix=mix, sampling=Sampling(temperature=1.0, seed=1))
        gen.submit("long", [5, 6, 7], 20)
        gen.submit("short", [8, 9], 2)
        out = gen.step() + gen.step()  # "short" is done after 2 tokens; "long" goes on
        (c,) = [c for c in out if c.key == "short"]
        forwards.clear()
        gen.submit("short", c.prompt_ids + c.token_ids + [10, 11, 12], 4)
        gen.step()
        # a chunk of 2 steps; mixed: the first forward holds the decode row's token and the 4 new ids
        assert forwards == ([(True, 5), (False, 2)] if mix else [(True, 4), (False, 2), (False, 2)])
        got.append(run_until_done(gen) + [c])
    model.hidden = hidden
    key = lambda cs: sorted((c.key, c.prompt_ids, c.token_ids) for c in cs)  # noqa: E731
    assert key(got[0]) == key(got[1])


def test_overlap_allows_one_launch_in_flight_and_no_more():
    gen = Generator(tiny(), 2, 32, overlap=True, sampling=Sampling(temperature=0))
    gen.submit("a", [1, 2, 3], 40)
    with pytest.raises(ValueError, match="steps >= 1, got -2"):  # a loop with a bad chunk would spin forever
        gen.launch(-2)
    assert gen.launch() and gen.launch()
    with pytest.raises(RuntimeError, match="two chunks in flight"):
        gen.launch()
    assert gen.finish(keep=1) == [] and len(gen.pending) == 1
    out = run_until_done(gen)
    assert [c.key for c in out] == ["a"] and out[0].finish == "length" and len(out[0].token_ids) == 29
    assert not gen.launch()  # nothing to admit or decode: nothing queued


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_a_launch_in_flight_changes_no_token(dtype):
    """The overlapped schedule on the GPU path (CUDA graphs for decode; for bf16 also chunk graphs, pinned
    copies, CUDA events): the same turns as one launch at a time."""
    torch.manual_seed(3)
    model = Transformer(tiny_config(vocab_size=256)).cuda().to(dtype).eval()
    g = torch.Generator().manual_seed(5)
    starts = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (4, 9, 2, 6, 3)]
    stop = [int(t) for t in torch.randint(0, 256, (24,), generator=g)]
    runs = []
    for overlap, mix in ((False, False), (True, False), (True, True)):
        gen = Generator(model, 3, 80, stop_ids=stop, sync_every=3, overlap=overlap, mix=mix, cuda_graphs=True,
                        sampling=Sampling(temperature=1.0, seed=4))
        mixed, step = [], gen._mixed_step
        gen._mixed_step = lambda *a: mixed.append(len(a[1])) or step(*a)  # a[1]: the joining rows
        runs.append(play_episodes(gen, starts, [3, 1, 4, 2, 2], pipelined=overlap)[0])
        assert bool(mixed) == mix
        if mix and dtype == torch.bfloat16:  # the mixed steps ran in by-row chunk graphs, none eagerly
            assert gen.chunk_graphs.calls["eager"] == 0 and any(not k[0] for k in gen.chunk_graphs.graphs)
    assert sum(len(v) for v in runs[0].values()) == 12
    tokens = [{k: [t for _, t, _, _ in v] for k, v in run.items()} for run in runs]
    assert tokens[1] == tokens[0] and tokens[2] == tokens[0]


@pytest.mark.gpu
@pytest.mark.parametrize("fa4", ["1", "0"])
def test_gpu_sampled_tokens_do_not_depend_on_the_slot_count(fa4, monkeypatch):
    """bf16 with CUDA graphs, fa4 picked where installed (first prompts through it) and without it: eight
    requests sampled at temperature 1 in 1, 3 or 8 slots get the same tokens, the promise of the seeding
    (noise keyed by request and position) carried through the kernels."""
    from kernels import attention as A

    monkeypatch.setattr("kernels.attention.PATHS.attention", "")
    monkeypatch.setattr("kernels.attention.PATHS.fa4", fa4 == "1")
    torch.manual_seed(3)
    model = Transformer(tiny_config(vocab_size=256, tie=False, hidden_size=128, num_heads=8, num_kv_heads=2,
                                    head_dim=64))  # untied: a tied random model repeats one token
    model = model.cuda().to(torch.bfloat16).eval()
    q = torch.empty(1, 8, 64, device="cuda", dtype=torch.bfloat16)
    if fa4 == "1" and A.pick_backend(q) != "fa4":
        pytest.skip(f"fa4 not picked here: {A.fa4_refusal(q)}")
    g = torch.Generator().manual_seed(6)
    prompts = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (4, 9, 2, 6, 3, 12, 1, 7)]
    runs = []
    for slots in (1, 3, 8):
        gen = Generator(model, slots, 64, cuda_graphs=True)
        runs.append([o.token_ids for o in gen.generate(prompts, 12, Sampling(temperature=1.0, seed=4))])
    assert all(len(t) == 12 and len(set(t)) > 6 for t in runs[0])  # 12 tokens each, not one repeated
    assert runs[1] == runs[0] and runs[2] == runs[0]


def play_random(gen, r, steps, pipelined):
    """Episodes of random shape near the cache's end: prompts up to max_len - 1, max_new 1, 2, 5 or 50,
    observations of 0-4 ids, some next prompts rewritten (a fresh prefill), launches of varying length."""
    E = r.randint(2, 6)
    starts = [[r.randrange(256) for _ in range(r.randint(1, gen.max_len - 1))] for _ in range(E)]
    left = {k: r.randint(1, 4) for k in range(E)}
    maxnew = [r.choice([1, 2, 5, 50]) for _ in range(E)]
    obs = [r.randint(0, 4) for _ in range(E)]
    for k, p in enumerate(starts):
        gen.submit(k, p, maxnew[k])
    got, i = {}, 0
    while gen.busy():
        launched = gen.launch(steps[i % len(steps)])
        i += 1
        for c in gen.finish(keep=int(launched and pipelined)):
            got.setdefault(c.key, []).append((c.prompt_ids, c.token_ids, c.finish))
            left[c.key] -= 1
            nxt = c.prompt_ids + c.token_ids + [(7 * c.key + j + len(got[c.key])) % 200 + 3 for j in range(obs[c.key])]
            if left[c.key] and len(nxt) < gen.max_len:
                gen.submit(c.key, nxt if (c.key + len(got[c.key])) % 3 else nxt[:2] + nxt[-3:], maxnew[c.key])
            else:
                gen.release(c.key)
    assert not gen.pending and not gen.running
    return got


def test_a_launch_in_flight_at_the_cache_end_changes_no_token():
    """Rows that ride along near max_len must not write past it (a bound counting only collected tokens would:
    an index error here, a write into the next slot on the GPU), and every turn equals the one-at-a-time run's."""
    model = tiny(seed=3)
    for trial in range(12):
        r = random.Random(trial)
        slots, max_len = r.randint(1, 4), r.randint(8, 40)
        stop = r.sample(range(256), r.choice([0, 10, 60]))
        steps = [r.choice([None, 1, 2, 3, 7]) for _ in range(5)]
        temperature = r.choice([0.0, 1.0])
        runs = []
        for overlap, mix in ((False, False), (True, False), (True, True)):
            gen = Generator(model, slots, max_len, stop_ids=stop, sync_every=3, overlap=overlap, mix=mix,
                            sampling=Sampling(temperature=temperature, seed=trial))
            runs.append(play_random(gen, random.Random(100 + trial), steps if overlap else [None], overlap))
        assert runs[1] == runs[0] and runs[2] == runs[0], trial
