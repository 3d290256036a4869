"""Runs a list of configs, one training run each, under torchrun (world 2) or plain python (world 1).

Used by tests/test_two_ranks.py: one process group serves every config, so the
comparison of many estimator / aggregation settings pays the torchrun
start-up once. Rewards are rewritten by group parity so that the two ranks
of a world-2 run see different batches: at world 2, rank r plays the global
prompts r, r + 2, ..., so rank 0's groups (even) all succeed and rank 1's
(odd) score 0.5 on their first sample and 0 on the others. A per-rank batch
statistic (whitening, reward moments) then differs from the global one.

    python tests/two_ranks_worker.py SPEC.json      (SPEC: {"out": dir, "base": [...], "runs": {name: [...]}})
"""
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from r1.config import load_config  # noqa: E402
from r1.trainer import Trainer  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMOKE = os.path.join(ROOT, "configs", "smoke.yaml")


def parity_rewards(trajs):
    for t in trajs:
        if t.steps:
            first = t.uid.endswith("-0")
            t.steps[-1].reward = 1.0 if t.group % 2 == 0 else (0.5 if first else 0.0)
    return trajs


def main(spec_path):
    with open(spec_path) as f:
        spec = json.load(f)
    real_rollout = Trainer.rollout

    def rollout(self, it):  # every train.overlap
        got = real_rollout(self, it)
        parity_rewards(got.trajectories)
        return got
    Trainer.rollout = rollout
    for name, overrides in spec["runs"].items():
        cfg = load_config(SMOKE, spec["base"] + overrides + [f"run.dir={os.path.join(spec['out'], name)}"])
        Trainer(cfg).fit()
        if int(os.environ.get("RANK", "0")) == 0:  # the test reads metrics only: 14 runs' weights were 1.2 GB of /tmp
            for sub in ("checkpoints", "hf"):
                shutil.rmtree(os.path.join(cfg.run.dir, sub), ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1])
