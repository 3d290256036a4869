"""A rank that opens the process group through r1.distributed.init, shards a small model with FSDP2 (whose
state keeps the group object alive after it is destroyed), trains it a few steps beside a few gloo
collectives, and ends through r1.exits.run_main as train.py and eval.py do: tests/test_clean_exit.py
launches it under torchrun. `fail`: the rank exits with status 3; `raise`: it raises."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from r1 import distributed  # noqa: E402
from r1.exits import run_main  # noqa: E402


def main():
    from torch.distributed.fsdp import fully_shard

    d = distributed.init("cpu")
    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(4)])
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters())
    for _ in range(10):
        model(torch.randn(16, 64)).sum().backward()
        opt.step()
        opt.zero_grad()
        distributed.gather_objects({"rank": d.rank, "row": list(range(100))}, d)
        distributed.all_sum(torch.ones(1000), d)
    distributed.full_state_dict(model)
    if sys.argv[1:] == ["fail"]:
        sys.exit(3)  # a run that fails with a status: the status is what torchrun reports, not an abort
    if sys.argv[1:] == ["raise"]:
        raise RuntimeError("a rank's own error")
    print(f"rank {d.rank} done", flush=True)


run_main(main)
