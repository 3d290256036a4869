"""The batched KV-cache generator: prefill, decode, sampling, stops, logprobs.

Owns turning requests (a key, prompt ids, sampling settings) into sampled ids with the sampler's logprobs,
for RL rollouts where those logprobs must be the trainer's: it runs the same `Transformer` code as
training (only the attention call differs: a cache instead of packed sequences). One preallocated cache
of `slots` rows plus a scratch slot; a key holds its slot until `release(key)`, so a next prompt that
extends the cached ids prefills only the new suffix. `step()` = `launch()` (admit queued requests, queue
`sync_every` decode steps) then `finish()` (one host sync, stop checks). Speed paths (chunk overlap,
mixed steps, shared prompts, CUDA graphs) each have a switch (docs/running.md).

Logprob: log softmax(logits / T)[y] over the full vocabulary at the rollout temperature, even under
top-k/top-p, because that is what the trainer recomputes; greedy records log softmax(logits)[y]. The
sampling noise is a pure function of (seed, request key, position, token id) (`row_noise`), so a request's
tokens do not depend on its batch-mates, slot count, scheduling or number of GPUs (docs/decisions.md).
"""
import hashlib
import heapq
from collections import deque
from dataclasses import dataclass, field

import torch

from r1.chunk_graphs import CaptureDeferred, ChunkGraphs, capture, defer_if_held
from r1.model import CacheStep, KVCache, Transformer, fuse_projections

try:  # Triton is optional: absent in the CPU build of torch
    from kernels import triton_sample
except ImportError:  # pragma: no cover - depends on the machine
    triton_sample = None

STOP_WINDOW = 16  # tokens re-decoded before new ones when matching stop strings
BUCKETS = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 640, 768, 1024)  # r1/memory.py SLOT_STEPS


# Speed paths of the generator (each off with its switch, for comparisons):
# - Overlap (CUDA; kernels.launch_ahead=false off): launch() may queue the next chunk while one is in flight and
#   finish(keep=1) collects the older one, so the GPU never waits for the host's work between chunks.
#   Tokens a finished row decodes in the newer chunk are dropped and never read.
# - Shared prompts (rollout.share_prompt, off by default): new rows admitted together with identical
#   prompts (a group's samples) are prefilled once; the others copy the first's cache rows and last
#   hidden state, then sample with their own noise.
# - Mixed steps (CUDA; kernels.mixed_steps=false off): observations appended to live rows are prefilled inside the first
#   decode step of a chunk, one forward for both.
# - CUDA graphs for decode (per batch bucket) and prefill chunks (r1/chunk_graphs.py); fused q/k/v and
#   gate/up matmuls for a model without gradients (r1/model.py fuse_projections; kernels.fuse=false off).
# A next prompt that does not extend the cached ids (the env rewrote the context) is re-prefilled in
# the same slot. Stops: EOS / end-of-turn ids, stop strings on decoded text, max tokens.
@dataclass
class Sampling:
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0


@dataclass
class Completion:
    key: object
    prompt_ids: list
    token_ids: list
    logprobs: list
    finish: str  # eos | stop | length


@dataclass
class _Row:
    key: object
    slot: int
    prompt: list
    max_new: int
    tokens: list = field(default_factory=list)  # collected (finish)
    logprobs: list = field(default_factory=list)
    pos: int = 0  # position of the next token to feed, counting launched chunks not yet collected
    sampled: int = 0  # tokens sampled, counting launched chunks not yet collected
    checked: int = 0  # tokens already scanned for stops
    seed: int = 0  # keys this row's sampling noise (with the token position)
    done: bool = False  # collected as finished: its tokens in a chunk still in flight are dropped


@dataclass
class _Launch:
    """What one launch() queued, for finish() to collect: first tokens of admitted rows, a decode chunk."""
    admitted: list
    first: tuple | None  # host tensors (tokens [A], logprobs [A]) of the admitted rows' first tokens
    rows: list  # rows decoded
    n: int  # decode steps
    out: tuple | None  # host tensors (tokens [n, Bp], logprobs [n, Bp])
    event: object = None  # CUDA event after the copies to the host


