"""train.overlap: 2, the rollout in a process of its own: train.overlap 1 without two threads taking turns.

`RemoteActor` has r1/actor.Actor's methods (refresh, play, counted_play,
start, cancel, close) with the plays in a child process, which has an
interpreter and a CUDA context of its own. The trainer's generator copy is
shared with the child (CUDA IPC, or shared memory on a CPU); the child copies
it into its own model at the start of a play that follows a refresh, so a
refresh may come while a play runs once that play has read it. One play may
wait behind the running one: the child starts it the moment the first's
episodes are sent (pickled, decoded by the trainer while the next plays).
The sampling noise is keyed by (seed, uid, position), so the child plays the
episodes the trainer's own actor would. Errors come back as themselves where
they pickle; a child that dies is reported with its exit code, never a hang;
the child ignores Ctrl-C and ends with its parent. On a CPU the two processes
split the trainer's torch threads. Measurements: docs/decisions.md.
"""
from __future__ import annotations

import collections
import contextlib
import pickle
import queue
import signal
import threading
import time
import traceback

import torch
import torch.multiprocessing as mp

from r1.config import Config


class RolloutProcessError(RuntimeError):
    """The rollout process failed or died: its traceback or exit code, in one error."""


class Handle:
    """A play running in the child: `result()` waits and returns (episodes, graph counts it added or None,
    captures deferred); `wait()` waits and keeps the outcome (an error stays for result()), the episodes not yet
    decoded (the replies of plays asked for before it are taken first, into their own Handles), and `ok()`
    says whether result() will return. `seconds` and `cpu_seconds` are the child's wall and CPU time for the
    play, as r1/overlap.Background gives them; `idle_seconds` the child's time between its last play and this
    one (pickling and sending the episodes, then waiting for this request, if it was not already queued): in a
    steady state a play and the time before it are the iteration's period, so when the trainer waits on the
    rollout this is the hand-over. None for the child's first play and the one after a cancelled or failed
    play."""

    def __init__(self, owner: "RemoteActor"):
        self.owner, self.seconds, self.cpu_seconds, self.idle_seconds = owner, 0.0, 0.0, None
        self._msg = self._played = None

    def wait(self):
        while self._msg is None:  # the replies come in the order the plays were asked for
            self.owner._collect()

    def _take(self, msg):
        self._msg = msg
        if msg[0] == "ok":
            self.seconds, self.cpu_seconds, self.idle_seconds = msg[4], msg[5], msg[6]

    def ok(self) -> bool:
        self.wait()
        return self._msg[0] == "ok"

    def result(self) -> tuple:
        self.wait()
        kind = self._msg[0]
        if kind == "ok":
            if self._played is None:  # decoded once, here: the child pickled them (see the module's docstring)
                self._played = pickle.loads(self._msg[1])
            return self._played, self._msg[2], self._msg[3]
        if kind == "cancelled":
            from r1.rollout import Cancelled

            raise Cancelled("the rollout was cancelled")
        if kind == "died":
            raise RolloutProcessError(self._msg[1])
        cause = RolloutProcessError(f"the rollout process failed:\n{self._msg[1]}")
        if self._msg[2] is not None:  # the child's exception itself: train.py treats it as it would here
            raise self._msg[2] from cause
        raise cause


