"""A rank that opens the process group through r1.distributed.init, runs a few gloo collectives and leaves
without closing it itself: tests/test_clean_exit.py launches it under torchrun (how train.py and eval.py
leave, on every path, relying on init()'s exit hook)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from r1 import distributed  # noqa: E402

d = distributed.init("cpu")
for _ in range(20):
    distributed.gather_objects({"rank": d.rank, "row": list(range(100))}, d)
    distributed.all_sum(torch.ones(1000), d)
if sys.argv[1:] == ["fail"]:
    sys.exit(3)  # a run that fails with a status: the status is what torchrun reports, not an abort
