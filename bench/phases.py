"""Resumable phases of a device job (bench/device.py): one results folder, one progress.txt, a marker a phase.

A device machine can go away between calls, so a job is a sequence of named phases. A phase runs one command
into RES/<name>.log and, when it succeeds, writes RES/<name>.done; started again on the same folder, the job
skips every phase marked done whose outputs (`keep`) are still there, and those named in --skip. A phase whose
run folder is left from a cut-short or lost attempt has it moved aside (<dir>.stale-N), never deleted.
progress.txt gets one line an event; a job's part starts at its "begin:" line and ends with "ALL DONE", after
"failed phases: ..." if any failed; job.pid holds the job's process id (bench/wait.py reads all three).
stamp() is the part every result JSON carries: device, torch, commit, date.
"""
import datetime
import json
import os
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from r1.environment import MOVED  # noqa: E402  (stdlib only)


def stamp(commit: str = "") -> dict:
    """{device, torch, commit, date}: the GPU's name (or "cpu"), torch's version, the repository's commit
    (`commit`, else git's HEAD, else "unknown": a device machine gets a copy of the tree without .git)."""
    # in a process of its own: a CUDA context made here would hold GPU memory for the whole job
    probe = ("import json, torch; print(json.dumps([torch.__version__, torch.cuda.get_device_name() "
             "if torch.cuda.is_available() else 'cpu']))")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    try:
        version, device = json.loads(r.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        version, device = "unknown", "unknown"
    if not commit:
        try:
            commit = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True,
                                    text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            commit = ""
    return {"device": device, "torch": version, "commit": commit or "unknown",
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")}


def last_json(path: str):
    """The last line of `path` that is a JSON object (eval.py's log ends with its result), or None."""
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict):
            return obj
    return None


def this_run(lines: list) -> list:
    """The lines of progress.txt from its last "begin:" line: an earlier run's failures or ALL DONE are not this
    one's."""
    start = max((i for i, ln in enumerate(lines) if " begin:" in ln), default=0)
    return lines[start:]


class Job:
    """The phases of one job in folder `res`. Threads may run phases side by side (parallel)."""

    def __init__(self, res: str, skip=(), what: str = "", dry: bool = False):
        self.res, self.skip, self.dry = res, set(skip), dry
        self._lock = threading.Lock()
        if not dry:
            os.makedirs(res, exist_ok=True)
            with open(self.path("job.pid"), "w") as f:
                f.write(f"{os.getpid()}\n")
        self.log(f"begin: job pid {os.getpid()}" + (f", {what}" if what else ""))

    def path(self, name: str) -> str:
        return os.path.join(self.res, name)

    def log(self, text: str):
        line = f"{time.strftime('%H:%M:%S')} {text}"
        with self._lock:
            print(line, flush=True)
            if not self.dry:
                with open(self.path("progress.txt"), "a") as f:
                    f.write(line + "\n")

    def done(self, name: str) -> bool:
        return os.path.exists(self.path(name + ".done"))

    def _skipped(self, name: str, keep) -> bool:
        if self.done(name) and all(os.path.exists(k) for k in keep):
            self.log(f"skip {name} (done)")
            return True
        if name in self.skip:
            self.log(f"skip {name} (--skip)")
            return True
        return False

    def _move_aside(self, fresh):
        for d in fresh:
            if os.path.exists(d):
                n = 1
                while os.path.exists(f"{d}.stale-{n}"):
                    n += 1
                os.rename(d, f"{d}.stale-{n}")
                self.log(f"moved {d} aside to {d}.stale-{n} (left by an attempt that did not finish)")

    def phase(self, name: str, argv: list, env: dict = None, gpu=None, keep=(), fresh=(), timeout=None) -> bool:
        """Run argv once as phase `name`; True when it succeeded now or earlier (or is skipped). keep: files the
        phase makes, which must still exist for a done phase to be skipped; fresh: folders the command must
        create itself (train.py refuses an existing run.dir), moved aside before it runs. env: R1_* variables
        of r1/environment.py's MOVED are refused (a switch of config section kernels: an override or a flag)."""
        moved = [k for k in env or {} if k in MOVED]
        if moved:
            raise ValueError(f"phase {name}: environment {', '.join(moved)} was removed (config section kernels)")
        if self._skipped(name, keep):
            return True
        if self.dry:
            env_words = [f"{k}={v}" for k, v in (env or {}).items()]
            env_words += [f"CUDA_VISIBLE_DEVICES={gpu}"] if gpu is not None else []
            self.log(f"dry {name}: " + " ".join(env_words + [str(w) for w in argv]))
            return True
        self._move_aside(fresh)
        run_env = dict(os.environ, **(env or {}))
        if gpu is not None:
            run_env["CUDA_VISIBLE_DEVICES"] = str(gpu)
        self.log(f"start {name}")
        t0 = time.time()
        with open(self.path(name + ".log"), "w") as out:
            p = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=run_env, cwd=ROOT)
            try:
                rc = p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                rc = 124
        return self._end(name, rc, time.time() - t0)

    def _end(self, name: str, rc: int, seconds: float) -> bool:
        if rc == 0:
            open(self.path(name + ".done"), "w").close()
            self.log(f"done {name} {seconds:.0f}s")
            return True
        try:
            with open(self.path(name + ".log")) as f:
                tail = " ".join(f.read().splitlines()[-2:])[:300]
        except OSError:
            tail = ""
        self.log(f"FAIL {name} rc={rc} {seconds:.0f}s: {tail}")
        return False

    @staticmethod
    def parallel(*fns) -> list:
        """Run the functions side by side (each on its own GPU, say) and return their results in order."""
        out = [None] * len(fns)

        def one(i, fn):
            out[i] = fn()

        threads = [threading.Thread(target=one, args=(i, fn)) for i, fn in enumerate(fns)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return out

    def finish(self) -> int:
        """The job's last lines: the phases of this run that failed, then ALL DONE; 1 when some failed."""
        if self.dry:
            return 0
        with open(self.path("progress.txt")) as f:
            lines = this_run(f.read().splitlines())
        failed = sorted({ln.split()[2] for ln in lines if len(ln.split()) > 2 and ln.split()[1] == "FAIL"})
        if failed:
            self.log("failed phases: " + " ".join(failed))
        self.log("ALL DONE")
        return 1 if failed else 0


def python() -> str:
    """The interpreter the job's commands run under: this one."""
    return sys.executable