class RemoteActor:
    """An Actor (r1/actor.py) whose plays run in a child process: the same refresh, play, counted_play, start
    (a play in flight: Handle, with the child's own graph counts), cancel and close; `stop` cancels the plays
    in flight (the child's AgentEnvLoop.stop).

    The child is started once (spawn: a CUDA context cannot be forked) and plays every rollout and held-out
    evaluation, so the KV cache lives only there; it is a daemon, so an environment cannot start processes
    of its own in it. It costs a second generator copy and a CUDA context (the memory plan counts both;
    remote_actor splits run.memory_fraction). Under torchrun each rank has its own, and the refresh's gather
    stays a collective of the trainers. The trainer's own metrics (peak_mem_gb, alloc_retries, R1_PROFILE)
    see its process only."""

    def __init__(self, cfg: Config, tok, model, slots: int, d, child_fraction: float = 1.0):
        self.cfg, self.tok, self.model, self.d = cfg, tok, model, d
        self._broken = False
        self._inflight = collections.deque()  # Handles of the plays asked for, oldest first: at most two
        self._refreshes = 0  # sent with each play: the child copies the shared weights when it moved
        self._sent = 0  # plays asked for; the child counts those done reading the shared copy in _taken
        ctx = mp.get_context("spawn")
        self.stop = ctx.Event()
        self._taken = ctx.RawValue("q", 0)
        # on a CPU the two processes split this one's threads (as many each, both busy at once, was twice as
        # slow as the synchronous loop: docs/decisions.md); close() gives them back
        self._threads = torch.get_num_threads() if d.device.type == "cpu" else None
        threads = None
        if self._threads:
            threads = max(1, self._threads // 2)
            torch.set_num_threads(max(1, self._threads - threads))
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_child, name="r1-rollout", daemon=True,
                                 args=(cfg, model.cfg, slots, str(d.device), child_fraction, child, self.stop,
                                       self._taken, threads))
        try:
            with sigint_ignored():  # inherited: a Ctrl-C while the child imports torch is not its traceback
                self._proc.start()
        except Exception as e:  # noqa: BLE001 - e.g. no room for the child's arguments in /dev/shm
            self._give_back_threads()
            raise RolloutProcessError(f"the rollout process could not start: {type(e).__name__}: {e}") from e
        finally:
            child.close()
        # the weights after the start, over the pipe, so that the child opens them inside its error handling (CUDA
        # IPC; a CPU tensor moves to shared memory here, in place, so the trainer's refreshes reach the child)
        try:
            self._conn.send({k: v.detach() for k, v in model.state_dict().items()})
        except Exception as e:  # noqa: BLE001 - a child that died at once, or no shared memory
            self.close()
            raise RolloutProcessError(f"the rollout process could not start: {type(e).__name__}: {e}") from e
        msg = self._receive()
        if msg[0] != "ready":
            self.close()
            raise RolloutProcessError(f"the rollout process could not start:\n{msg[1]}")
        self.child_threads = msg[1]  # its torch threads

    @property
    def _busy(self) -> bool:
        return bool(self._inflight)

    def refresh(self, policy):
        """Copy the policy's weights into the shared generator copy (r1/actor.copy_weights). The child reads
        the copy only at the start of a play, so a refresh may come while a play runs, once that play has
        read it (waited for here: a play asked for is taken as soon as the one before it ends); not with a
        play queued behind another, whose weights would change before it starts."""
        if len(self._inflight) > 1:
            raise RuntimeError("RemoteActor.refresh with a play queued behind another: wait for the first "
                               "(r1/overlap.Rollouts)")
        while self._taken.value < self._sent:  # the play in flight has not read the shared copy yet
            if not self._proc.is_alive():
                raise RolloutProcessError(self._died())
            time.sleep(0.001)
        from r1.actor import copy_weights

        copy_weights(self.cfg, self.model, policy)
        self._refreshes += 1

    def start(self, rows: list, n: int, sampling, **run) -> Handle:
        """Ask the child to play; returns at once. One play may be queued behind the one that runs: the
        child starts it when that one ends, without waiting for the trainer to take the episodes."""
        if len(self._inflight) > 1:
            raise RuntimeError("RemoteActor.start with a play running and another queued: two at a time")
        if self.d.device.type == "cuda":
            torch.cuda.current_stream(self.d.device).synchronize()  # the refresh's copies land before the child reads
        try:
            self._conn.send(("play", self._refreshes, rows, n, sampling, run))
        except OSError:  # a broken pipe: the process is gone
            raise RolloutProcessError(self._died()) from None
        self._sent += 1
        self._inflight.append(Handle(self))
        return self._inflight[-1]

    def play(self, rows: list, n: int, sampling, **run) -> list:
        return self.start(rows, n, sampling, **run).result()[0]

    def counted_play(self, rows: list, n: int, sampling, **run) -> tuple:
        """play -> (episodes, graph counts it added, captures deferred), as the child counted them."""
        return self.start(rows, n, sampling, **run).result()

    def cancel(self):
        """Cancel the plays in flight (each ends at its next chunk) and take their replies."""
        self.stop.set()
        try:
            while self._inflight:  # cancelled, done or died, each: the child is free again
                self._collect()
        finally:
            self.stop.clear()

    def _collect(self):
        """The oldest play's reply, into its Handle."""
        msg = self._receive()
        self._inflight.popleft()._take(msg)

    def _receive(self):
        """The child's next message; a child that died says so (its exit code) instead of hanging."""
        if self._broken:
            return ("died", "the rollout process's pipe was cut mid-message (an interrupt): it cannot go on")
        try:
            while not self._conn.poll(0.5):
                if not self._proc.is_alive():
                    return ("died", self._died())
            msg = self._conn.recv()
        except (EOFError, OSError):  # closed or reset by a process that ended
            return ("died", self._died())
        except BaseException:  # Ctrl-C while waiting: the next message may be cut; close() kills instead
            self._broken = True
            raise
        return msg

    def _died(self) -> str:
        self._proc.join(5)
        return f"the rollout process died (exit code {self._proc.exitcode})"

    def close(self):
        """Stop the child: a play in flight is cancelled and its reply drained, so the child is not left
        blocked sending it; then it is asked to end, and killed if it does not within 30 s."""
        if self._proc.is_alive() and not self._broken:
            if self._busy:
                self.cancel()
            try:
                self._conn.send(("close",))
            except OSError:
                pass
            self._proc.join(30)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(5)
        self._conn.close()
        self._give_back_threads()

    def _give_back_threads(self):
        if self._threads:
            torch.set_num_threads(self._threads)
            self._threads = None


