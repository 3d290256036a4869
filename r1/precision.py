"""One-device mixed precision as FSDP's: a bf16 copy of the weights computes, float32 master weights learn.

train.precision=bf16 (one GPU, or the CPU). Autocast, the default, keeps float32 weights in the forward:
every linear casts its weight and input to bf16 in every forward of every micro-batch, and the float32
residual stream doubles the bytes of every elementwise kernel (docs/decisions.md, "A bf16 copy").
Here, as FSDP2's `MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)` does on several GPUs, a bf16
copy runs the forward and backward; after each micro-batch's backward its gradients are added in float32
to the master's, the optimizer steps the float32 master, and the copy is refreshed from it (one cast per
optimizer step). Checkpoints, the export and the generator read the master, unchanged. The copy is made
by `copy.deepcopy` with the master's parameters replaced by bf16 ones in its memo, so tied weights stay
tied, wrappers (activation checkpointing) come along, and no second float32 model is held.
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

