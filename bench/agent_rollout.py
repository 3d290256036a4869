"""The real agent loop at engine speed? GSM8K with the calculator, replayed, vs the engine alone.

What runs is what training runs: AgentEnvLoop, ToolEnv with the calculator,
the chat template rendering and tokenising every observation, the generator
with stop ids and CUDA graphs, 512 GSM8K episodes on 512 slots. Only the
sampled tokens are forced, so that two code paths (or two machines) do
identical work: each episode replays the expert tool-use chat of its GSM8K
problem (r1/tasks/gsm8k.py expert_messages, the SFT warm-up data), laid out
as the SFT data is (r1/sft.py expert_example). Their shape is the real loop's:
4.13 turns and 206 response tokens per episode on the first 512 training
problems (at most 6 steps and 192 tokens a step, configs/gsm8k_tool.yaml; the
longest 467 tokens), against 4.2 turns and 222 tokens in the SFT model's GRPO
run (docs/results/run3). The episodes are first played on the host through the same
ToolEnv (`replay`), which gives each episode's whole token sequence; the
generator then samples as usual (same kernels, same noise) and a wrapper of
r1.generate.sample swaps in the token the sequence holds at that position
(`forcing`): a row's seed names its episode, on the GPU, no host sync.

Prints one JSON object per model: `agent_tok_s` (response tokens over the wall
time of `loop.run`, as the trainer's rollout_tok_s), `single_turn_tok_s` (the
engine alone in the same process: the same slots, the episodes' first prompts,
each row generating the mean response length with no stop, as bench/rollout.py),
their `ratio`, `same_lengths_tok_s` and `ratio_same_lengths` (the engine alone with each row
generating its own episode's response tokens: the episodes' spread of lengths, without the turns),
`replayed_exactly` (episodes whose every step came out as forced),
and `breakdown`, seconds of a second, instrumented run (a CUDA sync around each
GPU phase): decode, first_prompt_prefill, continuation_prefill, mixed_step (observations prefilled
in the first decode step of their chunk, with that step: the CUDA default), admit_other
(first-token sampling and bookkeeping of admitted rows), env_main (first
prompts and detokenising on the loop's thread), env_wait (the loop idle,
waiting for environment threads), env_steps (seconds inside environment steps:
the tool, the chat template, tokenising; on the loop's thread when env_inline,
else summed over a pool's threads, overlapping the rest), host_loop (the rest),
and, from the timed run, tail_s (wall time with under a quarter of the slots busy).
The instrumented run waits for the GPU after every phase, so it overlaps nothing:
its parts add up to more than the timed run.

--gap adds a run where the forced token's logprob is recorded (log_softmax of
the sampler's logits) and compares it with the trainer's forward (packed,
varlen attention) on the same trajectories: `logprob_gap_mean/max` over every
response token, the sampler-trainer gap each RL iteration logs.

    python bench/agent_rollout.py --model 135m [--episodes 512] [--slots 512] [--save [PATH]] [--profile]
    python bench/agent_rollout.py --model 3b --eager-paths   # kernels.compile=false, fuse=false, chunk_graphs=false
    python bench/agent_rollout.py --model 3b --kernels fa4_cache=true   # any key of config section kernels
Without CUDA it runs a tiny random model on the CPU through the same code (a
check: tests/test_agent_rollout_bench.py). --tokenizer takes an HF tokenizer
folder, for a machine without the GGUF (write one with
`load_tokenizer("smollm2-135m-instruct").hf.save_pretrained(DIR)`); --data a
GSM8K folder or file (default: the copy in data/gsm8k).
"""
import argparse
import contextlib
import datetime
import gc
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import r1.generate  # noqa: E402
import r1.rollout  # noqa: E402
from r1.envs.base import Action  # noqa: E402
from r1.envs.tool_env import ToolEnv  # noqa: E402
from bench import kernels_flag  # noqa: E402
from bench.rollout import SHAPES  # noqa: E402  (the model shapes every benchmark uses)
from r1.generate import Generator, Sampling  # noqa: E402
from r1.model import Transformer, paths_in_use, tiny_config, use_ops  # noqa: E402
from r1.rollout import AgentEnvLoop  # noqa: E402
from r1.sft import expert_example  # noqa: E402
from r1.tasks import gsm8k  # noqa: E402
from r1.tokenizer import load_tokenizer  # noqa: E402