def remote_actor(cfg: Config, tok, model, plan, d) -> RemoteActor:
    """train.overlap 2's actor for the memory plan `plan`. Under run.memory_fraction < 1 on CUDA the fraction
    is split: the process is capped at its planned share, this one at the rest (memory.split_fraction)."""
    from r1 import memory

    fraction, child = cfg.run.memory_fraction, 1.0
    if d.device.type == "cuda" and fraction < 1:
        mine, child = memory.split_fraction(plan, fraction, torch.cuda.mem_get_info(d.device)[1])
        torch.cuda.set_per_process_memory_fraction(mine, d.device)
    return RemoteActor(cfg, tok, model, plan.slots, d, child)


def _copy_into(model, shared: dict):
    """The shared weights into the child's generator model, in place (fused views included)."""
    with torch.no_grad():
        for k, v in model.state_dict().items():
            v.copy_(shared[k])


def _error(e: BaseException) -> tuple:
    """An error message for the trainer: the traceback, and the exception itself where it pickles."""
    try:
        pickle.loads(pickle.dumps(e))
    except Exception:  # noqa: BLE001 - an exception that does not pickle travels as its traceback only
        e = None
    return ("error", traceback.format_exc(), e)


@contextlib.contextmanager
def sigint_ignored():
    """Ctrl-C ignored while a child process starts, so that the child starts ignoring it: an ignored signal
    stays ignored across exec, and Python installs its KeyboardInterrupt handler only where SIGINT is not
    ignored. A Ctrl-C while a spawned child was still importing (seconds of torch) printed that child's
    KeyboardInterrupt traceback under the trainer's one line. The main thread only (signal.signal's rule);
    the trainer's handler is back as soon as the child is launched."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler if previous is None else previous)


def _end_with_parent():
    """Linux: the kernel ends this process when the trainer's ends (a kill -9 included); elsewhere a no-op."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _requests(conn, inbox: queue.Queue):
    """The child's reader: every message from the trainer into `inbox` as it comes (None: the trainer is gone),
    so that a play asked for while another runs never leaves the trainer blocked on a full pipe (a queued
    request can be larger than the pipe's buffer: 8 KB on macOS) while the child blocks sending its
    episodes to it."""
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            inbox.put(None)
            return
        inbox.put(msg)
        if msg[0] == "close":
            return


