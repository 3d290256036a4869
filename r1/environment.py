"""The R1_* environment variables: which ones moved into the config, and the message for one still set.

A switch that changes what a run computes belongs in the config, so the run's config.yaml records it; the
variables that once switched code paths are the `kernels.*` keys now (MOVED). Those that stay change when or
where, not what: R1_PROFILE (profile one iteration, r1/profiler.py), R1_SWITCH_US (the interpreter's thread
switch interval, r1/overlap.py), R1_CACHE (where converted tokenizers are kept) and R1_TEST_TOKENIZER (tests).
Stdlib only: r1/model.py checks at import, so a script without a config never ignores a moved switch.
"""
import os

MOVED = {"R1_COMPILE": "kernels.compile", "R1_FUSE": "kernels.fuse", "R1_FUSE_TRAIN": "kernels.fuse_train",
         "R1_CHUNK_GRAPHS": "kernels.chunk_graphs", "R1_OVERLAP": "kernels.launch_ahead",
         "R1_MIX": "kernels.mixed_steps", "R1_SAMPLE": "kernels.sample", "R1_ATTN": "kernels.attention",
         "R1_DECODE": "kernels.decode", "R1_CHUNKS": "kernels.chunks", "R1_FA4": "kernels.fa4",
         "R1_FA4_CACHE": "kernels.fa4_cache", "R1_PAGED": "kernels.paged"}


def moved_switch() -> str:
    """The one-line error for the first moved switch still set ('' when none is; empty counts as unset)."""
    for name, key in MOVED.items():
        v = os.environ.get(name, "")
        if v:
            value = {"0": "false", "1": "true"}.get(v, v)
            return (f"environment variable {name} was removed: unset it and write {key}={value} "
                    f"(the run's config.yaml then records it)")
    return ""
