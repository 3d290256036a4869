"""One-device mixed precision as FSDP's: a bf16 copy of the weights computes, float32 master weights learn.

train.precision=bf16 (one GPU, or the CPU). Autocast, the default on one
GPU, keeps the float32 weights in the forward: every linear casts its weight
and its float32 input to bf16 in every forward of every micro-batch, and its
backward casts the gradients back. In the profiled 135M update those casts
were a sixth of the GPU's time (docs/LOG.md, `aten::copy_`), and the
float32 residual stream doubles the bytes of every elementwise kernel.

Here, as FSDP2's `MixedPrecisionPolicy(param_dtype=bf16,
reduce_dtype=fp32)` does on several GPUs (r1/distributed.py), a copy of the
model in bf16 runs the forward and backward: the residual stream is bf16 and
nothing is cast per linear. After each micro-batch's backward the copy's
bf16 gradients are added to the master's float32 ones (a sum in float32,
as FSDP's reduce-scatter in float32 makes it), the optimizer steps the
float32 master weights, and the copy is refreshed from them (one cast of
every weight per optimizer step, not one per micro-batch). Checkpoints,
the export and the generator's refresh read the master, unchanged.

The copy is made by `copy.deepcopy` with the master's parameters replaced
by bf16 ones in its memo, so tied weights stay tied, wrappers (activation
checkpointing) come along, and no second float32 model is ever held.
"""
from __future__ import annotations

import copy

import torch


class Compute:
    """A copy of `master` whose parameters are `dtype`; `module` is what runs the forward and backward."""

    def __init__(self, master: torch.nn.Module, dtype: torch.dtype):
        self.master, self.dtype = master, dtype
        self.pairs = list(master.parameters())  # a tied weight once
        memo = {id(p): torch.nn.Parameter(p.detach().to(dtype, copy=True), requires_grad=p.requires_grad)
                for p in self.pairs}
        self.module = copy.deepcopy(master, memo)
        self.copies = [memo[id(p)] for p in self.pairs]

    def __call__(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @torch.no_grad()
    def refresh(self):
        """The copy's weights from the master's (after an optimizer step, or a checkpoint loaded)."""
        torch._foreach_copy_(self.copies, [p.detach() for p in self.pairs])

    @torch.no_grad()
    def fold_grads(self):
        """Add the copy's gradients, in float32, to the master's, and free them: after every backward."""
        for p, c in zip(self.pairs, self.copies):
            if c.grad is None:
                continue
            if p.grad is None:
                p.grad = c.grad.to(p.dtype)
            else:
                p.grad.add_(c.grad)
            c.grad = None

