"""Metrics out: one JSON line per iteration, tensorboard scalars, a progress bar.

Only rank 0 writes. metrics.jsonl is appended and flushed every iteration
so a crash loses at most the iteration in flight; on resume, lines of
iterations after the checkpoint are dropped so the file matches the run.
"""
import json
import math
import os

try:
    from tqdm import tqdm
except ImportError:  # pragma: no cover
    tqdm = None


class Logger:
    def __init__(self, run_dir: str, enabled: bool, tensorboard: bool, progress: bool, total: int, start: int = 0):
        self.enabled = enabled
        self.path = os.path.join(run_dir, "metrics.jsonl")
        self.tb = self.bar = None
        if not enabled:
            return
        if start > 0 and os.path.exists(self.path):  # keep the lines of iterations the checkpoint covers
            with open(self.path) as f:
                keep = [ln for ln in f if ln.strip() and json.loads(ln).get("iter", 0) <= start]
            with open(self.path + ".tmp", "w") as f:
                f.writelines(keep)
            os.replace(self.path + ".tmp", self.path)
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(os.path.join(run_dir, "tb"), purge_step=start + 1 if start else None)
        if progress and tqdm is not None:
            self.bar = tqdm(total=total, initial=start, desc="iter", dynamic_ncols=True)

    def log(self, it: int, metrics: dict):
        if not self.enabled:
            return
        clean = {k: (float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v) for k, v in metrics.items()}
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in clean.items()}
        with open(self.path, "a") as f:
            f.write(json.dumps({"iter": it, **clean}) + "\n")
        if self.tb is not None:
            for k, v in clean.items():
                if isinstance(v, float):
                    self.tb.add_scalar(k, v, it)
            self.tb.flush()
        if self.bar is not None:
            self.bar.update(1)
            short = {k: clean[k] for k in ("reward_mean", "accuracy", "loss") if isinstance(clean.get(k), float)}
            self.bar.set_postfix({k: f"{v:.3f}" for k, v in short.items()})

    def close(self):
        if self.bar is not None:
            self.bar.close()
        if self.tb is not None:
            self.tb.close()
