"""Plot reward and held-out accuracy against iteration from one or more runs' metrics.jsonl.

    python -m r1.plot runs/ppo runs/grpo --out docs/curves.png [--keys reward_mean,eval_accuracy] [--x time]

One panel per key, one line per run (labelled by folder name). `--x time`
puts the run's seconds (`time_elapsed`) on the x axis instead of the
iteration: runs compared at equal time (an ablation, LoRA against full
fine-tuning) are read there, since one run's iteration can take longer than
another's. The held-out read before RL (iteration 0) sits at 0 s; a resumed
run's sessions are laid end to end. Reads only
metrics.jsonl, so it works on a run that is still going or was copied off
the GPU machine. matplotlib is imported lazily (a dev requirement).
"""
import argparse
import json
import os


# A metrics line is about 1.5 KB (40 numbers); a long real run's metrics.jsonl is tens of MB. 256 MiB is over
# 170,000 iterations, and parsed into dicts about 1 GB of memory: past it the file is refused, not a MemoryError.
# Short lines cost more as dicts than as text, so also at most 1,000,000 lines (a million iterations).
MAX_METRICS = 256 << 20
MAX_LINES = 1_000_000


def read_metrics(run_dir: str) -> list:
    """The metrics lines of a run; a partial last line (a run still writing, or cut off) is skipped with a
    warning, any other bad line is a one-line error naming file:line; so is a file that is not regular, larger
    than MAX_METRICS or longer than MAX_LINES."""
    from r1.bounded import open_regular, too_large
    from r1.logger import read_back

    path = os.path.join(run_dir, "metrics.jsonl") if os.path.isdir(run_dir) else run_dir
    if not os.path.exists(path):
        raise SystemExit(f"error: no metrics.jsonl at {path}")
    try:
        lines, size = 0, 0
        with open_regular(path, "metrics file") as f:  # counted before anything is parsed
            while chunk := f.read(1 << 20):
                size, lines = size + len(chunk), lines + chunk.count(b"\n")
                if size > MAX_METRICS or os.fstat(f.fileno()).st_size > MAX_METRICS:
                    raise ValueError(too_large(path, MAX_METRICS, "metrics file"))
                if lines > MAX_LINES:
                    raise ValueError(f"metrics file {path} has more than {MAX_LINES} lines, the most this reads")
        return [json.loads(line) for line in read_back(path, float("inf"))]
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    except OSError as e:
        raise SystemExit(f"error: cannot read {path}: {e.strerror or e}") from None


def check_keys(runs: list, keys: list, x: str = "iter"):
    """A key no run has is a one-line error listing the keys the runs do have (not an empty panel); so is
    x="time" for a run that logs no time_elapsed (an SFT run, a run older than the key)."""
    rows = {run: read_metrics(run) for run in runs}
    if x == "time":
        untimed = [run for run, rs in rows.items() if not any("time_elapsed" in r for r in rs)]
        if untimed:
            raise SystemExit(f"error: --x time: {untimed[0]} logs no time_elapsed in its metrics.jsonl; "
                             f"plot it against iterations (--x iter)")
    have = {k for rs in rows.values() for r in rs for k, v in r.items() if isinstance(v, (int, float)) and k != "iter"}
    missing = [k for k in keys if k not in have]
    if missing:
        raise SystemExit(f"error: no run has {', '.join(map(repr, missing))} in its metrics.jsonl; keys: "
                         f"{', '.join(sorted(have)) or 'none (no numeric metrics yet)'}")


def series(rows: list, key: str, x: str = "iter") -> tuple:
    """(xs, ys) of `key`; x="time": the seconds of the row's iteration (`time_elapsed`, 0 for iteration 0; a
    point whose iteration has no time is left out; after a resume, whose clock starts again at 0, the new
    session's seconds follow the last logged second of the one before)."""
    seconds = {0: 0.0}
    if x == "time":  # a resumed run's clock starts again at 0: its sessions are laid end to end
        offset, last = 0.0, 0.0
        for r in rows:
            t = r.get("time_elapsed")
            if isinstance(t, (int, float)):
                if t < last:
                    offset += last
                last = t
                seconds.setdefault(r["iter"], offset + t)
    pts = [(r["iter"] if x == "iter" else seconds.get(r["iter"]), r[key]) for r in rows
           if isinstance(r.get(key), (int, float))]
    pts = [p for p in pts if p[0] is not None]
    return [p[0] for p in pts], [p[1] for p in pts]


def moving_average(y: list, n: int) -> list:
    """Mean of the last n points (fewer at the start); n <= 1 returns y."""
    if n <= 1:
        return list(y)
    return [sum(y[max(0, i - n + 1): i + 1]) / (i + 1 - max(0, i - n + 1)) for i in range(len(y))]


def plot(runs: list, keys: list, out: str, smooth: int = 1, x_axis: str = "iter"):
    check_keys(runs, keys, x_axis)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(1, len(keys), figsize=(5 * len(keys), 3.6), squeeze=False)
    for ax, key in zip(axes[0], keys):
        for run in runs:
            x, y = series(read_metrics(run), key, x_axis)
            if x:
                name = os.path.basename(os.path.normpath(run))
                line, = ax.plot(x, y, marker="o", markersize=3, alpha=0.35 if smooth > 1 else 1.0,
                                label=name if smooth <= 1 else None)
                if smooth > 1:
                    ax.plot(x, moving_average(y, smooth), color=line.get_color(), label=f"{name} (mean of {smooth})")
        ax.set_title(key)
        ax.set_xlabel("iteration" if x_axis == "iter" else "seconds (time_elapsed)")
        if x_axis == "iter":
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # iterations are whole numbers: no 1.25 ticks
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    fig.savefig(out, dpi=120)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m r1.plot", description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", help="run folders (or metrics.jsonl files)")
    p.add_argument("--out", required=True, help="PNG to write")
    p.add_argument("--keys", default=None, help="comma-separated metric keys (default: reward_mean and, where a "
                   "run has it, eval_accuracy); a key no run has is an error")
    p.add_argument("--smooth", type=int, default=1, help="also draw a moving average over this many points")
    p.add_argument("--x", choices=["iter", "time"], default="iter", help="the x axis: iteration (default) or the "
                   "run's seconds (time_elapsed), for runs compared at equal time")
    a = p.parse_args(argv)
    if a.keys is None:
        have = {k for run in a.runs for r in read_metrics(run) for k in r}
        keys = ["reward_mean"] + (["eval_accuracy"] if "eval_accuracy" in have else [])
    else:
        keys = [k.strip() for k in a.keys.split(",") if k.strip()]
    print(plot(a.runs, keys, a.out, a.smooth, a.x))


if __name__ == "__main__":
    from r1.exits import run_main

    run_main(main)