# configs/gsm8k_tool.yaml
MAX_NEW, MAX_STEPS, MAX_CONTEXT, PENALTY = 192, 6, 2048, -0.1


def make_env_factory(tok, max_new=MAX_NEW, max_steps=MAX_STEPS, max_context=MAX_CONTEXT):
    return lambda: ToolEnv(tok, gsm8k.make_prompt, gsm8k.score, tools=("calculator",), max_steps=max_steps,
                           malformed_penalty=PENALTY, max_context=max_context, max_new_tokens=max_new)


def load_rows(path, count):
    rows = gsm8k.load_split(path, "train")  # a folder (any layout the loader reads) or one file
    if len(rows) < count:
        raise ValueError(f"{path}: {len(rows)} GSM8K rows, the benchmark needs {count}")
    return rows[:count]


def replay(tok, rows, make_env, max_new=MAX_NEW):
    """Each row's expert chat played through ToolEnv on the host, as the loop will play it.

    -> episodes: {"sample", "responses" (ids per step, as the generator will return them),
    "seq" (the last prompt + the last response: the token at every position the episode samples)}.
    """
    env0 = make_env()
    stops = set(tok.stop_ids)
    out = []
    for row in rows:
        ids, mask = expert_example(tok, gsm8k.expert_messages(row), env0.tools)
        turns, cur = [], []
        for t, m in zip(ids, mask):
            if m:
                cur.append(t)
            elif cur:
                turns.append(cur)
                cur = []
        if cur:
            turns.append(cur)
        env = make_env()
        prompt, _ = env.first_prompt(env.reset(row))
        first, responses = len(prompt), []
        for resp in turns:
            cut = next((i + 1 for i, t in enumerate(resp) if t in stops), None)
            resp = resp[:cut][:max_new]
            finish = "eos" if resp[-1] in stops else "length"
            responses.append(resp)
            reward, done, info, nxt, reason = r1.rollout._env_step(env, prompt, Action(resp, tok.decode(resp), finish))
            if done or nxt is None:
                break
            prompt = nxt
        out.append({"sample": row, "responses": responses, "seq": prompt + responses[-1], "first_prompt_len": first})
    return out


@contextlib.contextmanager
def forcing(gen, episodes, uids):
    """Within: every token the generator samples for uids[k] is episodes[k]["seq"] at that position.

    The real sampler still runs (same kernels, same cost); the swap is a lookup keyed by the row's
    seed (which the generator derives from the uid) and the token's position, all on the device.
    """
    d = gen.device
    seeds = torch.tensor([gen._row_seed(u) for u in uids], device=d)
    order = torch.argsort(seeds)
    episode_of = torch.tensor([i % len(episodes) for i in range(len(uids))], device=d)[order]
    sorted_seeds = seeds[order]
    width = gen.max_len + 1
    table = torch.full((len(episodes), width), -1, dtype=torch.long)
    for i, e in enumerate(episodes):
        table[i, : len(e["seq"])] = torch.tensor(e["seq"][:width])
    table = table.to(d)
    real = r1.generate.sample
    opts = {"forced_logprobs": False}  # True: return the forced token's logprob (a --gap run)

    def sample(logits, s, seeds=None, positions=None, use_triton=None):
        tok, lp = real(logits, s, seeds, positions, use_triton)
        i = torch.searchsorted(sorted_seeds, seeds).clamp_(max=len(sorted_seeds) - 1)
        forced = table[episode_of[i], positions.clamp(0, width - 1)]
        tok = torch.where((sorted_seeds[i] == seeds) & (forced >= 0), forced, tok)
        if opts["forced_logprobs"]:  # the sampler's logprob rule (r1/generate.py) for the token kept
            z = logits.float() * (1.0 / s.temperature) if s.temperature > 0 else logits.float()
            lp = torch.log_softmax(z, -1).gather(-1, tok[:, None])[:, 0]
        return tok, lp

    r1.generate.sample = sample
    try:
        yield opts
    finally:
        r1.generate.sample = real


