"""The trainer's rollout: iteration k's episodes, played now or started during iteration k-1 (train.overlap).

`Rollouts.get` is step 1 of the RL loop whichever actor plays: synchronous
(train.overlap 0: refresh, play, return), a thread (1: r1/actor.Actor.start,
a `Background`) or the rollout process (2: r1/rollout_process.RemoteActor).
Overlapped, iteration k refreshes the generator to W_k and starts k+1's play
on it before it updates W_k, so k+1 trains on episodes one update back; the
loss corrects with the sampler's recorded logprobs (decoupled PPO). The
thread runs only the agent loop: every collective stays on the main thread,
in the same order on every rank. Its CUDA work runs on a stream of its own,
and its graph captures wait until the main thread waits for it
(chunk_graphs.hold_captures). Why a thread, and why a process too:
docs/decisions.md, "Overlap is one update stale, and corrected". Resume is refused: a checkpoint
after iteration k holds W_k+1, not the W_k the next rollout samples with.
"""
import contextlib
import dataclasses
import os
import sys
import threading
import time

import torch

from r1 import chunk_graphs


@dataclasses.dataclass
class Rollout:
    """One iteration's episodes and how they were played."""
    trajectories: list
    lag: int = 0  # updates between the weights that sampled them and those they train: 0 or 1
    seconds: float = 0.0  # the play's own wall time
    cpu_seconds: float | None = None  # its CPU seconds where it ran in the background, else None
    graphs: tuple | None = None  # Actor.graph_counts it added (None: no chunk graphs)
    deferred: int = 0  # CUDA graph captures it deferred (chunk_graphs.hold_captures)
    idle_seconds: float | None = None  # the rollout process's time before it (rollout_process.Handle)


class Rollouts:
    """Iteration k's episodes from `actor` (Actor or RemoteActor: refresh, counted_play, start, cancel, close).
    `request(it, version)` -> (rows, n, sampling, run): what to play for iteration `it` on weights of `version`;
    `ahead`: overlap, iteration k+1's play starts during iteration k when get's `more()` says there is one."""

    def __init__(self, actor, request, ahead: bool):
        self.actor, self.request, self.ahead = actor, request, ahead
        self.pending = None  # the next iteration's play, started during this one

    def get(self, it: int, policy, more=lambda: True) -> Rollout:
        """Iteration it's episodes: the play started during iteration it - 1, else played now on policy's
        weights; then (ahead) iteration it + 1's play starts on policy's weights before this update. The
        rollout process takes that request while iteration it's play still runs, so it is asked for before
        that play is waited for; a thread's play has ended before the refresh (Actor.refresh waits)."""
        done, self.pending = self.pending, None
        if done is None:  # nothing in flight (train.overlap 0, or this process's first iteration): play now
            self.actor.refresh(policy)
            t0 = time.time()
            played, graphs, deferred = self._ask(self.actor.counted_play, it, it)
            now = Rollout(played, 0, time.time() - t0, None, graphs, deferred, None)
        if self.ahead and more():
            if done is not None:  # the weights moved since that play was asked for
                self.actor.refresh(policy)
            self.pending = self._ask(self.actor.start, it + 1, it)
        if done is None:
            return now
        played, graphs, deferred = done.result()  # decoded here while the next play runs (the process's)
        return Rollout(played, 1, done.seconds, done.cpu_seconds, graphs, deferred, done.idle_seconds)

    def _ask(self, play, it: int, version: int):
        rows, n, sampling, run = self.request(it, version)
        return play(rows, n, sampling, **run)

    def wait(self):
        """Let the play in flight finish (its outcome kept for get): the actor is free, e.g. to evaluate."""
        if self.pending is not None:
            self.pending.wait()

    def cancel(self):
        """Stop the play in flight at its next chunk and drop its episodes."""
        if self.pending is not None:
            self.pending = None
            self.actor.cancel()

    def close(self):
        """cancel, then close the actor (its paused episodes' environments; the rollout process)."""
        try:
            self.cancel()
        finally:
            self.actor.close()


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
