"""bench/agent_rollout.py on the CPU: a tiny random model through the benchmark's whole code path.

Checks what the GPU numbers rest on: every replayed episode comes out of the real
loop exactly as forced (same turns, same response ids), the breakdown has every
part, and the sampler's logprobs of the forced tokens match the trainer's forward
(fp32: the gap is rounding).
"""
from pathlib import Path

import pytest

from bench import agent_rollout

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "data" / "gsm8k" if (ROOT / "data" / "gsm8k").exists() else None  # shipped with the project


@pytest.mark.skipif(DATA is None, reason="GSM8K data not found (data/gsm8k)")
def test_agent_rollout_bench_replays_exactly_on_cpu():
    import torch

    threads = torch.get_num_threads()  # the bench sets 1 thread on the CPU; later tests compare runs made at 2
    try:
        r = agent_rollout.main(["--episodes", "3", "--slots", "2", "--gap", "--data", str(DATA)])
    finally:
        torch.set_num_threads(threads)
    assert r["replayed_exactly"] == "3/3"
    assert r["mean_turns"] > 1 and r["response_tokens"] == round(r["mean_response_tokens"] * 3)
    assert r["agent_tok_s"] > 0 and r["single_turn_tok_s"] > 0 and r["ratio"] > 0
    parts = {"decode", "first_prompt_prefill", "continuation_prefill", "admit_other", "env_main", "env_wait",
             "env_steps", "host_loop"}
    assert parts <= set(r["breakdown"]) and all(r["breakdown"][k] >= 0 for k in parts - {"host_loop"})
    assert r["breakdown"]["continuation_prefill"] > 0 and r["breakdown"]["env_steps"] > 0
    assert r["logprob_gap_tokens"] == r["response_tokens"] and r["logprob_gap_max"] < 1e-3