@torch.no_grad()
def logprob_gap(model, trajs, temperature, tokens_per_forward=32768, rows_per_head=8192):
    """|sampler logprob - trainer logprob| over every response token: the trainer's forward is the packed
    one (varlen attention, no cache), on each episode's whole sequence, as in an RL update."""
    d = next(model.parameters()).device
    seqs, want, at = [], [], []  # sequences; sampler logprobs; (sequence, position) of each response token
    for t in trajs:
        last = t.steps[-1]
        seqs.append(last.prompt_ids + last.response_ids)
        for s in t.steps:
            want += s.logprobs
            at += [(len(seqs) - 1, len(s.prompt_ids) + j) for j in range(len(s.response_ids))]
    got = torch.empty(len(at), dtype=torch.float64)
    by_seq = {}
    for k, (i, p) in enumerate(at):
        by_seq.setdefault(i, []).append((k, p))
    i = 0
    while i < len(seqs):
        group = [i]
        size = len(seqs[i])
        while group[-1] + 1 < len(seqs) and size + len(seqs[group[-1] + 1]) <= tokens_per_forward:
            group.append(group[-1] + 1)
            size += len(seqs[group[-1]])
        i = group[-1] + 1
        lens = [len(seqs[j]) for j in group]
        ids = torch.tensor([x for j in group for x in seqs[j]], device=d)
        pos = torch.tensor([p for n in lens for p in range(n)], device=d)
        cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0).tolist()), dtype=torch.int32, device=d)
        h = model.hidden(ids, pos, cu, max(lens))
        ks, rows, targets = [], [], []
        for j, start in zip(group, cu.tolist()):
            for k, p in by_seq.get(j, []):
                ks.append(k)
                rows.append(start + p - 1)  # the hidden state before the token predicts it
                targets.append(seqs[j][p])
        for a in range(0, len(rows), rows_per_head):
            z = model.head(h[torch.tensor(rows[a:a + rows_per_head], device=d)]).float()
            z = z * (1.0 / temperature) if temperature > 0 else z
            target = torch.tensor(targets[a:a + rows_per_head], device=d)
            lp = torch.log_softmax(z, -1).gather(-1, target[:, None])[:, 0]
            got[torch.tensor(ks[a:a + rows_per_head])] = lp.double().cpu()
    diff = (got - torch.tensor(want, dtype=torch.float64)).abs()
    return {"logprob_gap_mean": round(diff.mean().item(), 5), "logprob_gap_max": round(diff.max().item(), 4),
            "logprob_gap_tokens": len(at)}


