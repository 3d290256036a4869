"""Wait on background device jobs and collect what they wrote (bench/device.py wait / collect).

A device call lasts 10 minutes at most and the machine goes back 30 s after it, so a long job runs under
setsid nohup and calls that follow it back to back each wait here, then copy its results to $OUT. A job runs
while its process (RES/job.pid) lives; once that is gone it is done if its part of progress.txt (from the last
"begin:") says ALL DONE, else it died. A failed phase alone does not end the wait: the job goes on to its next.
collect packs RES's small files (logs, metrics, evals, markers; not hf/, checkpoints/, adapter/, trajectories/
nor any file of 4 MiB or more: the device returns 16 MiB a file at most) with bench/results into
OUT/<RES's name>/results.tgz, and copies progress.txt and RES's top-level *.json beside it.
Exit status: 0 done, every phase passed; 1 a job died; 2 still running, or not started (call again within 30 s);
3 done with failed phases; 4 no such folder. For several jobs: 2 while any runs, else the worst.
"""
import glob
import os
import shutil
import tarfile
import time

from phases import ROOT, this_run

SKIP_DIRS = ("checkpoints", "hf", "adapter", "trajectories")
MAX_FILE = 4 << 20


def _progress(res: str) -> list:
    try:
        with open(os.path.join(res, "progress.txt")) as f:
            return f.read().splitlines()
    except OSError:
        return []


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a child of this process that ended and was not reaped yet counts as gone
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def state(res: str) -> str:
    """running (or not started), done, or died."""
    try:
        with open(os.path.join(res, "job.pid")) as f:
            pid = int(f.read().strip())
    except (OSError, ValueError):
        return "running"
    if _alive(pid):
        return "running"
    return "done" if any(ln.lower().endswith(" all done") for ln in this_run(_progress(res))) else "died"


def failed(res: str) -> list:
    out = []
    for ln in this_run(_progress(res)):
        w = ln.split()
        if len(w) > 2 and w[1] == "FAIL" and w[2] not in out:
            out.append(w[2])
    return out


def collect(res: str, out: str) -> str:
    """Pack RES's small files and bench/results into out/results.tgz; copy progress.txt and top-level JSON."""
    res = os.path.abspath(res)
    os.makedirs(out, exist_ok=True)
    base = os.path.basename(res)
    archive = os.path.join(out, "results.tgz")
    with tarfile.open(archive + ".tmp", "w:gz") as t:
        for d, dirs, files in os.walk(res):
            dirs[:] = sorted(x for x in dirs if x not in SKIP_DIRS)
            for name in sorted(files):
                p = os.path.join(d, name)
                if os.path.isfile(p) and not os.path.islink(p) and os.path.getsize(p) < MAX_FILE:
                    t.add(p, arcname=os.path.join(base, os.path.relpath(p, res)))
        t.add(os.path.join(ROOT, "bench", "results"), arcname="bench/results")
    os.replace(archive + ".tmp", archive)
    for p in [os.path.join(res, "progress.txt")] + glob.glob(os.path.join(res, "*.json")):
        if os.path.isfile(p):
            shutil.copy(p, out)
    return archive


def wait(res: str, out: str, limit: float) -> int:
    """One call's wait on one job, then its report and its collection; the exit status above."""
    if not os.path.isdir(res):
        print(f"wait: no folder {res} (the job's results folder?)")
        return 4
    t0 = time.time()
    while state(res) == "running" and time.time() - t0 < limit:
        time.sleep(2)
    s = state(res)
    lines = _progress(res)
    print("\n".join(lines) if lines else f"no {os.path.join(res, 'progress.txt')} yet")
    bad = failed(res)
    logs = [os.path.join(res, f + ".log") for f in bad]
    if not bad:
        logs = sorted(glob.glob(os.path.join(res, "*.log")), key=os.path.getmtime)[-1:]
    for p in logs:
        try:
            with open(p) as f:
                tail = f.read().splitlines()[-5:]
        except OSError:
            continue
        print(f"== {p} ({'failed phase' if bad else 'newest log'}, last lines)")
        print("\n".join(tail))
    archive = collect(res, out)
    print(f"{archive} {os.path.getsize(archive)} bytes")
    if s == "done" and bad:
        s = "done, with failed phases: " + " ".join(bad)
    print(f"wait: {s} after {time.time() - t0:.0f}s")
    return {"done": 0, "died": 1, "running": 2}.get(s, 3)


def wait_all(out: str, limit: float, folders: list) -> int:
    """wait() on each folder in turn with what is left of `limit`; each job's files in out/<its name>/."""
    names = [os.path.basename(os.path.abspath(r)) for r in folders]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        print(f"wait: two folders named {' '.join(twice)}: their results would meet in {out}")
        return 4
    t0, running, worst = time.time(), False, 0
    for res, name in zip(folders, names):
        if len(folders) > 1:
            print(f"=== {res}")
        rc = wait(res, os.path.join(out, name), max(0.0, limit - (time.time() - t0)))
        if rc == 2:
            running = True
        else:
            worst = max(worst, rc)
    if len(folders) > 1:
        print("wait: some job still running" if running else f"wait: none running (status {worst})")
    return 2 if running else worst
