"""AgentEnvLoop with the real KV-cache generator, a tiny random model and the real SmolLM2 tokenizer.

What is checked: each step's response ids are the sampled ids, untouched;
append-policy prompts are token concatenations (prompt_{t+1} = prompt_t +
response_t + forced closing + observation); many uneven episodes on few
slots all finish with every step recorded, in (sample, index) order; greedy
results do not depend on how episodes were batched; context budgets end
episodes cleanly.
"""
import pytest
import torch

from r1.envs.base import Env, Observation
from r1.generate import Generator, Sampling
from r1.model import Transformer, tiny_config
from r1.rollout import AgentEnvLoop
from r1.tokenizer import load_tokenizer

MAX_NEW = 8


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny matmuls: on a shared 2-core box, 2 intra-op threads run 10-30x slower than 1 under load."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("smollm2-135m-instruct")


@pytest.fixture(scope="module")
def model(tok):
    torch.manual_seed(0)
    m = Transformer(tiny_config("llama", tie=False, vocab_size=len(tok.hf))).eval()
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() == 2:  # small weights: near-flat logits, so sampling is diverse
                torch.nn.init.normal_(p, std=0.02)
    return m


class TurnsEnv(Env):
    """Ends after sample["turns"] steps; each observation is a `tool` message naming the step."""

    def reset(self, sample):
        self.turns, self.t = sample["turns"], 0
        return Observation(messages=[{"role": "user", "content": sample["question"]}])

    def step(self, action):
        self.t += 1
        if self.t >= self.turns:
            return None, 1.0, True, {"final": True}
        return Observation(messages=[{"role": "tool", "content": f"result {self.t}"}]), 0.1, False, {"tool_calls": 1}


