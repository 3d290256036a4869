"""bench/handover.py on the CPU: both orders of asking for the next play run through the same RemoteActor,
each reports the rollout process's time between plays and the period, and the saved line is the printed one."""
import json

import pytest

from bench import handover


def test_handover_bench_measures_both_orders(tmp_path):
    out = tmp_path / "handover.jsonl"
    r = handover.main(["--plays", "3", "--rounds", "1", "--save", str(out), "rollout.prompts=2", "rollout.n=2",
                       "rollout.max_new_tokens=4", "rollout.slots=4", "env.max_context=512"])
    assert r["name"] == "handover" and r["episodes"] == 4 and r["plays_per_order"] == 3
    for order in ("after", "ahead"):
        assert r[order]["idle_s"] >= 0 and r[order]["idle_max_s"] >= r[order]["idle_s"] and r[order]["period_s"] > 0
    assert r["reply_mb"] > 0 and r["dumps_s"] > 0 and r["loads_s"] > 0 and r["refresh_s"] > 0
    assert json.loads(out.read_text()) == r


def test_auto_slots_are_the_plans_rows():
    """The configs say rollout.slots: auto (0 once loaded); the bench once handed 0 slots to the generator and
    stopped on the H200 (2026-12-05)."""
    r = handover.main(["--plays", "2", "--rounds", "1", "rollout.prompts=2", "rollout.n=2", "rollout.max_new_tokens=4",
                       "rollout.slots=auto", "env.max_context=512"])
    assert r["episodes"] == 4 and r["ahead"]["period_s"] > 0


def test_a_misspelled_key_is_one_line():
    with pytest.raises(SystemExit, match=r"^error: unknown config key 'rollout.promts'"):
        handover.main(["rollout.promts=2"])
