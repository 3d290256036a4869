"""Count the aten ops and host reads (Tensor.item / Tensor.tolist) of one whole train.py run.

Why: a refactor that only moves code should leave the work the same. Running this at two
commits on the same config and comparing the JSON (op name -> count, reads) shows it
without a GPU: a GPU iteration's time is its kernels plus its host syncs, and both follow
from these counts. CPU profiler, so run it on a small config (configs/smoke.yaml).

    python bench/op_count.py OUT.json --config configs/smoke.yaml run.dir=/tmp/oc [key=value ...]
"""
import collections
import json
import os
import runpy
import sys

import torch
from torch.profiler import ProfilerActivity, profile


def main():
    if len(sys.argv) < 2 or sys.argv[1].startswith("-"):
        sys.exit(__doc__.strip().splitlines()[-1].strip())
    out, args = sys.argv[1], sys.argv[2:]
    reads = collections.Counter()
    for name in ("item", "tolist"):
        orig = getattr(torch.Tensor, name)

        def counted(self, *a, _orig=orig, _name=name, **k):
            reads[_name] += 1
            return _orig(self, *a, **k)
        setattr(torch.Tensor, name, counted)
    root = os.getcwd()
    sys.path.insert(0, root)
    sys.argv = ["train.py"] + args
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        try:
            runpy.run_path(os.path.join(root, "train.py"), run_name="__main__")
        except SystemExit as e:
            if e.code not in (0, None):
                raise
    ops = {e.key: e.count for e in prof.key_averages() if e.key.startswith("aten::")}
    with open(out, "w") as f:
        json.dump({"reads": dict(reads), "ops_total": sum(ops.values()), "ops": ops}, f, indent=0, sort_keys=True)
    print(json.dumps({"reads": dict(reads), "ops_total": sum(ops.values()), "kinds": len(ops)}))


if __name__ == "__main__":
    main()