class Recording(Generator):
    """The real generator, remembering every completion it handed out."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.returned = {}

    def finish(self, keep=0):
        out = super().finish(keep)
        for c in out:
            self.returned.setdefault(c.key, []).append((list(c.prompt_ids), list(c.token_ids), list(c.logprobs)))
        return out


def samples(turns):
    return [{"id": f"s{i}", "question": f"Question {i}: what is {i} + {i}?", "answer": str(2 * i), "turns": k}
            for i, k in enumerate(turns)]


def run_loop(tok, model, data, slots, n=1, temperature=0.0, policy="append", max_context=256, env_cls=TurnsEnv,
             workers=0, overlap=False, sync_every=None, mix=False):
    gen = Recording(model, slots, max_context, stop_ids=tok.stop_ids, overlap=overlap, mix=mix)
    gen.set_sampling(Sampling(temperature=temperature, seed=1))
    loop = AgentEnvLoop(gen, tok, lambda: env_cls(tok, max_context=max_context, max_new_tokens=MAX_NEW,
                                                  policy=policy), MAX_NEW, workers=workers, sync_every=sync_every)
    return loop.run(data, n=n), gen


def test_steps_are_token_exact(tok, model):
    data = samples([3, 1, 4, 2])
    trajs, gen = run_loop(tok, model, data, slots=3, temperature=1.0)
    assert sum(len(t.steps) for t in trajs) == 10
    for t in trajs:
        got = gen.returned[t.uid]
        assert len(got) == len(t.steps)
        for step, (prompt, ids, logprobs) in zip(t.steps, got):
            assert step.prompt_ids == prompt  # what the model saw
            assert step.response_ids == ids and step.logprobs == logprobs  # what it sampled, untouched
            assert len(step.logprobs) == len(step.response_ids) and step.mask == [1] * len(ids)
        for i, (a, b) in enumerate(zip(t.steps, t.steps[1:]), start=1):
            obs = tok.render_next([{"role": "tool", "content": f"result {i}"}])
            assert b.prompt_ids == a.prompt_ids + a.response_ids + tok.close_turn_ids(a.response_ids) + obs
        assert t.is_append_only()
    # Random tiny-model text rarely survives decode -> encode; whatever it does, the ids above are the sampled ones.
    drift = [s for t in trajs for s in t.steps if tok.encode(tok.decode(s.response_ids)) != s.response_ids]
    print(f"{len(drift)} of 10 responses would have changed under re-tokenization")


def test_many_uneven_episodes_finish_in_order_and_batching_does_not_change_greedy_results(tok, model):
    turns = [1, 4, 2, 3, 1, 2]
    data = samples(turns)
    trajs, _ = run_loop(tok, model, data, slots=4, n=2)
    assert [(t.group, t.uid) for t in trajs] == [(g, f"{g}-{i}") for g in range(6) for i in range(2)]
    for t in trajs:
        assert t.sample_id == data[t.group]["id"] and t.meta == {"answer": data[t.group]["answer"]}
        assert len(t.steps) == turns[t.group] and t.termination == "answered"
        assert [s.done for s in t.steps] == [False] * (turns[t.group] - 1) + [True]
        assert t.total_reward == pytest.approx(1.0 + 0.1 * (turns[t.group] - 1))
        assert all(0 < len(s.response_ids) <= MAX_NEW for s in t.steps)
    ids = lambda ts: [[(s.prompt_ids, s.response_ids) for s in t.steps] for t in ts]  # noqa: E731
    for a, b in zip(trajs[::2], trajs[1::2]):  # greedy: both episodes of a sample agree
        assert ids([a]) == ids([b])
    one, _ = run_loop(tok, model, data, slots=1, n=2)
    five, _ = run_loop(tok, model, data, slots=5, n=2)
    assert ids(one) == ids(trajs) == ids(five)
    for x, y in zip(one, five):
        for s, r in zip(x.steps, y.steps):
            assert s.logprobs == pytest.approx(r.logprobs, abs=1e-5)


def test_sampled_rollouts_do_not_depend_on_batching(tok, model):
    """Temperature 1: the same seed gives the same trajectories with 1, 3 or 5 slots (noise keyed by uid),
    and with the GPU's schedule (overlap: a chunk in flight while the loop steps environments, short chunks;
    mix: observations prefilled in the first decode step of their chunk)."""
    data = samples([2, 3, 1, 2])
    ids = lambda ts: [[(s.prompt_ids, s.response_ids) for s in t.steps] for t in ts]  # noqa: E731
    runs = [ids(run_loop(tok, model, data, slots=k, n=2, temperature=1.0)[0]) for k in (1, 3, 5)]
    assert runs[0] == runs[1] == runs[2]
    for k, every, mix in ((1, 4, False), (3, 2, False), (5, 16, False), (3, 4, True), (5, 2, True)):
        assert ids(run_loop(tok, model, data, slots=k, n=2, temperature=1.0, overlap=True,
                            sync_every=every, mix=mix)[0]) == runs[0]
    assert ids(run_loop(tok, model, data, slots=3, n=2, temperature=1.0, mix=True)[0]) == runs[0]
    a, b = runs[0][0], runs[0][1]  # two samples of one prompt differ (different uids)
    assert a != b


def test_env_thread_pool_gives_the_same_rollouts(tok, model):
    """workers > 0 (environments in a thread pool, for envs that block on I/O) plays the same episodes as
    the default, where the loop steps environments itself while the decode runs."""
    data = samples([3, 1, 4, 2])
    ids = lambda ts: [[(s.prompt_ids, s.response_ids, s.reward, s.done) for s in t.steps] for t in ts]  # noqa: E731
    inline, gen = run_loop(tok, model, data, slots=3, n=2, temperature=1.0)
    pooled, _ = run_loop(tok, model, data, slots=3, n=2, temperature=1.0, workers=2)
    assert ids(pooled) == ids(inline) and sum(len(t.steps) for t in inline) == 20
    assert not gen.busy() and not gen.pending
    pooled, gen = run_loop(tok, model, data, slots=3, n=2, temperature=1.0, workers=2, overlap=True, sync_every=3)
    assert ids(pooled) == ids(inline) and not gen.busy() and not gen.pending


@pytest.mark.parametrize("chunks", ["batched", "loop"])
def test_gpu_cache_paths_give_the_same_rollouts(tok, model, chunks, monkeypatch):
    """kernels.attention=sdpa runs the GPU's cache paths on the CPU (gather+SDPA decode; observations appended by the
    batched chunk call, or by the per-row loop with kernels.chunks=loop): sampled rollouts equal the default path's."""
    data = samples([3, 1, 4, 2])
    ids = lambda ts: [[(s.prompt_ids, s.response_ids) for s in t.steps] for t in ts]  # noqa: E731
    want = run_loop(tok, model, data, slots=3, n=2, temperature=1.0)[0]
    monkeypatch.setattr("kernels.attention.PATHS.attention", "sdpa")
    monkeypatch.setattr("kernels.attention.PATHS.chunks", chunks)
    got = run_loop(tok, model, data, slots=3, n=2, temperature=1.0)[0]
    assert ids(got) == ids(want)
    for x, y in zip(got, want):
        for s, r in zip(x.steps, y.steps):
            assert s.logprobs == pytest.approx(r.logprobs, abs=1e-5)