class Probe:
    """Wall time per phase of the loop, by wrapping generator and loop functions (CUDA-synced)."""

    def __init__(self, gen, loop, sync):
        self.t = dict.fromkeys(("decode", "first_prompt_prefill", "continuation_prefill", "mixed_step", "admit",
                                "env_main", "env_wait", "env_steps"), 0.0)
        self.gen, self.loop, self.sync = gen, loop, sync
        self.calls = {"first_prompt_prefill": 0, "continuation_prefill": 0, "mixed_step": 0}
        self.mixing = False
        self.undo = []

    def timed(self, key, fn, sync=True):
        def run(*a, **kw):
            if sync:
                self.sync()
            t = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                if sync:
                    self.sync()
                self.t[key] += time.perf_counter() - t
        return run

    def patch(self, obj, name, wrapper):
        old = getattr(obj, name)
        setattr(obj, name, wrapper(old))
        self.undo.append((obj, name, old, name in vars(obj)))

    def __enter__(self):
        gen, loop = self.gen, self.loop
        fwd = gen._forward_chunk

        def chunk(batch, *args):
            if self.mixing:  # inside a mixed step: timed as one (below)
                return fwd(batch, *args)
            key = "first_prompt_prefill" if all(s == 0 for _, s, _ in batch) else "continuation_prefill"
            self.calls[key] += 1
            return self.timed(key, fwd)(batch, *args)
        self.patch(gen, "_forward_chunk", lambda old: chunk)
        mixed = self.timed("mixed_step", gen._mixed_step)

        def mixed_step(*args):
            self.calls["mixed_step"] += 1
            self.mixing = True
            try:
                return mixed(*args)
            finally:
                self.mixing = False
        self.patch(gen, "_mixed_step", lambda old: mixed_step)
        for name in ("_decode", "_decode_launch", "_decode_finish"):  # before and after the launch/finish split
            if hasattr(gen, name):
                self.patch(gen, name, lambda old: self.timed("decode", old))
        self.patch(gen, "_admit", lambda old: self.timed("admit", old))
        self.patch(r1.rollout, "_env_step", lambda old: self.timed("env_steps", old, sync=False))
        self.patch(r1.rollout, "wait", lambda old: self.timed("env_wait", old, sync=False))
        make_env = loop.make_env

        def make():
            env = make_env()
            env.reset = self.timed("env_main", env.reset, sync=False)
            env.first_prompt = self.timed("env_main", env.first_prompt, sync=False)
            return env
        self.patch(loop, "make_env", lambda old: make)
        tok = loop.tok
        decode = self.timed("env_main", tok.decode, sync=False)
        self.patch(loop, "tok", lambda old: type("Timed", (), {"decode": staticmethod(decode),
                                                                "__getattr__": lambda s, k: getattr(tok, k)})())
        return self

    def __exit__(self, *exc):
        for obj, name, old, own in reversed(self.undo):
            if own:
                setattr(obj, name, old)
            else:
                delattr(obj, name)

    def breakdown(self, total):
        t = dict(self.t)
        t["admit_other"] = t.pop("admit") - t["first_prompt_prefill"] - t["continuation_prefill"]
        t["decode"] -= t["mixed_step"]  # the mixed steps ran inside the decode launches
        inline = getattr(self.loop, "pool", None) is None  # env steps on the loop's thread, or in a pool
        t["host_loop"] = total - sum(v for k, v in t.items() if k != "env_steps" or inline)
        return {**{k: round(v, 3) for k, v in t.items()}, "env_inline": inline,
                **{f"{k}_calls": n for k, n in self.calls.items()}}


def occupancy(gen):
    """Patches the generator's decode entry (launch, or step before it existed) to log (time, busy rows)."""
    name = "launch" if hasattr(gen, "launch") else "step"
    log, step = [], getattr(gen, name)

    def logged(*args, **kwargs):
        log.append((time.perf_counter(), len(gen.running) + len(gen.queue)))
        return step(*args, **kwargs)
    setattr(gen, name, logged)
    return log, name


def tail_seconds(log, end, slots):
    """Wall time of the step() calls that began with under a quarter of the slots busy."""
    times = [t for t, _ in log] + [end]
    return sum(times[i + 1] - times[i] for i, (_, busy) in enumerate(log) if busy < slots / 4)


EAGER: dict = {}  # --kernels, --eager-paths, --no-chunk-graphs: the Generator's own switches (fuse, chunk_graphs, sample)