def _mix(x):
    """splitmix64 finaliser on int64 tensors (wrapping arithmetic, logical shifts)."""
    m = (1 << 64) - 1
    def shr(v, k):
        return (v >> k) & ((1 << (64 - k)) - 1)
    x = x * _signed(0xBF58476D1CE4E5B9 & m)
    x = x ^ shr(x, 27)
    x = x * _signed(0x94D049BB133111EB)
    return x ^ shr(x, 31)


def _signed(c: int) -> int:
    return c - (1 << 64) if c >= 1 << 63 else c


def row_uniform(seeds, positions, vocab: int):
    """Uniform(0, 1) fp32 [B, V], a pure function of (row seed, position, token id).

    Counter-based, like Philox: a row's sample never depends on which other
    rows share the batch or on scheduling, so a seeded rollout replays exactly.
    u = (24 hash bits + 0.5) / 2^24 in fp32, where the top value 2^24 - 0.5
    rounds up to 1: it is clamped to the largest float below 1, so q > 0.
    kernels/triton_sample.py computes the same bits op for op.
    """
    h = _mix(seeds * _signed(0x9E3779B97F4A7C15) + positions * 0x632BE59BD9B4E019 % (1 << 62))  # [B]
    v = torch.arange(vocab, device=seeds.device, dtype=torch.int64)
    x = _mix(h[:, None] + v[None, :] * _signed(0xD1B54A32D192ED03))
    u = ((x >> 40) & 0xFFFFFF).to(torch.float32).add_(0.5).mul_(1.0 / (1 << 24))
    return u.clamp_max_(1.0 - 2.0**-24)


def row_noise(seeds, positions, vocab: int):
    """Exponential(1) noise [B, V] fp32: q = -log(row_uniform), in (0, 17.4]."""
    return -torch.log(row_uniform(seeds, positions, vocab))


def sample(logits, s: Sampling, seeds=None, positions=None, use_triton=None):
    """logits [B, V] (fp32, or bf16 upcast here) -> (tokens [B], logprobs [B]) with the logprob rule above.

    seeds [B], positions [B] (int64) key the sampling noise per row and token
    position (see row_noise); without them, noise comes from torch's RNG.
    use_triton: None uses the kernel below where it applies, False never (a Generator's triton_sample=False, config kernels.sample=torch).

    The sample is an exponential race in the log domain: with z = logits * (1/T)
    (masked by top-k/top-p) and q ~ Exponential(1), tok = argmax(z - log q),
    the same argmax as softmax(z) / q (gpt-fast's trick) and the Gumbel-max
    trick (-log q is Gumbel). The log form needs no max and no normalisation,
    so one pass over the row suffices, nothing under- or overflows in fp32
    (softmax(z) / q flushes tokens below e^-103 of the max to 0, and 0 / q
    ties them), and every step is a plain fp32 op that the Triton kernel
    repeats exactly. argmax keeps the first of tied keys.

    This torch code is the reference. On CUDA with triton, seeds given and
    top_k == 0, top_p == 1, kernels/triton_sample.py computes the same tokens
    in one pass over the logits, in their own dtype (tests/test_sample_kernel.py).
    """
    if (use_triton is not False and triton_sample is not None and logits.is_cuda and seeds is not None
            and s.top_k <= 0 and s.top_p >= 1.0):
        return triton_sample.sample(logits, s.temperature, seeds, positions)
    logits = logits.float()
    if s.temperature <= 0:
        tok = logits.argmax(-1)
        return tok, torch.log_softmax(logits, -1).gather(-1, tok[:, None])[:, 0]
    z = logits * (1.0 / s.temperature)  # a multiply, as torch's CUDA division by a scalar and the kernel do
    logp = torch.log_softmax(z, -1)
    filt = z
    if s.top_k > 0 and s.top_k < z.shape[-1]:
        kth = torch.topk(z, s.top_k, dim=-1).values[:, -1:]
        filt = filt.masked_fill(filt < kth, float("-inf"))
    if s.top_p < 1.0:
        sorted_z, idx = torch.sort(filt, dim=-1, descending=True)
        cum = torch.softmax(sorted_z, -1).cumsum(-1)
        drop = cum - torch.softmax(sorted_z, -1) > s.top_p  # keep the token that crosses p
        filt = filt.scatter(-1, idx, sorted_z.masked_fill(drop, float("-inf")))
    # Exponential race = categorical sample, with no host sync.
    if seeds is not None:
        q = row_noise(seeds, positions, filt.shape[-1])
    else:
        q = torch.empty_like(filt).exponential_(1).clamp_min_(torch.finfo(torch.float32).tiny)
    tok = (filt - torch.log(q)).argmax(-1)
    return tok, logp.gather(-1, tok[:, None])[:, 0]