def test_context_budget_ends_episodes_cleanly(tok, model):
    data = samples([2, 50, 2])
    data[0]["question"] = "apples " * 3000  # the first prompt alone is over the budget
    trajs, gen = run_loop(tok, model, data, slots=2, max_context=128)
    assert trajs[0].termination == "context_budget" and trajs[0].steps == []
    assert trajs[1].termination == "context_budget" and 1 <= len(trajs[1].steps) < 50
    assert trajs[1].steps[-1].done and all(len(s.prompt_ids) <= 128 - MAX_NEW for s in trajs[1].steps)
    assert trajs[2].termination == "answered" and len(trajs[2].steps) == 2
    assert not gen.busy() and not gen.owner  # every slot was given back


@pytest.mark.parametrize("policy", ["window", "truncate"])
def test_rewriting_policies_keep_the_first_prompt_and_finish(tok, model, policy):
    data = samples([12, 3])
    trajs, gen = run_loop(tok, model, data, slots=2, policy=policy, max_context=96)
    for t, k in zip(trajs, (12, 3)):
        assert len(t.steps) == k and t.termination == "answered"
        first = t.steps[0].prompt_ids
        assert all(s.prompt_ids[: len(first)] == first and len(s.prompt_ids) <= 96 - MAX_NEW for s in t.steps)
        # The sampled ids are recorded even when the generator had to re-prefill a rewritten context.
        assert [s.response_ids for s in t.steps] == [ids for _, ids, _ in gen.returned[t.uid]]
    assert not trajs[0].is_append_only()  # 12 turns cannot fit 88 tokens without rewriting


def test_the_loop_takes_short_chunks_where_a_chunk_stays_in_flight(tok, model):
    """With overlap the loop launches 4-step chunks (or rollout.sync_every); without, the generator's own."""
    launches = []

    class Counting(Recording):
        def launch(self, steps=None):
            launches.append(steps)
            return super().launch(steps)

    for overlap, every, want in ((True, None, 4), (True, 3, 3), (False, None, None)):
        gen = Counting(model, 2, 256, stop_ids=tok.stop_ids, overlap=overlap)
        loop = AgentEnvLoop(gen, tok, lambda: TurnsEnv(tok, max_context=256, max_new_tokens=MAX_NEW), MAX_NEW,
                            sync_every=every)
        launches.clear()
        loop.run(samples([2, 1]), n=1)
        assert launches and set(launches) == {want}


@pytest.mark.parametrize("overlap", [False, True])
def test_a_loop_whose_environment_raised_runs_again(tok, model, overlap):
    """An environment that raises ends run() with its error and leaves no slot held and no chunk in flight:
    the same loop then plays the batch again (it used to spin forever with every slot owned)."""
    boom = [True]

    class Raising(TurnsEnv):
        def step(self, action):
            if boom[0] and self.t == 1:
                boom[0] = False
                raise RuntimeError("tool crashed")
            return super().step(action)

    gen = Recording(model, 2, 256, stop_ids=tok.stop_ids, overlap=overlap)
    loop = AgentEnvLoop(gen, tok, lambda: Raising(tok, max_context=256, max_new_tokens=MAX_NEW), MAX_NEW)
    data = samples([3, 2, 3])
    from r1.tasks.registry import TaskError

    # one line naming the env, the episode's row and the line of the task's code that raised
    with pytest.raises(TaskError, match=r"task Raising: its env's step\(\) of row 's0' raised RuntimeError: tool "
                                        r"crashed \(.*test_rollout.py:\d+\)"):
        loop.run(data, n=1)
    assert not gen.busy() and gen.free_slots() == 2
    trajs = loop.run(data, n=1)
    assert [len(t.steps) for t in trajs] == [3, 2, 3] and all(t.termination == "answered" for t in trajs)
