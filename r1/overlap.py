"""train.overlap: 1, the one-step off-policy loop: the rollout of iteration k+1 runs while iteration k
scores and updates.

Synchronous (train.overlap: 0, the reference), iteration k samples with the
weights W_k and updates them to W_k+1; the generator waits for the update and
the update for the generator. Overlapped, the generator's weights are
refreshed once per iteration, at the start of iteration k, to W_k (no rollout
is in flight then, so a refresh never tears a chunk), and the rollout of
k+1 starts at once on them, in a background thread, while the main thread
scores iteration k's episodes and updates W_k to W_k+1. So iteration k+1
trains on episodes of the weights one update back (the first iteration of a
process samples on its own weights, as the synchronous loop). The loss
corrects for it with the sampler's recorded logprobs (the behaviour policy):
decoupled PPO (r1/algos/decoupled_ppo.py) clips against W_k+1 scored in step
2 (the proximal policy) and weights by proximal/behaviour.

Why a thread (train.overlap: 1): the generator, its KV cache and the
environments stay where they are, and the trajectories come back as Python
objects. Its cost, profiled at 135M (docs/decisions.md, "The rollout in a process of its own"): the two
threads took turns on the host, 1.07 cores together; train.overlap: 2 plays
in a process of its own instead (r1/rollout_process.py). The thread runs
only the agent loop (the generator has its own copy
of the weights: r1/actor.generator_model): every collective (the refresh's
gather under FSDP, check_episodes' sums) stays on the main thread, in the same
order on every rank. On CUDA the thread queues on a stream of its own, so its
kernels can run beside the update's; its CUDA graphs are captured in
thread_local mode, and only while the main thread waits for it (the main
thread holds captures off from the thread's start until it waits:
chunk_graphs.hold_captures; a shape first met meanwhile runs eagerly).
Resume is refused: a checkpoint after iteration k holds
W_k+1, not the W_k the next rollout samples with.
"""
import contextlib
import os
import sys
import threading
import time

import torch

from r1 import chunk_graphs


def set_switch_interval():
    """R1_SWITCH_US=N: the interpreter's thread switch interval, N microseconds (Python's default 5,000). Each
    torch op lets go of the interpreter lock; getting it back while the other thread runs plain Python (the
    agent loop's host work) can take up to the interval, at every op. An experiment knob (docs/decisions.md, "The rollout in a process of its own");
    config.check_environment has checked the value."""
    v = os.environ.get("R1_SWITCH_US", "")
    if v:
        sys.setswitchinterval(int(v) / 1e6)


class Background:
    """fn() running in a thread; `result()` waits and returns it, or raises what it raised. From the start
    until the first result() or wait(), the calling thread holds CUDA graph captures off (see the module's
    docstring): fn's captures are deferred meanwhile, its chunks run eagerly."""

    def __init__(self, fn, device: torch.device):
        set_switch_interval()
        self.seconds = 0.0  # the thread's own wall time
        self.cpu_seconds = 0.0  # and its CPU time: far below the wall time = the thread waited (the GIL, syncs)
        self.idle_seconds = None  # a thread has no time between plays to report (rollout_process.Handle has)
        self._out, self._err = None, None
        stream = None
        if device.type == "cuda":
            stream = torch.cuda.Stream(device)
            stream.wait_stream(torch.cuda.current_stream(device))  # the refreshed weights first

        def run():
            t0, c0 = time.time(), time.thread_time()
            try:
                with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
                    self._out = fn()
                if stream is not None:
                    stream.synchronize()
            except BaseException as e:  # noqa: BLE001 - re-raised on the main thread by result()
                self._err = e
            finally:
                self.seconds, self.cpu_seconds = time.time() - t0, time.thread_time() - c0

        self._thread = threading.Thread(target=run, name="r1-rollout", daemon=True)
        chunk_graphs.hold_captures()
        self._holding = True
        try:
            self._thread.start()
        except BaseException:
            if self._thread.ident is None:  # it never ran, and nothing will join it: let go here
                self._holding = False
                chunk_graphs.release_captures()
            raise  # (interrupted once started: the process is ending; the hold keeps fn from capturing)

    def _join(self):
        if self._holding:  # let go first: while this thread waits, fn may capture
            self._holding = False
            chunk_graphs.release_captures()
        self._thread.join()

    def result(self):
        self._join()
        if self._err is not None:
            raise self._err
        return self._out

    def wait(self):
        """Join without taking the result (an error stays for result())."""
        self._join()

    def ok(self) -> bool:
        """Join; whether result() will return (rather than raise)."""
        self._join()
        return self._err is None
