"""train.overlap: 2, the rollout in a process of its own: train.overlap 1 without the two threads taking turns.

Why a process: with train.overlap 1 the rollout thread and the main thread
share one interpreter (and one CUDA context). Profiled on one H200 at 135M
(docs/LOG.md, 2026-12-03), the two used 1.07 cores together on a 16-core
host and the GPU was idle half of the overlapped iteration: they took turns.
A process has an interpreter and a CUDA context of its own.

What crosses the boundary, and why it stays exact:
- the weights: the trainer keeps its generator copy (r1/actor.py) and
  refreshes it as before, between rollouts; that copy's tensors are shared
  with the child (CUDA IPC on a GPU, shared memory on a CPU), and the child
  copies them into its own generator model at the start of every play, so
  the child's layout (fused projections, CUDA graphs' fixed addresses) is its
  own business. The trainer synchronizes its stream before it asks for a
  play, and never refreshes while one runs (r1/overlap.py's protocol);
- a play request: the prompts, n, the Sampling and AgentEnvLoop.run's
  arguments; the episodes come back pickled. The sampling noise is keyed by
  (seed, uid, position) (r1/generate.py), so a seed's trajectories are the
  ones the trainer's own actor plays, whichever process plays them (a test);
- errors: the child's traceback comes back as one error on the trainer's
  side; a child that dies is reported with its exit code, never a hang.

The child is started once (spawn: a CUDA context cannot be forked) and plays
every rollout and every held-out evaluation; the trainer builds no actor of
its own, so the KV cache lives only in the child. It costs a second
generator copy and a CUDA context (the memory plan counts both). One process
only: under torchrun each rank would need its own child, not built.
"""
from __future__ import annotations

import time
import traceback

import torch
import torch.multiprocessing as mp

from r1.config import Config


class RolloutProcessError(RuntimeError):
    """The rollout process failed or died: its traceback or exit code, in one error."""


class Handle:
    """A play running in the child: `result()` waits and returns (episodes, graph counts it added or None,
    captures deferred); `wait()` waits and keeps the outcome (an error stays for result()). `seconds` and
    `cpu_seconds` are the child's wall and CPU time for the play, as r1/overlap.Background gives them."""

    def __init__(self, owner: "RemoteActor"):
        self.owner, self.seconds, self.cpu_seconds = owner, 0.0, 0.0
        self._msg = None

    def wait(self):
        if self._msg is None:
            self._msg = self.owner._receive()
            self.owner._busy = False
            if self._msg[0] == "ok":
                self.seconds, self.cpu_seconds = self._msg[4], self._msg[5]

    def result(self) -> tuple:
        self.wait()
        kind = self._msg[0]
        if kind == "ok":
            return self._msg[1], self._msg[2], self._msg[3]
        if kind == "cancelled":
            from r1.rollout import Cancelled

            raise Cancelled("the rollout was cancelled")
        if kind == "died":
            raise RolloutProcessError(self._msg[1])
        raise RolloutProcessError(f"the rollout process failed:\n{self._msg[1]}")


class _Stop:
    """The trainer's view of the child's loop: `loop.stop` as r1/rollout.AgentEnvLoop has it."""

    def __init__(self, event):
        self.stop = event