def agent(model, tok, episodes, slots, cache_len, sync, temperature, profile=False, gap=False, workers=None,
          sync_every=None, overlap=None, schedules=(), mix=None):
    cuda = next(model.parameters()).is_cuda
    gen = Generator(model, slots, cache_len, stop_ids=tok.stop_ids, cuda_graphs=cuda, overlap=overlap, mix=mix,
                    **EAGER)
    gen.set_sampling(Sampling(temperature=temperature, seed=0))
    loop = AgentEnvLoop(gen, tok, make_env_factory(tok), MAX_NEW, sync_every=sync_every,
                        **({} if workers is None else {"workers": workers}))
    schedule = {"sync_every": loop.sync_every or gen.sync_every, "overlap": gen.overlap, "mix": gen.mix}  # main runs
    samples = [e["sample"] for e in episodes]
    E = len(episodes)
    uids = [f"{p}{k}-0" for p in ("warm-", "", "probe-") for k in range(E)]
    res = {}
    with forcing(gen, episodes, uids) as opts:
        trajs, dt, timed = timed_run(gen, loop, samples, slots, sync)
        res.update(timed)
        with Probe(gen, loop, sync) as timer:
            t = time.perf_counter()
            loop.run(samples, 1, uid_prefix="probe-")
            sync()
            res["breakdown"] = timer.breakdown(time.perf_counter() - t)
        if gap:
            opts["forced_logprobs"] = True
            scored = loop.run(samples, 1, uid_prefix="probe-")
            opts["forced_logprobs"] = False
            res.update(logprob_gap(model, scored, temperature))
        if profile:  # a fourth run, under cProfile (slower: the timed run above is not profiled)
            import cProfile
            import io
            import pstats
            prof = cProfile.Profile()
            t = time.perf_counter()
            prof.runcall(loop.run, samples, 1, uid_prefix="probe-")
            sync()
            res["profiled_s"] = round(time.perf_counter() - t, 3)
            text = io.StringIO()
            pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(30)
            res["profile"] = text.getvalue()
        others = []
        for every, overlap, mix in schedules:  # the same generator (its graphs), a warm-up run under each schedule
            loop.sync_every, gen.overlap, gen.mix = every, overlap, mix
            got, took, timed = timed_run(gen, loop, samples, slots, sync)
            name = f"{every}{'' if overlap else '-sync'}{'' if mix else '-nomix'}"
            others.append({"schedule": name, "agent_s": round(took, 3),
                           "agent_tok_s": round(sum(len(s.response_ids) for tr in got for s in tr.steps) / took),
                           "tail_s": timed["tail_s"], "decode_calls": timed["decode_calls"], "warm_s": timed["warm_s"],
                           "replayed_exactly": f"{exact_count(got, episodes)}/{E}"})
    n = sum(len(s.response_ids) for tr in trajs for s in tr.steps)
    out = {"agent_tok_s": round(n / dt), "agent_s": round(dt, 3), "response_tokens": n,
           "replayed_exactly": f"{exact_count(trajs, episodes)}/{E}", **schedule, **res,
           **({"schedules": others} if others else {})}
    del gen, loop
    gc.collect()  # the generator's KV cache and graph pools (a reference cycle with its chunk graphs)
    if cuda:
        torch.cuda.empty_cache()
    return out


def timed_run(gen, loop, samples, slots, sync):
    """A warm-up run (graph captures, compiles: every chunk shape the schedule meets), then the timed one
    -> (trajectories, seconds, {tail_s, decode_calls, warm_s (the warm-up's seconds: captures included),
    and with chunk graphs chunk_calls, chunk_graphs_captured})."""
    t = time.perf_counter()
    loop.run(samples, 1, uid_prefix="warm-")
    sync()
    warm = time.perf_counter() - t
    log, patched = occupancy(gen)
    calls = dict(gen.chunk_graphs.calls) if gen.chunk_graphs else {}
    t = time.perf_counter()
    trajs = loop.run(samples, 1)
    sync()
    dt = time.perf_counter() - t
    delattr(gen, patched)
    out = {"tail_s": round(tail_seconds(log, t + dt, slots), 3), "decode_calls": len(log), "warm_s": round(warm, 3)}
    if gen.chunk_graphs:  # prefill chunks of the timed run: replayed graphs / eager forwards
        out["chunk_calls"] = {k: v - calls[k] for k, v in gen.chunk_graphs.calls.items()}
        out["chunk_graphs_captured"] = len(gen.chunk_graphs.graphs)
    return trajs, dt, out


def exact_count(trajs, episodes):
    """Episodes whose every step came out as forced."""
    return sum([s.response_ids for s in tr.steps] == e["responses"] for tr, e in zip(trajs, episodes))