def _child(cfg: Config, model_cfg, slots: int, device: str, fraction: float, conn, stop, taken, threads):
    """The rollout process: build an Actor on a copy of the shared weights, then play what it is asked, in
    order; `taken` counts the plays done reading the shared copy (RemoteActor.refresh waits on it); `threads`
    its share of the trainer's CPU threads (None: torch's default)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle: it stops this process
    _end_with_parent()
    dev = torch.device(device)
    if threads:
        torch.set_num_threads(threads)
    try:
        from r1.run import use_kernels

        use_kernels(cfg)  # a spawned process starts from the defaults: the run's kernels.* paths, as the trainer's
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
            if fraction < 1:  # its planned share of run.memory_fraction (the trainer is capped at the rest)
                torch.cuda.set_per_process_memory_fraction(fraction, dev)
        shared = conn.recv()  # the trainer's generator copy (CUDA IPC or shared memory)
        from r1 import chunk_graphs
        from r1.actor import Actor
        from r1.distributed import Dist
        from r1.model import Transformer
        from r1.rollout import Cancelled
        from r1.run import run_tokenizer

        d = Dist(0, 1, dev.index or 0, dev)
        tok = run_tokenizer(cfg)
        dtype = next(iter(shared.values())).dtype
        with torch.device("meta"):
            model = Transformer(model_cfg)
        model = model.to(dtype).to_empty(device=dev)
        model.requires_grad_(False)
        _copy_into(model, shared)
        model.eval()
        actor = Actor(cfg, tok, model, slots, d)
        actor.loop.stop = stop
        if dev.type == "cuda":  # the projections fused by the Generator left their unfused copies cached: free them
            torch.cuda.synchronize(dev)
            torch.cuda.empty_cache()
        conn.send(("ready", torch.get_num_threads()))
    except BaseException as e:  # noqa: BLE001 - reported to the trainer, which raises it
        conn.send(_error(e))
        return
    copied = 0  # the trainer's refresh count the model holds (0: the weights as shared at the start)
    ended = None  # when the last play ended (before its episodes were pickled); None after a failed one
    inbox = queue.Queue()
    threading.Thread(target=_requests, args=(conn, inbox), name="r1-requests", daemon=True).start()
    while True:
        msg = inbox.get()
        if msg is None or msg[0] == "close":  # the trainer is gone, or asks to end
            actor.loop.drop_carried()  # rollout.carry_tokens: the paused episodes' environments close
            return
        _, refreshes, rows, n, sampling, run = msg
        t0, c0 = time.time(), time.process_time()
        idle = None if ended is None else t0 - ended  # pickled, sent, then waited for this request (if not queued)
        try:
            try:
                if refreshes != copied:  # the trainer refreshed the shared copy since the last play
                    _copy_into(model, shared)
                    if dev.type == "cuda":  # read before the trainer may write it again
                        torch.cuda.current_stream(dev).synchronize()
                    copied = refreshes
            finally:  # done reading the shared copy (or failed to): the trainer may refresh it
                taken.value += 1
            try:
                graphs, deferred = actor.graph_counts(), chunk_graphs.deferred()
                played = actor.play(rows, n, sampling, **run)
            finally:  # the play's kernels done before its seconds are taken and its reply sent
                if dev.type == "cuda":
                    torch.cuda.current_stream(dev).synchronize()
            ended = time.time()
            counts = (actor.graph_counts(since=graphs), chunk_graphs.deferred() - deferred,
                      ended - t0, time.process_time() - c0, idle)  # the play's own seconds, before the bytes
            reply = ("ok", pickle.dumps(played, protocol=pickle.HIGHEST_PROTOCOL), *counts)
        except Cancelled:
            reply, ended = ("cancelled",), None
        except BaseException as e:  # noqa: BLE001 - reported to the trainer, which raises it
            reply, ended = _error(e), None
        conn.send(reply)