class RemoteActor:
    """An Actor (r1/actor.py) whose plays run in a child process; the same `refresh`, `play`, `graph_counts`
    and `loop.stop`, plus `start` (a play in flight: Handle) and `close`."""

    def __init__(self, cfg: Config, tok, model, slots: int, d):
        if d.world > 1:
            from r1.config import ConfigError

            raise ConfigError(f"config key 'train.overlap'=2 (the rollout in a process of its own) runs on one "
                              f"process, not under torchrun with {d.world} ranks: use train.overlap=1")
        self.cfg, self.tok, self.model, self.d = cfg, tok, model, d
        self._graphs = (0, 0)  # the child's graph counts after its last play
        self._busy = False
        ctx = mp.get_context("spawn")
        self.loop = _Stop(ctx.Event())
        self._conn, child = ctx.Pipe()
        shared = {k: v.detach() for k, v in model.state_dict().items()}  # CPU: moved to shared memory when sent
        self._proc = ctx.Process(target=_child, name="r1-rollout",
                                 args=(cfg, model.cfg, shared, slots, str(d.device), child, self.loop.stop),
                                 daemon=True)
        self._proc.start()
        child.close()
        msg = self._receive()
        if msg[0] != "ready":
            self.close()
            raise RolloutProcessError(f"the rollout process could not start:\n{msg[1]}")
        self.on_cuda = msg[1]

    def refresh(self, policy):
        """Copy the policy's weights into the shared generator copy (r1/actor.Actor.refresh); never while a
        play runs: the child reads the copy at the start of a play."""
        if self._busy:
            raise RuntimeError("RemoteActor.refresh while a rollout plays: wait for it first (r1/overlap.py)")
        from r1.actor import Actor

        Actor.refresh(self, policy)

    def start(self, rows: list, n: int, sampling, **run) -> Handle:
        """Ask the child to play; returns at once."""
        if self._busy:
            raise RuntimeError("RemoteActor.start while a rollout plays: one at a time")
        if self.d.device.type == "cuda":
            torch.cuda.current_stream(self.d.device).synchronize()  # the refresh's copies land before the child reads
        try:
            self._conn.send(("play", rows, n, sampling, run))
        except OSError:  # a broken pipe: the process is gone
            raise RolloutProcessError(self._died()) from None
        self._busy = True
        return Handle(self)

    def play(self, rows: list, n: int, sampling, **run) -> list:
        return self.start(rows, n, sampling, **run).result()[0]

    def graph_counts(self, since: tuple | None = None) -> tuple | None:
        """The child's (eager prefill chunks, CUDA graphs captured) after its last play (Actor.graph_counts)."""
        if not self.on_cuda:
            return None
        now = self._graphs
        return now if since is None else (now[0] - since[0], now[1] - since[1])

    def _receive(self):
        """The child's next message; a child that died says so (its exit code) instead of hanging."""
        try:
            while not self._conn.poll(0.5):
                if not self._proc.is_alive():
                    return ("died", self._died())
            msg = self._conn.recv()
        except (EOFError, OSError):  # closed or reset by a process that ended
            return ("died", self._died())
        if msg[0] == "ok" and msg[6] is not None:
            self._graphs = msg[6]
        return msg

    def _died(self) -> str:
        self._proc.join(5)
        return f"the rollout process died (exit code {self._proc.exitcode})"

    def close(self):
        """Stop the child (it ends after the play in flight, if any: set loop.stop first to cut that short)."""
        if self._proc.is_alive():
            try:
                self._conn.send(("close",))
            except (BrokenPipeError, OSError):
                pass
            self._proc.join(30)
            if self._proc.is_alive():
                self._proc.kill()
                self._proc.join(5)
        self._conn.close()


def _copy_into(model, shared: dict):
    """The shared weights into the child's generator model, in place (fused views included)."""
    with torch.no_grad():
        for k, v in model.state_dict().items():
            v.copy_(shared[k])


def _child(cfg: Config, model_cfg, shared: dict, slots: int, device: str, conn, stop):
    """The rollout process: build an Actor on a copy of the shared weights, then play what it is asked."""
    try:
        from r1 import chunk_graphs
        from r1.actor import Actor
        from r1.distributed import Dist
        from r1.model import Transformer
        from r1.rollout import Cancelled
        from r1.run import run_tokenizer

        dev = torch.device(device)
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
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
        conn.send(("ready", dev.type == "cuda"))
    except BaseException:  # noqa: BLE001 - reported to the trainer, which raises it
        conn.send(("error", traceback.format_exc()))
        return
    while True:
        try:
            msg = conn.recv()
        except EOFError:  # the trainer is gone
            return
        if msg[0] == "close":
            return
        _, rows, n, sampling, run = msg
        t0, c0 = time.time(), time.process_time()
        try:
            _copy_into(model, shared)
            graphs, deferred = actor.graph_counts(), chunk_graphs.deferred()
            played = actor.play(rows, n, sampling, **run)
            if dev.type == "cuda":
                torch.cuda.current_stream(dev).synchronize()  # done reading the shared copy before the reply
            conn.send(("ok", played, actor.graph_counts(since=graphs), chunk_graphs.deferred() - deferred,
                       time.time() - t0, time.process_time() - c0, actor.graph_counts()))
        except Cancelled:
            conn.send(("cancelled",))
        except BaseException:  # noqa: BLE001 - reported to the trainer, which raises it
            conn.send(("error", traceback.format_exc()))

