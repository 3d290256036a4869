"""CUDA graphs for prefill chunks: a first prompt, or an observation appended to a live row.

Owns capturing and replaying those forwards. A turn boundary prefills a chunk of a few dozen rows of tens
of tokens: almost no GPU work, but an eager forward launches tens of kernels per layer from Python, so
the host's launch time dominated the agent loop (docs/decisions.md, "CUDA graphs for decode and prefill chunks"). A graph replays
fixed shapes, so a chunk is padded to a bucket (tokens, rows, longest row) with pad rows that write only
the generator's scratch slot; real rows' hidden states are the unpadded forward's up to matmul rounding
(tested on the CPU by running the padded layout eagerly: `pad`). A shape no bucket holds, a full graph
table or a failed capture falls back to the eager forward. kernels.chunk_graphs=false turns it off.

Under train.overlap a graph is captured only while no other thread works on the GPU (`hold_captures`):
a device-wide synchronize in another thread fails a capture in flight. A held-off capture is deferred
(that chunk runs eagerly; `captures_deferred` counts them), not failed.
"""
import threading
import time

import torch

from kernels import attention
from r1.model import CacheStep, eager_fallbacks, tracing

MIN_Q = 16  # the Triton chunk kernel's query block
PAD_Q = 32  # the length of a pad row in a by_row chunk
ROW_MORE = (640, 768, 1024, 1280, 1536, 2048, 3072, 4096, 6144, 8192)  # row buckets past the generator's
MAX_GRAPHS = 192  # captured shapes per generator; past it, new shapes run eagerly
TOKEN_BUCKETS = tuple(sorted({b for p in range(4, 15) for b in (2 ** p, 3 * 2 ** (p - 1))}))  # 16, 24, 32, 48 .. 24576


# Graphs are keyed by (fresh, tokens, rows, max_q), captured on first use (two warm-up forwards, then
# the capture) and share one memory pool; each writes its hidden states into one shared output buffer,
# read at once by the caller (the next replay overwrites it). A failed capture turns graphs off for that
# kind of chunk (first prompts or continuations) with one printed line. Used only where a chunk's
# attention needs no host value but the bucket's max_q: torch's varlen FlashAttention or fa4 (first
# prompts) and, for chunks that extend live rows (continuations and the generator's mixed steps), the
# Triton decode and chunk kernels by row (CacheStep.by_row), keyed by token and row buckets only, with
# pad rows of PAD_Q tokens, so the shapes a rollout meets stop being new after a few iterations.
# CUDA fp16/bf16 only, with kernels.attention and kernels.chunks left at auto.
def _up(x: int, buckets) -> int | None:
    return next((b for b in buckets if b >= x), None)