def single_turn(model, episodes, slots, cache_len, new, sync, temperature):
    """The engine alone on the same slots: first prompts, `new` tokens each, no stop, one call. Then the
    same with each row generating its own episode's response tokens (all turns together): the engine
    facing the episodes' lengths, so the gap left to the agent loop is the turns themselves."""
    cuda = next(model.parameters()).is_cuda
    gen = Generator(model, slots, cache_len, cuda_graphs=cuda, **EAGER)
    prompts = [e["seq"][: e["first_prompt_len"]] for e in episodes]
    s = Sampling(temperature=temperature, seed=0)
    gen.generate(prompts, 8, s)  # warm-up: graph capture
    sync()
    t = time.perf_counter()
    out = gen.generate(prompts, new, s)
    sync()
    dt = time.perf_counter() - t
    n = sum(len(c.token_ids) for c in out)
    lengths = [sum(map(len, e["responses"])) for e in episodes]
    for run in ("warm", "timed"):  # the warm run captures the graph of every batch size the rows pass through
        t = time.perf_counter()
        for k, (p, m) in enumerate(zip(prompts, lengths)):
            gen.submit((run, k), p, m)
        got = 0
        while gen.busy():
            for c in gen.step():
                got += len(c.token_ids)
                gen.release(c.key)
        sync()
        dt2 = time.perf_counter() - t
    del gen
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    return {"single_turn_tok_s": round(n / dt), "single_turn_s": round(dt, 3), "single_turn_new": new,
            "same_lengths_tok_s": round(got / dt2), "same_lengths_s": round(dt2, 3)}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="135m", help="135m | 3b (CUDA); the CPU runs a tiny shape whatever this says")
    p.add_argument("--episodes", type=int, default=512)
    p.add_argument("--slots", type=int, default=512)
    p.add_argument("--cache-len", type=int, default=MAX_CONTEXT)
    p.add_argument("--tokenizer", default="smollm2-135m-instruct")
    p.add_argument("--data", default=None,
                   help="GSM8K folder or train.jsonl (default: data/gsm8k, shipped with the project)")
    p.add_argument("--profile", action="store_true", help="a fourth run under cProfile; print its top functions")
    p.add_argument("--skip-single", action="store_true")
    p.add_argument("--gap", action="store_true", help="measure the sampler-trainer logprob gap (one more run)")
    p.add_argument("--workers", type=int, default=None, help="AgentEnvLoop's env threads (default: the loop's)")
    p.add_argument("--sync-every", type=int, default=None,
                   help="decode steps per chunk in the agent loop (default: the generator's)")
    p.add_argument("--no-overlap", action="store_true",
                   help="no chunk in flight (kernels.launch_ahead=false's schedule: 16-step chunks, environments stepped while "
                        "the next chunk decodes)")
    p.add_argument("--no-mix", action="store_true",
                   help="observations prefilled in forwards of their own (kernels.mixed_steps=false), not in a decode step")
    p.add_argument("--schedules", default=None,
                   help="more agent runs in the same process, e.g. 16-sync,16,8,4,4-nomix: steps per chunk, "
                        "'-sync' without overlap, '-nomix' without mixed steps; each is timed (not "
                        "instrumented) and listed under 'schedules'")
    p.add_argument("--save", nargs="?", const="bench/results/agent_rollout.json", default=None,
                   help="append the result to a JSON list (default bench/results/agent_rollout.json)")
    p.add_argument("--eager-paths", action="store_true",
                   help="eager elementwise ops, unfused projections, no chunk graphs (kernels.compile=false, "
                        "kernels.fuse=false, kernels.chunk_graphs=false)")
    p.add_argument("--no-chunk-graphs", action="store_true", help="prefill chunks eager (kernels.chunk_graphs=false)")
    kernels_flag.add(p)
    a = p.parse_args(argv)
    EAGER.clear()
    k = kernels_flag.use(a.kernels)  # launch_ahead and mixed_steps as --no-overlap and --no-mix
    gen_kw = kernels_flag.generator(k)
    EAGER.update({key: gen_kw[key] for key in ("fuse", "chunk_graphs", "triton_sample")})
    a.no_overlap = a.no_overlap or not k.launch_ahead
    a.no_mix = a.no_mix or not k.mixed_steps
    if a.eager_paths:
        use_ops("false")
        EAGER.update(fuse=False, chunk_graphs=False)
    if a.no_chunk_graphs:
        EAGER.update(chunk_graphs=False)
    schedules = []
    for name in (a.schedules.split(",") if a.schedules else []):
        every, _, mode = name.partition("-")
        if not every.isdigit() or int(every) < 1 or mode not in ("", "sync", "nomix"):
            p.error(f"--schedules: {name!r} is not N, N-sync or N-nomix")
        schedules.append((int(every), mode != "sync", mode != "nomix"))
    cuda = torch.cuda.is_available()
    tok = load_tokenizer(a.tokenizer)
    data = a.data or str(ROOT / "data" / "gsm8k")
    temperature = 1.0
    if not cuda:  # a check of the code path, not a measurement: few episodes, greedy (the noise is costly on CPU)
        a.episodes, a.slots, temperature = min(a.episodes, 6), min(a.slots, 4), 0.0
        torch.set_num_threads(1)
    t = time.perf_counter()
    episodes = replay(tok, load_rows(data, a.episodes), make_env_factory(tok))
    replay_s = time.perf_counter() - t
    torch.manual_seed(0)
    if cuda:
        cfg = SHAPES[a.model]
        with torch.device("cuda"):
            model = Transformer(cfg).to(torch.bfloat16).eval().requires_grad_(False)
        sync = torch.cuda.synchronize
    else:
        a.model = "tiny"
        model = Transformer(tiny_config("llama", tie=True, vocab_size=len(tok.hf))).eval()
        sync = lambda: None  # noqa: E731
    mean_resp = statistics.mean(sum(map(len, e["responses"])) for e in episodes)
    r = {"name": "agent_rollout", "model": f"{a.model}-shape" if cuda else "tiny (CPU check)", "episodes": a.episodes,
         "slots": a.slots, "cache_len": a.cache_len,
         "mean_turns": round(statistics.mean(len(e["responses"]) for e in episodes), 2),
         "mean_response_tokens": round(mean_resp, 1),
         "max_response_tokens": max(sum(map(len, e["responses"])) for e in episodes),
         "mean_first_prompt": round(statistics.mean(e["first_prompt_len"] for e in episodes), 1),
         "replay_host_s": round(replay_s, 2)}
    with torch.no_grad():
        if not a.skip_single:
            r.update(single_turn(model, episodes, a.slots, a.cache_len, round(mean_resp), sync, temperature))
        r.update(agent(model, tok, episodes, a.slots, a.cache_len, sync, temperature, a.profile, a.gap, a.workers,
                       a.sync_every, False if a.no_overlap else None, schedules, False if a.no_mix else None))
    for o in [r] + r.get("schedules", []):
        if not a.skip_single:
            o["ratio"] = round(o["agent_tok_s"] / r["single_turn_tok_s"], 3)
            o["ratio_same_lengths"] = round(o["agent_tok_s"] / r["same_lengths_tok_s"], 3)
    r.update(device=torch.cuda.get_device_name() if cuda else "cpu", torch=torch.__version__,
             workers=a.workers, chunks="default", kernels=kernels_flag.words(k),
             **paths_in_use(cuda, EAGER.get("fuse")), chunk_graphs=EAGER.get("chunk_graphs", True),
             date=datetime.date.today().isoformat())
    profile = r.pop("profile", None)
    print(json.dumps(r), flush=True)
    if profile:
        print(profile)
    if a.save:
        path = Path(a.save)
        old = json.loads(path.read_text()) if path.exists() else []
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(old + [r], indent=1) + "\n")
    return r


if __name__ == "__main__":
    main()
