"""Where an RL iteration's time goes: `R1_PROFILE=N` runs iteration N (1-based) under torch.profiler.

The trainer logs each phase's wall time (time_rollout, time_score, time_train); this says what fills it.
It writes <run.dir>/profile_iter<N>.txt (rank 0; other ranks _rank<r>): per phase, its wall time and
the GPU's busy time in it (the union of kernel intervals that start inside the phase): a phase whose
GPU is busy a small part of its wall time waits on the host (Python, launches, syncs), not on the
GPU. Then the top ops by CUDA time and by CPU time. No chrome trace: for a whole iteration it runs to
hundreds of MB. The profiled iteration itself runs slower, and the report takes minutes for a big
iteration: the trainer leaves it out of the run's clock.

Phases are marked with `phase(name)` (torch.profiler.record_function: free when not profiling).
"""
import contextlib
import os
import time

import torch

PHASES = ("r1.rollout", "r1.score", "r1.update")


def phase(name: str):
    """A named range in the profile (r1.rollout, r1.score, r1.update)."""
    return torch.profiler.record_function(name)


def wanted(iteration: int) -> bool:
    """R1_PROFILE names this iteration (1-based); a value that is not a positive integer is an error."""
    v = os.environ.get("R1_PROFILE", "")
    if not v:
        return False
    if not v.isdigit() or int(v) < 1:
        raise ValueError(f"R1_PROFILE={v!r}: give the iteration to profile, 1 or more")
    return int(v) == iteration


@contextlib.contextmanager
def maybe_profile(run_dir: str, iteration: int, rank: int = 0):
    """Profile the body when R1_PROFILE == iteration (1-based) and write the report: every rank profiles
    and writes its own (rank 0 profile_iterN.txt, rank r profile_iterN_rank<r>.txt), so no rank waits in
    a collective for minutes while another sorts out its events.

    Yields a dict whose "report_s" is the time spent on the report after the body (minutes for a big
    iteration), which the trainer leaves out of its clock (train.time_limit, time_elapsed)."""
    out = {"report_s": 0.0}
    if not wanted(iteration):
        yield out
        return
    cuda = torch.cuda.is_available()
    acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    with torch.profiler.profile(activities=acts) as prof:
        yield out
    t = time.time()
    path = os.path.join(run_dir, f"profile_iter{iteration}" + (f"_rank{rank}" if rank else "") + ".txt")
    with open(path, "w") as f:
        f.write(report(prof.events(), cuda))
        avg = prof.key_averages()
        if cuda:
            f.write("\ntop ops by self CUDA time\n" + avg.table(sort_by="self_cuda_time_total", row_limit=30))
        f.write("\ntop ops by self CPU time\n" + avg.table(sort_by="self_cpu_time_total", row_limit=30))
    out["report_s"] = time.time() - t
    if rank == 0:
        print(f"profile of iteration {iteration}: {path} (report written in {out['report_s']:.0f} s, "
              f"not counted in the run's clock)", flush=True)


def busy_us(intervals: list) -> float:
    """Length of the union of (start, end) intervals."""
    total, end = 0.0, float("-inf")
    for s, e in sorted(intervals):
        if e > end:
            total += e - max(s, end)
            end = e
    return total


def report(events, cuda: bool) -> str:
    """Per phase: wall ms, GPU busy ms and fraction (kernels that start inside the phase); then, on a GPU,
    each phase's top kernels by GPU time (the whole run's op tables below mix the phases together)."""
    kernels = [(e.time_range.start, e.time_range.end, e.name) for e in events  # kernels, copies (not our ranges)
               if cuda and e.device_type == torch.autograd.DeviceType.CUDA and e.name not in PHASES]
    lines, tops = ["phase          wall ms   GPU busy ms   busy"], []
    for name in PHASES:
        for e in (e for e in events if e.name == name and e.device_type == torch.autograd.DeviceType.CPU):
            s, t = e.time_range.start, e.time_range.end
            inside = [(a, min(b, t), k) for a, b, k in kernels if s <= a < t]
            busy = busy_us([(a, b) for a, b, _ in inside]) if cuda else float("nan")
            lines.append(f"{name:<14}{(t - s) / 1e3:>8.1f}{busy / 1e3:>14.1f}{busy / max(t - s, 1):>7.0%}")
            if cuda:
                tops += [f"\n{name}: top kernels by GPU time (ms, calls)"] + kernel_table(inside)
    return "\n".join(lines + tops) + "\n"


def kernel_table(kernels: list, rows: int = 15) -> list:
    """Lines of (start, end, name) kernels summed by name, longest total first: ms, calls, name (cut to 100)."""
    total, calls = {}, {}
    for a, b, name in kernels:
        total[name] = total.get(name, 0.0) + (b - a)
        calls[name] = calls.get(name, 0) + 1
    top = sorted(total, key=total.get, reverse=True)
    out = [f"{total[k] / 1e3:>10.1f} {calls[k]:>7d}  {k[:100]}" for k in top[:rows]]
    rest = sum(total[k] for k in top[rows:])
    if rest:
        out.append(f"{rest / 1e3:>10.1f} {sum(calls[k] for k in top[rows:]):>7d}  (the other {len(top) - rows} kernels)")
    return out