def bucket(n_tokens: int, n_rows: int, max_q: int, row_buckets, max_len: int, by_row: bool = False):
    """The padded shape (Np, Bp, Qp) of a chunk, or None when none fits.

    Qp: the power of two >= max_q (at least MIN_Q); Np: the token bucket >= n_tokens; Bp: the row
    bucket that holds the real rows and the pad rows (Np - n_tokens pad tokens, at most Qp a row).
    by_row (chunks that extend live rows, r1/generate.py): attention needs no max_q (CacheStep.by_row),
    so Qp is PAD_Q, the pad rows' length, whatever max_q is: one graph serves chunks of any row length.
    """
    Qp = PAD_Q if by_row else max(MIN_Q, 1 << (max(1, max_q) - 1).bit_length())
    Np = _up(n_tokens, TOKEN_BUCKETS)
    if Qp > max_len or Np is None:
        return None
    Bp = _up(n_rows + -(-(Np - n_tokens) // Qp), row_buckets)
    return None if Bp is None else (Np, Bp, Qp)


def pad(ids, pos, token_rows, rows, cu, kv_lens, shape, scratch: int):
    """Host lists of a chunk -> the same lists padded to shape (Np, Bp, Qp).

    The Np - N pad tokens (id 0) fill pad rows of Qp tokens (the last one fewer) at positions 0.. of
    the scratch slot; the rows left over up to Bp are empty (no query, no key: the kernels skip them).
    """
    Np, Bp, Qp = shape
    n_pad = Np - len(ids)
    ids, pos, token_rows, cu, kv_lens = list(ids), list(pos), list(token_rows), list(cu), list(kv_lens)
    B = len(rows)
    for k in range(Bp - B):
        q = max(0, min(Qp, n_pad - k * Qp))
        ids += [0] * q
        pos += range(q)
        token_rows += [B + k] * q
        cu.append(cu[-1] + q)
        kv_lens.append(q)
    if len(ids) != Np:
        raise ValueError(f"chunk of {len(ids) - n_pad} tokens in {B} rows does not pad to {shape}")
    return ids, pos, token_rows, list(rows) + [scratch] * (Bp - B), cu, kv_lens


def usable(model, generator) -> bool:
    """True where a chunk's forward can be captured: CUDA fp16/bf16 with the graph-safe attention kernels."""
    if not generator.use_chunk_graphs or not generator.cuda_graphs:
        return False
    if attention.PATHS.attention or attention.PATHS.chunks:
        return False
    if generator.dtype not in (torch.float16, torch.bfloat16):
        return False
    k = generator.cache.k[0]
    q = torch.empty(1, model.cfg.num_heads, model.cfg.head_dim, dtype=generator.dtype, device=generator.device)
    return (attention.pick_backend(q) in ("torch_flash", "fa4") and not attention.PAGED
            and not attention.fa4_reads_cache()
            and attention._decode_fallback(q, k, generator.cache.v[0], decode=False) == "triton_chunk")


NAMES = ("ids", "pos", "token_rows", "rows", "cu", "kv_lens")


def _fill(g, inputs):
    """Copy a chunk's host lists into the graph's inputs through pinned memory: a copy from pageable memory
    may wait for the stream, and the generator queues chunks behind a decode in flight (r1/generate.py)."""
    for name, values in zip(NAMES, inputs):
        g[name].copy_(torch.tensor(values, dtype=g[name].dtype).pin_memory(), non_blocking=True)


class ChunkGraphs:
    """Captured chunk forwards of one generator's model and cache."""

    def __init__(self, generator, row_buckets):
        self.gen = generator
        # a mixed step holds every running row and the continuations (and pad rows): past the decode buckets
        self.row_buckets = tuple(row_buckets) + tuple(b for b in ROW_MORE if b > max(row_buckets))
        self.graphs: dict = {}
        self.pool = None
        self.out = None  # [top, hidden]: every graph writes its hidden states here
        # the largest Np: a chunk's token budget, plus one token per slot in a mixed step
        self.top = _up(generator.prefill_tokens + generator.slots, TOKEN_BUCKETS) or TOKEN_BUCKETS[-1]
        self.on = usable(generator.model, generator)
        self.calls = {"graph": 0, "eager": 0}
        self.failed: set = set()  # kinds (fresh True/False) whose capture failed: eager from then on

    def run(self, ids, pos, token_rows, rows, cu, kv_lens, fresh: bool, dev_ids=None):
        """Hidden states [N, hidden] of the chunk from a graph, or None (the caller runs it eagerly).

        Chunks that are not fresh run by_row (CacheStep.by_row: rows of any length, a mixed step's decode
        rows among them). dev_ids (a device tensor) replaces the first len(dev_ids) ids. The result is a
        view of the shared output buffer: read it before the next run."""
        shape = None
        if self.on and fresh not in self.failed:
            max_q = max(b - a for a, b in zip(cu, cu[1:]))
            shape = bucket(len(ids), len(rows), max_q, self.row_buckets, self.gen.max_len, by_row=not fresh)
        if shape is None or shape[0] > self.top:
            self.calls["eager"] += 1
            return None
        key = (fresh, *shape)
        g = self.graphs.get(key)
        # held off: eager before building the capture's inputs (their host copies wait for the stream)
        if g is None and len(self.graphs) < MAX_GRAPHS and defer_if_held():
            self.calls["eager"] += 1
            return None
        inputs = pad(ids, pos, token_rows, rows, cu, kv_lens, shape, self.gen.scratch)
        if g is not None:
            _fill(g, inputs)
        elif len(self.graphs) < MAX_GRAPHS:  # the capture's static inputs hold this chunk already
            try:
                g = self.graphs[key] = self._capture(shape, fresh, inputs)
            except CaptureDeferred:  # another thread holds captures off: eager now, captured another time
                pass
            except Exception as e:  # noqa: BLE001 (e.g. an op that needs the host): this kind runs eagerly
                self.failed.add(fresh)
                kind = "first-prompt" if fresh else "continuation"
                print(f"r1.chunk_graphs: cannot capture a {kind} chunk ({type(e).__name__}: "
                      f"{(str(e).splitlines() or [''])[0][:160]}); these chunks run eagerly", flush=True)
        if g is None:
            self.calls["eager"] += 1
            return None
        if dev_ids is not None and len(dev_ids):  # after the capture's warm-ups too: the replay rewrites their keys
            g["ids"][:len(dev_ids)].copy_(dev_ids)
        g["graph"].replay()
        self.calls["graph"] += 1
        return self.out[:len(ids)]

    def _capture(self, shape, fresh, inputs):
        """Static inputs holding this chunk, two warm-up forwards on a side stream (compiles, autotuning),
        then the capture. The warm-ups compute this chunk: they write the keys and values the replay
        writes again, the same values."""
        gen, d = self.gen, self.gen.device
        Np, Bp, Qp = shape
        if self.out is None:
            self.out = torch.empty(self.top, gen.model.cfg.hidden_size, dtype=gen.dtype, device=d)
        g = {"shape": shape}
        for name, values in zip(NAMES, inputs):
            g[name] = torch.tensor(values, dtype=torch.int32 if name in ("cu", "kv_lens") else torch.long, device=d)
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()

        def run():
            step = CacheStep(rows=g["rows"], token_rows=g["token_rows"], cu_q=g["cu"], max_q=Qp,
                             kv_lens=g["kv_lens"], fresh=fresh, by_row=not fresh)
            self.out[:Np].copy_(gen.model.hidden(g["ids"], g["pos"], cache=gen.cache, step=step))

        g["graph"], _ = capture(run, pool=self.pool, mode="thread_local")
        return g


class CaptureDeferred(Exception):
    """capture() did not run: another thread holds captures off (hold_captures); the caller runs eagerly."""


_gate = threading.Lock()  # held by a capture in progress, or by hold_captures' thread
_deferred = 0  # captures held off so far (CaptureDeferred)


def hold_captures(timeout: float = 600.0):
    """No thread captures a CUDA graph from now until release_captures(); waits for a capture in progress to
    end. r1/overlap.Background's main thread holds it while it scores and updates beside the rollout thread:
    there torch may synchronize the whole device (Inductor autotunes a kernel's first call so), which fails
    a capture in progress in another thread and raises in this one. Held already past `timeout` seconds
    (a capture with its warm-ups, compiles included, takes far less; one hold at a time): an error, not a
    silent hang."""
    if not _gate.acquire(timeout=timeout):
        raise RuntimeError(f"r1.chunk_graphs: CUDA graph captures still held after {timeout:g} s (a Background "
                           f"rollout never joined, or a capture that does not end)")


def release_captures():
    """The end of hold_captures()."""
    _gate.release()


def defer_if_held() -> bool:
    """True (counted as deferred) when captures are held now (by any thread, or a capture in progress): a
    caller about to build a capture's inputs skips that work and runs eagerly. A hint read without the
    lock; capture() decides."""
    global _deferred
    if _gate.locked():
        _deferred += 1
        return True
    return False


def deferred() -> int:
    """How many captures were held off so far (their chunks and decode steps ran eagerly instead)."""
    return _deferred


def capture(run, pool=None, mode: str = "global", tries: int = 3):
    """Two warm-up calls of run() on a side stream (compiles, Triton autotuning, lazy allocations), then
    run() captured -> (graph, what the captured call returned). Used for decode steps and chunks alike.
    The caller's stream is restored even when the capture fails (torch can raise before restoring it).

    Under train.overlap another thread may be FX-tracing (compiling the update's ops): compiled ops then run
    eager (r1/model._compile), and a graph captured meanwhile would replay eager kernels for the rest of the
    run. So it waits for such a trace to end first (a minute at most in all), and captures again when an op
    fell back anyway (`tries` in all; the last capture is kept: eager ops are slower, not wrong).

    Raises CaptureDeferred, before running anything, while another thread holds captures off
    (hold_captures), and keeps them off itself until it returns."""
    global _deferred
    if not _gate.acquire(blocking=False):
        _deferred += 1
        raise CaptureDeferred
    try:
        deadline = time.time() + 60
        for _ in range(tries):
            while tracing() and time.time() < deadline:
                time.sleep(0.01)
            before = eager_fallbacks()
            graph, out = _capture_once(run, pool, mode)
            if eager_fallbacks() == before:
                break
        return graph, out
    finally:
        _gate.release()


def _capture_once(run, pool, mode: str):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            run()
    torch.cuda.current_stream().wait_stream(s)
    graph, prev = torch.cuda.CUDAGraph(), torch.cuda.current_stream()
    try:
        with torch.cuda.graph(graph, pool=pool, capture_error_mode=mode):
            out = run()
    finally:
        torch.cuda.set_stream(prev)
    return graph, out
