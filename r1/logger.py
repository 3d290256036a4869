"""Metrics out: one JSON line per iteration, tensorboard scalars, a progress bar.

Only rank 0 writes. metrics.jsonl gets one line per iteration, written in
one `write`, flushed and fsynced; if the write fails (a full disk) the file
is cut back to its previous length, so it never keeps half a line. On resume
the file is read back: lines of iterations after the checkpoint are dropped
so the file matches the run, a partial last line (left by a crash or a
machine that lost power mid-write) is dropped with a warning naming the
file, and any other unreadable line is an error naming file:line. The kept
lines are rewritten atomically (temp, fsync, rename).
"""
import json
import math
import os
import warnings

from r1.atomic import write_text


def read_back(path: str, upto: int) -> list:
    """The lines of metrics.jsonl for iterations <= upto (see the module docstring)."""
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = f.read().split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    keep = []
    for i, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            if not isinstance(rec, dict) or not isinstance(rec.get("iter", 0), (int, float)):
                raise ValueError("not an object with a numeric 'iter'")
        except ValueError as e:
            if i == len(lines):
                warnings.warn(f"{path}:{i}: dropped a partial last line (a write was cut off): {line[:60]!r}")
                continue
            raise ValueError(f"{path}:{i}: not a metrics line ({str(e)[:80]}); delete or fix that line") from None
        if rec.get("iter", 0) <= upto:
            keep.append(line + "\n")
    return keep

CPU_COST_LINE_S = 20 * 60  # a run estimated to take longer than this on a CPU says so after its first step


def duration(seconds: float) -> str:
    """'2 h 6 min', '14 min', '40 s'."""
    s = int(round(seconds))
    if s >= 3600:
        return f"{s // 3600} h {s % 3600 // 60} min"
    return f"{s // 60} min" if s >= 60 else f"{s} s"


def cpu_cost_line(kind: str, first: int, took: float, total: int, device_type: str,
                  threshold: float = CPU_COST_LINE_S) -> str | None:
    """The line a CPU run prints after its first `kind` (an SFT step, an RL iteration) of this session: the
    measured time and the estimate for the `total` it has to run; None on a GPU or when the estimate is
    under `threshold` seconds. `first` is the 1-based number of that step."""
    if device_type != "cpu" or total <= 0 or took * total <= threshold:
        return None
    return (f"cpu: {kind} {first} took {took:.1f} s; {total} {kind}s \u2248 {duration(took * total)} "
            f"(a GPU is advised for this config; docs/running.md has CPU-sized commands)")


try:
    from tqdm import tqdm
except ImportError:  # pragma: no cover
    tqdm = None


class Logger:
    def __init__(self, run_dir: str, enabled: bool, tensorboard: bool, progress: bool, total: int, start: int = 0,
                 desc: str = "iter", postfix=("reward_mean", "accuracy", "loss")):
        self.enabled = enabled
        self.path = os.path.join(run_dir, "metrics.jsonl")
        self.tb = self.bar = None
        if not enabled:
            return
        if os.path.exists(self.path):  # keep the lines of iterations the checkpoint covers
            write_text(self.path, "".join(read_back(self.path, start)))
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(os.path.join(run_dir, "tb"), purge_step=start + 1 if start else None)
        if progress and tqdm is not None:
            self.bar = tqdm(total=total, initial=start, desc=desc, dynamic_ncols=True)
        self.postfix = postfix  # the metrics the bar shows

    def log(self, it: int, metrics: dict):
        if not self.enabled:
            return
        clean = {k: (float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v) for k, v in metrics.items()}
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in clean.items()}
        line = memoryview((json.dumps({"iter": it, **clean}) + "\n").encode("utf-8"))
        try:  # a link in place of metrics.jsonl is refused, never followed out of run.dir
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
        except OSError as e:
            if os.path.islink(self.path):
                raise OSError(e.errno, f"{self.path} is a symbolic link; r1 writes only real files in run.dir") from None
            raise
        try:
            size = os.fstat(fd).st_size
            try:
                while line:
                    line = line[os.write(fd, line):]
                os.fsync(fd)
            except OSError:
                os.ftruncate(fd, size)  # never leave half a line behind (a full disk)
                raise
        finally:
            os.close(fd)
        if self.tb is not None:
            for k, v in clean.items():
                if isinstance(v, float):
                    self.tb.add_scalar(k, v, it)
            self.tb.flush()
        if self.bar is not None:
            self.bar.update(1)
            short = {k: clean[k] for k in self.postfix if isinstance(clean.get(k), float)}
            self.bar.set_postfix({k: f"{v:.3f}" for k, v in short.items()})

    def say(self, line: str):
        """A line of text that does not break the progress bar."""
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(line)
        else:
            print(line, flush=True)

    def close(self):
        if self.bar is not None:
            self.bar.close()
        if self.tb is not None:
            self.tb.close()