class Generator:
    def __init__(self, model: Transformer, slots: int, max_len: int, stop_ids=(), stop_strings=(), decode=None,
                 sampling: Sampling | None = None, sync_every: int | None = None, prefill_tokens: int = 8192,
                 cuda_graphs: bool = False, fuse: bool | None = None, overlap: bool | None = None,
                 mix: bool | None = None, share_prompt: bool = False, chunk_graphs: bool = True,
                 triton_sample: bool = True):
        if max_len < 2 or slots < 1 or prefill_tokens < 1:
            raise ValueError(f"generator needs slots >= 1, max_len >= 2 and prefill_tokens >= 1, got slots={slots} "
                             f"max_len={max_len} prefill_tokens={prefill_tokens}")
        if stop_strings and decode is None:
            raise ValueError("stop_strings need a decode(ids) -> str function")
        self.model = model
        self.slots, self.max_len = slots, max_len
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype
        self.cache = KVCache.empty(model.cfg, slots + 1, max_len, self.dtype, self.device)
        self.scratch = slots
        self.stop_ids = set(int(i) for i in stop_ids)
        self.stop_strings = list(stop_strings)
        self.decode = decode
        self.sampling = sampling or Sampling()
        self.prefill_tokens = prefill_tokens
        self.queue: list = []  # (key, prompt, max_new)
        self.queued: set = set()  # keys in the queue
        self.running: dict = {}  # slot -> _Row
        self.owner: dict = {}  # key -> slot
        self.free = list(range(slots))  # a min-heap of slots no key holds: lowest first
        self.waiting_new = 0  # queued keys that hold no slot yet
        self.cached: dict = {}  # slot -> ids whose KV is in the cache
        self.cuda_graphs = cuda_graphs and self.device.type == "cuda"
        self.graphs: dict = {}
        self.pending: deque = deque()  # _Launch records that finish() has not collected, oldest first
        if overlap is None:  # launch() with one launch in flight: CUDA (config kernels.launch_ahead)
            overlap = self.device.type == "cuda"
        self.overlap = overlap
        if mix is None:  # continuations prefilled in the first decode step of their chunk: CUDA (kernels.mixed_steps)
            mix = self.device.type == "cuda"
        self.mix = mix
        self.share_prompt = share_prompt  # identical new prompts of one admission prefilled once (_admit)
        # Steps per chunk (launch(steps) overrides it: the agent loop takes shorter chunks, r1/rollout.py).
        self.sync_every = sync_every or (16 if self.device.type == "cuda" else 1)
        self.last_tok = torch.zeros(slots + 1, dtype=torch.long, device=self.device)  # each slot's token to feed
        if fuse is None:  # generation-only models on the GPU (kernels.fuse): +3.4% with compiled ops, 0 without
            fuse = self.device.type == "cuda" and not any(q.requires_grad for q in model.parameters())
        if fuse:
            fuse_projections(model)
        self.use_chunk_graphs = chunk_graphs  # prefill chunks replayed as CUDA graphs (r1/chunk_graphs.usable)
        self.use_triton = None if triton_sample else False  # sample(): the Triton kernel where it applies, or never
        self.chunk_graphs = ChunkGraphs(self, BUCKETS) if self.cuda_graphs else None  # prefill chunks, bucketed

    # -- public API --------------------------------------------------------
    def set_sampling(self, s: Sampling):
        self.sampling = s

    def submit(self, key, prompt_ids, max_new_tokens: int):
        """Queue a request; `key` keeps its slot (and cache) until release(key)."""
        prompt = [int(t) for t in prompt_ids]
        if not prompt:
            raise ValueError(f"empty prompt for request {key!r}")
        if len(prompt) >= self.max_len:
            raise ValueError(f"prompt of {len(prompt)} tokens for request {key!r} does not fit the KV cache "
                             f"({self.max_len} positions); raise rollout.cache_len or shorten the context")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if key in self.queued or self.owner.get(key, -1) in self.running:
            raise ValueError(f"request {key!r} is already queued or running")
        self.queue.append((key, prompt, max_new_tokens))
        self.queued.add(key)
        self.waiting_new += key not in self.owner

    def release(self, key):
        """Free the slot of a finished episode."""
        if key in self.queued or self.owner.get(key, -1) in self.running:
            raise ValueError(f"request {key!r} is still queued or running; release it once it has finished")
        slot = self.owner.pop(key, None)
        if slot is not None:
            self.cached.pop(slot, None)
            heapq.heappush(self.free, slot)

    def abort(self):
        """Drop every request: wait for the launches in flight, then free every slot (an episode's environment
        raised, and the caller will start over). The cache keeps no prefix: the next request prefills whole."""
        for rec in self.pending:
            if rec.event is not None:
                rec.event.synchronize()
        self.pending.clear()
        self.queue, self.queued, self.waiting_new = [], set(), 0
        self.running.clear()
        self.owner.clear()
        self.cached.clear()
        self.free = list(range(self.slots))

    def busy(self) -> bool:
        return bool(self.queue or self.running or self.pending)

    def free_slots(self) -> int:
        return len(self.free) - self.waiting_new

    @torch.no_grad()
    def generate(self, prompts, max_new_tokens: int, sampling: Sampling | None = None) -> list[Completion]:
        """Convenience: generate for a list of prompts, in order."""
        if sampling is not None:
            self.set_sampling(sampling)
        for i, p in enumerate(prompts):
            self.submit(("generate", i), p, max_new_tokens)
        done = {}
        while self.busy():
            for c in self.step():
                done[c.key[1]] = c
                self.release(c.key)
        return [done[i] for i in range(len(prompts))]

    @torch.no_grad()
    def step(self, steps: int | None = None) -> list[Completion]:
        """Admit queued requests, decode a few tokens, return what finished: launch() then finish(). With
        overlap, the launch just made stays in flight and the one before it is collected (all of them when
        nothing new was launched), so the GPU decodes while the caller works on what this returns."""
        launched = self.launch(steps)
        return self.finish(keep=int(launched and self.overlap))

    @torch.no_grad()
    def launch(self, steps: int | None = None) -> bool:
        """Admit queued requests and queue the decode of up to `steps` (default `sync_every`) tokens.

        Returns without waiting for the GPU (True if it queued any work): the host is free until
        `finish()`. Requests submitted in between are admitted by the next launch(). With `overlap`,
        one earlier launch may still be in flight; its rows are decoded on (see the module docstring).
        """
        if len(self.pending) >= (2 if self.overlap else 1):
            raise RuntimeError("launch() twice without finish()" if not self.overlap else
                               "launch() with two chunks in flight: finish() first")
        steps = steps or self.sync_every
        if steps < 1:
            raise ValueError(f"a decode chunk needs steps >= 1, got {steps} (sync_every)")
        admitted, first, joining = self._admit()
        # Rows that can still sample: not at their max_new nor at the cache's end (counting chunks in
        # flight). Up to sync_every steps, as many as the neediest row wants: a row past its max_new rides
        # along and its extra tokens are dropped (_collect), rather than every row syncing at each step near
        # one row's limit (rows with different max_new made every chunk one step long). Joining rows
        # sample their first token in the first step and feed n - 1 tokens from their prompt's end.
        rows = [r for r in self.running.values() if r.sampled < r.max_new and r.pos < self.max_len]
        want = [r.max_new - r.sampled for r in rows] + [j.max_new for j in joining]
        room = [self.max_len - r.pos for r in rows] + [self.max_len - len(j.prompt) + 1 for j in joining]
        n = min(steps, max(want), min(room)) if want else 0
        out = self._decode_launch(rows, n, joining) if n > 0 else None
        if out is None and not admitted:
            return False
        for r in rows if out is not None else ():
            r.pos += n
            r.sampled += n
        for j in joining:
            j.pos, j.sampled = len(j.prompt) + n - 1, n
            self.cached[j.slot] = list(j.prompt)
            self.running[j.slot] = j
        rows = rows + joining
        rec = _Launch(admitted, self._to_host(first), rows if out is not None else [], n, self._to_host(out))
        if self.device.type == "cuda":
            rec.event = torch.cuda.Event()
            rec.event.record()
        self.pending.append(rec)
        return True

    @torch.no_grad()
    def finish(self, keep: int = 0) -> list[Completion]:
        """Collect launched work, oldest first, until `keep` launches stay in flight; return what finished.

        Waits only for the launches it collects (their CUDA events), not for younger ones."""
        done = []
        while len(self.pending) > keep:
            done += self._collect_launch(self.pending.popleft())
        return done

    # -- internals ---------------------------------------------------------
    def _admit(self):
        waiting, starts = [], []
        for key, prompt, max_new in self.queue:
            slot = self.owner.get(key)
            if slot is None:
                if not self.free:
                    waiting.append((key, prompt, max_new))
                    continue
                slot = heapq.heappop(self.free)
                self.owner[key] = slot
                self.waiting_new -= 1
            self.queued.discard(key)
            cached = self.cached.get(slot, [])
            keep = len(cached) if prompt[: len(cached)] == cached and len(cached) < len(prompt) else 0
            row = _Row(key, slot, prompt, min(max_new, self.max_len - len(prompt)), pos=keep, seed=self._row_seed(key))
            starts.append(row)
        self.queue = waiting
        joining, budget = [], self.prefill_tokens
        if self.mix:  # continuations within the token budget join the decode chunk (_decode_launch): no forward here
            rest = []
            for r in starts:
                if r.pos > 0 and len(r.prompt) - r.pos <= budget:
                    joining.append(r)
                    budget -= len(r.prompt) - r.pos
                else:
                    rest.append(r)
            starts = rest
        if not starts:
            return [], None, joining
        prefill, copies = self._share_prompts(starts) if self.share_prompt else (starts, [])
        # Prefill the uncached part of each prompt, packed, in chunks of a token budget. New prompts and
        # continuations (rows whose cache holds a prefix) go in separate batches: new prompts alone take
        # the packed training kernel (CacheStep.fresh), continuations the batched cache path.
        todo = {id(r): r.pos for r in prefill}
        last_hidden = {}
        while todo:
            batch, budget = [], self.prefill_tokens
            fresh = next(todo[id(r)] for r in prefill if id(r) in todo) == 0  # this batch's kind
            for r in prefill:
                done = todo.get(id(r))
                if done is None or (done == 0) != fresh or budget <= 0:
                    continue
                take = min(len(r.prompt) - done, budget)
                batch.append((r, done, take))
                budget -= take
            h = self._forward_chunk([(r.slot, done, r.prompt[done:done + take]) for r, done, take in batch])
            finished, end = [], -1
            for r, done, take in batch:
                end += take
                if done + take == len(r.prompt):
                    finished.append((r, end))
                    del todo[id(r)]
                else:
                    todo[id(r)] = done + take
            if finished:  # one gather, a copy: h may be a graph's output buffer, which the next chunk overwrites
                picked = h.index_select(0, self._to_device([e for _, e in finished]))
                for k, (r, _) in enumerate(finished):
                    last_hidden[id(r)] = picked[k]
        for lead, rows in copies:  # after the leader's prefill on the same stream: its cache is written
            self._copy_prefix(lead, rows)
            for r in rows:
                last_hidden[id(r)] = last_hidden[id(lead)]
        logits = self.model.head(torch.stack([last_hidden[id(r)] for r in starts]))  # model dtype: sample upcasts
        meta = self._to_device([[r.seed for r in starts], [len(r.prompt) for r in starts], [r.slot for r in starts]])
        tok, lp = sample(logits, self.sampling, meta[0], meta[1], self.use_triton)
        self.last_tok[meta[2]] = tok  # the first decode step feeds it; the host reads it at finish()
        for r in starts:
            r.pos, r.sampled = len(r.prompt), 1
            self.cached[r.slot] = list(r.prompt)
            self.running[r.slot] = r
        return starts, (tok, lp), joining

    @staticmethod
    def _share_prompts(starts):
        """(rows to prefill, [(leader row, rows that copy it)]): of the new rows (nothing cached) with identical
        prompts, the first is prefilled and the others take its cache and last hidden state."""
        prefill, lead = [], {}
        for r in starts:
            if r.pos == 0:
                group = lead.setdefault(tuple(r.prompt), (r, []))
                if group[0] is not r:
                    group[1].append(r)
                    continue
            prefill.append(r)
        return prefill, [g for g in lead.values() if g[1]]

    def _copy_prefix(self, lead, rows):
        """The leader's keys and values at its prompt's positions into the rows' slots, every layer at once."""
        n = len(lead.prompt)
        dst = self._to_device([r.slot for r in rows])
        for t in (self.cache.k, self.cache.v):
            t[:, dst, :n] = t[:, lead.slot: lead.slot + 1, :n]

    def _row_seed(self, key) -> int:
        """A stable 62-bit seed from the sampling seed and the request key (not Python's salted hash)."""
        digest = hashlib.blake2b(f"{self.sampling.seed}:{key!r}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "little") >> 2

    def _to_device(self, values, dtype=torch.long):
        """A host list -> a device tensor, without waiting for the stream: a plain copy to the GPU syncs
        it (torch waits for the copy), which would wait for a chunk in flight. Pinned memory, non-blocking."""
        t = torch.tensor(values, dtype=dtype)
        if self.device.type != "cuda":
            return t
        return t.pin_memory().to(self.device, non_blocking=True)

    def _to_host(self, pair):
        """(tokens, logprobs) on the device -> copies on the host, pinned, non-blocking (read after the event)."""
        if pair is None or self.device.type != "cuda":
            return pair
        return tuple(t.to("cpu", non_blocking=True) for t in pair)

    def _forward_chunk(self, batch, dev_ids=None):
        """batch of (slot, start, ids): write ids at positions start.. of the slot -> hidden [N, H].

        dev_ids: a device tensor that replaces the first len(dev_ids) ids (decode rows' last tokens, which
        stay on the device). Chunks that extend live rows run by_row (rows of any length)."""
        ids, pos, token_rows, cu = [], [], [], [0]
        for i, (_, start, toks) in enumerate(batch):
            ids += toks
            pos += range(start, start + len(toks))
            token_rows += [i] * len(toks)
            cu.append(cu[-1] + len(toks))
        rows, kv_lens = [slot for slot, _, _ in batch], [s + len(t) for _, s, t in batch]
        fresh = all(s == 0 for _, s, _ in batch)
        h = None
        if self.chunk_graphs:
            h = self.chunk_graphs.run(ids, pos, token_rows, rows, cu, kv_lens, fresh, dev_ids)
        if h is not None:
            return h
        ids = self._to_device(ids)
        if dev_ids is not None and len(dev_ids):
            ids[:len(dev_ids)] = dev_ids
        step = CacheStep(
            rows=self._to_device(rows),
            token_rows=self._to_device(token_rows),
            cu_q=self._to_device(cu, torch.int32),
            max_q=max(len(t) for _, _, t in batch),
            kv_lens=self._to_device(kv_lens, torch.int32),
            fresh=fresh,
            max_kv=max(kv_lens),
            by_row=not fresh,
        )
        return self.model.hidden(ids, self._to_device(pos), cache=self.cache, step=step)

    def _decode_launch(self, rows, n, joining=()):
        """Queue n decode steps for the rows -> (tokens [n, Bp], logprobs [n, Bp]) on the device.

        Each row's first input is its slot's `last_tok` (a chunk in flight or an admission writes it).
        With `joining` (admitted rows whose cache holds a prefix: an observation appended), the first step
        is one forward of the rows' next tokens and the joining rows' uncached suffixes (_mixed_step):
        the weights are read once for both, and a joining row samples its first token there, then
        decodes the other n - 1 steps with the rest. Columns: rows, then joining rows."""
        joining = list(joining)
        every = rows + joining
        B = len(every)
        Bp = next((b for b in BUCKETS if b >= B), B) if self.cuda_graphs else B
        pad = Bp - B
        # where each row feeds its next token in the loop below (after the mixed step, if any)
        at = [r.pos + 1 for r in rows] + [len(j.prompt) for j in joining] if joining else [r.pos for r in rows]
        slots, seeds, pos = self._to_device([[r.slot for r in every] + [self.scratch] * pad,
                                             [r.seed for r in every] + [0] * pad, at + [0] * pad])
        out_tok = torch.empty(n, Bp, dtype=torch.long, device=self.device)
        out_lp = torch.empty(n, Bp, dtype=torch.float32, device=self.device)
        if joining:  # sampled at the positions the loop then feeds them at
            tok, lp = self._mixed_step(rows, joining, slots, seeds[:B], pos[:B])
            out_tok[0, :B], out_lp[0, :B] = tok, lp
            if pad:
                tok = torch.cat([tok, torch.zeros(pad, dtype=tok.dtype, device=tok.device)])
        else:
            tok = self.last_tok[slots]
        longest = max(at) + 1  # keys of the longest row at the first step fed here (host-side)
        first = 1 if joining else 0
        for i in range(first, n):
            logits = self._decode_logits(tok, pos, slots, longest + i - first)
            tok, lp = sample(logits, self.sampling, seeds, pos + 1, self.use_triton)
            out_tok[i], out_lp[i] = tok, lp
            pos = pos + 1
        self.last_tok[slots] = tok  # pad rows write the scratch slot's entry, which no row feeds
        return out_tok, out_lp

    def _mixed_step(self, rows, joining, slots, seeds, positions):
        """One forward of the decode rows' next tokens (their last_tok, at r.pos) and the joining rows'
        uncached prompt suffixes -> (tokens [B], logprobs [B]) sampled at `positions` (the next of each).

        Decode rows come first, one token each; attention takes each row with the kernel its length
        wants (CacheStep.by_row), so the chunk graph is keyed by token and row counts only."""
        k = len(rows)
        batch = [(r.slot, r.pos, [0]) for r in rows] + [(j.slot, j.pos, j.prompt[j.pos:]) for j in joining]
        h = self._forward_chunk(batch, self.last_tok[slots[:k]] if k else None)
        ends, end = list(range(k)), k - 1
        for j in joining:
            end += len(j.prompt) - j.pos
            ends.append(end)
        logits = self.model.head(h.index_select(0, self._to_device(ends)))  # a copy: h may be a graph's buffer
        return sample(logits, self.sampling, seeds, positions, self.use_triton)

    def _collect_launch(self, rec: _Launch) -> list[Completion]:
        """The host side of one launch: wait for its event (not for younger launches), append its tokens
        to the rows it sampled for, check stops."""
        if rec.event is not None:
            rec.event.synchronize()
        if rec.first is not None:
            for r, t, l in zip(rec.admitted, rec.first[0].tolist(), rec.first[1].tolist()):
                r.tokens, r.logprobs = [t], [l]
        if rec.out is not None:
            B = len(rec.rows)
            out_tok, out_lp = rec.out[0][:, :B].T.tolist(), rec.out[1][:, :B].T.tolist()
            for r, t, l in zip(rec.rows, out_tok, out_lp):
                if not r.done:  # a row that finished in an older launch rode along: drop its tokens
                    r.tokens += t
                    r.logprobs += l
        seen = set()
        rows = [r for r in rec.admitted + rec.rows if not r.done and id(r) not in seen and not seen.add(id(r))]
        return self._collect(rows)

    def _decode_logits(self, tok, pos, slots, max_kv: int = 0):
        B = tok.shape[0]
        if self.cuda_graphs:
            logits = self._graph_decode(tok, pos, slots)
            if logits is not None:
                return logits
        d = self.device
        step = CacheStep(rows=slots, token_rows=torch.arange(B, device=d),
                         cu_q=torch.arange(B + 1, dtype=torch.int32, device=d), max_q=1,
                         kv_lens=(pos + 1).to(torch.int32), max_kv=max_kv)
        return self.model.head(self.model.hidden(tok, pos, cache=self.cache, step=step))  # model dtype: sample upcasts

    def _graph_decode(self, tok, pos, slots):
        """The decode step's logits from its batch size's graph, or None: its capture is held off now
        (chunk_graphs.hold_captures; the caller runs the step eagerly, the graph comes another time)."""
        B = tok.shape[0]
        g = self.graphs.get(B)
        if g is None:
            if defer_if_held():  # before allocating the graph's buffers
                return None
            try:
                g = self.graphs[B] = self._capture(B)
            except CaptureDeferred:
                return None
        g["tok"].copy_(tok)
        g["pos"].copy_(pos)
        g["slots"].copy_(slots)
        g["graph"].replay()
        return g["logits"]

    def _capture(self, B):
        d = self.device
        bufs = {"tok": torch.zeros(B, dtype=torch.long, device=d), "pos": torch.zeros(B, dtype=torch.long, device=d),
                "slots": torch.full((B,), self.scratch, dtype=torch.long, device=d)}
        ar = torch.arange(B, device=d)
        cu = torch.arange(B + 1, dtype=torch.int32, device=d)

        def run():
            step = CacheStep(rows=bufs["slots"], token_rows=ar, cu_q=cu, max_q=1,
                             kv_lens=(bufs["pos"] + 1).to(torch.int32))
            return self.model.head(self.model.hidden(bufs["tok"], bufs["pos"], cache=self.cache, step=step))

        # thread_local: under train.overlap the update's thread allocates while this one captures
        graph, logits = capture(run, mode="thread_local")
        # ar and cu are read by the graph: keep them alive with it (freed, their memory is reused)
        return {**bufs, "ar": ar, "cu": cu, "graph": graph, "logits": logits}

    def _collect(self, rows) -> list[Completion]:
        done = []
        for r in rows:
            cut, finish = self._find_stop(r)
            if cut is not None and cut > r.max_new:  # a stop in the tokens decoded past max_new: not reached
                cut = None
            if cut is None and len(r.tokens) >= r.max_new:
                cut, finish = r.max_new, "length"
            if cut is None and len(r.prompt) + len(r.tokens) - 1 >= self.max_len:  # no position left to feed
                cut, finish = len(r.tokens), "length"
            if cut is None:
                continue
            tokens, logprobs = r.tokens[:cut], r.logprobs[:cut]
            # KV is valid for the prompt and every response token but the last (never fed).
            self.cached[r.slot] = r.prompt + tokens[:-1]
            r.done = True
            del self.running[r.slot]
            done.append(Completion(r.key, r.prompt, tokens, logprobs, finish))
        return done

    def _find_stop(self, r: _Row):
        """First stop in r.tokens -> (number of tokens to keep, reason) or (None, None).

        Only the tokens since the last check are scanned (plus a window of
        STOP_WINDOW tokens before them for a stop string split across the
        boundary), so the host cost per check does not grow with length.
        """
        start = r.checked
        r.checked = len(r.tokens)
        eos = next((i + 1 for i in range(start, len(r.tokens)) if r.tokens[i] in self.stop_ids), None)
        if self.stop_strings:
            lo = max(0, start - STOP_WINDOW)
            hit = self._find_stop_string(r.tokens[lo: eos or len(r.tokens)])
            if hit is not None:
                return lo + hit, "stop"
        return (eos, "eos") if eos is not None else (None, None)

    def _find_stop_string(self, tokens):
        """Smallest prefix of tokens whose text holds a stop string, or None."""
        if not tokens or not any(s in self.decode(tokens) for s in self.stop_strings):
            return None
        lo, hi = 1, len(tokens)
        while lo < hi:
            mid = (lo + hi) // 2
            if any(s in self.decode(tokens[:mid]) for s in self.stop_strings):
                hi = mid
            else:
                lo = mid + 1
        return lo
