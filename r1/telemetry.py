"""What an RL iteration reports besides the algorithm's own numbers: phase times, throughput, counters.

The trainer's loop reads as the algorithm (r1/trainer.py); the clocks and
counters around it live here. `Telemetry.phase` times a phase (wall and this
thread's CPU seconds) and marks it for R1_PROFILE (r1/profiler.py);
`Telemetry.metrics` turns the iteration's clocks, its rollout
(r1/overlap.Rollout) and its packing plan into the metrics.jsonl keys
(time_*, *_tok_s, the overlap's counters, memory), in the order the trainer
has always logged them. Run-long counters (eager fallbacks, allocator
retries) are logged as each iteration's increase. Token counts and shares
are sums over ranks, so rank 0 logs the global batch's numbers.
"""
import contextlib
import time

import torch

from r1 import distributed
from r1.model import eager_fallbacks
from r1.profiler import phase
from r1.rollout_stats import summarize, traj_stats


def episode_metrics(cfg, played: list, trained: list, d) -> dict:
    """The batch summary (r1/rollout_stats.py) of every rank's episodes, and the shares of them that
    spanned rollouts (carried_frac, rollout.carry_tokens) and that trained (trained_frac, drop_uniform_groups)."""
    rows = distributed.gather_objects([traj_stats(t) for t in played], d)
    metrics = summarize([r for rs in rows for r in rs])
    if cfg.rollout.carry_tokens:  # episodes that paused in an earlier rollout and resumed in a later one
        spans = sum(t.meta.get("rollouts", 1) > 1 for t in played)
        counts = distributed.all_sum(torch.tensor([float(spans), float(len(played))]), d)
        metrics["carried_frac"] = float(counts[0] / counts[1].clamp(min=1))
    if cfg.algo.drop_uniform_groups:
        kept = distributed.all_sum(torch.tensor([float(len(trained)), float(len(played))]), d)
        metrics["trained_frac"] = float(kept[0] / kept[1].clamp(min=1))
    return metrics


class Telemetry:
    """The clocks of one iteration at a time (`begin`, `phase`) and the run-long counters' last values."""

    def __init__(self, cfg, d):
        self.cfg, self.d = cfg, d
        self.fallbacks = eager_fallbacks()  # train.overlap: compiled-op calls that ran eager (r1/model._compile)
        self.alloc_retries = 0  # CUDA: the caching allocator's free-and-retry count so far
        self.begin()

    def begin(self):
        """A new iteration's clock."""
        self.t0, self.wall, self.cpu = time.time(), {}, {}

    @contextlib.contextmanager
    def phase(self, name: str):
        """Time the body as phase `name` (rollout, score, update): wall and this thread's CPU seconds."""
        t, c = time.time(), time.thread_time()
        with phase(f"r1.{name}"):
            yield
        self.wall[name], self.cpu[name] = time.time() - t, time.thread_time() - c

    def metrics(self, rollout, plan, lr: float) -> dict:
        """The iteration's times, throughput and counters (the module's docstring); call after the update."""
        cfg, d, wall = self.cfg, self.d, self.wall
        out = {}
        n_train = sum(mb.num_tokens for mb in plan.micro_batches)  # computed: a shared prompt counts once
        if cfg.train.share_prefix:  # of the tokens packed whole, the share not recomputed
            shared = distributed.all_sum(torch.tensor([float(sum(mb.shared_tokens for mb in plan.micro_batches)),
                                                       float(n_train)]), d)
            out["shared_prefix_frac"] = float(shared[0] / (shared[0] + shared[1]).clamp(min=1))
        roll_s = wall["rollout"]  # what the iteration waited for its episodes
        if cfg.train.overlap:  # the rollout itself ran rollout.seconds, partly beside the last iteration
            fallbacks = eager_fallbacks()  # compiled-op calls run eager while the other thread compiled: 0 once warm
            out.update(time_rollout_play=rollout.seconds, policy_lag=float(rollout.lag),
                       eager_op_fallbacks=float(fallbacks - self.fallbacks),
                       cpu_main_s=self.cpu["score"] + self.cpu["update"], captures_deferred=float(rollout.deferred))
            if rollout.cpu_seconds is not None:  # CPU seconds of each thread: with the wall times, who waited
                out["cpu_rollout_s"] = rollout.cpu_seconds
            if rollout.idle_seconds is not None:  # train.overlap 2: the process's time between its plays
                out["rollout_idle_s"] = rollout.idle_seconds
            self.fallbacks = fallbacks
            roll_s = rollout.seconds
        n_roll = sum(len(s.response_ids) for t in rollout.trajectories for s in t.steps)
        graphs = rollout.graphs
        out.update(
            time_rollout=wall["rollout"], time_score=wall["score"], time_train=wall["update"], lr=lr,
            rollout_tok_s=float(distributed.all_sum(n_roll, d)) / max(roll_s, 1e-9),
            **({} if graphs is None else {"rollout_eager_chunks": graphs[0], "rollout_graph_captures": graphs[1]}),
            train_tok_s=float(distributed.all_sum(n_train, d)) * cfg.algo.ppo_epochs / max(wall["update"], 1e-9),
        )
        if d.device.type == "cuda":
            out["peak_mem_gb"] = torch.cuda.max_memory_allocated() / 2**30
            torch.cuda.reset_peak_memory_stats()
            # the allocator hit the memory cap (run.memory_fraction) and freed its cache to retry: each retry
            # synchronizes the device, a suspect for small micro-batches under a tight cap
            retries = torch.cuda.memory_stats().get("num_alloc_retries", 0)
            out["alloc_retries"] = retries - self.alloc_retries
            self.alloc_retries = retries
        return out

    def other(self) -> float:
        """time_other: the iteration's wall time so far outside its phases."""
        return time.time() - self.t0 - sum(self.wall.values())
