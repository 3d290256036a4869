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


class _Clock:
    """A clock the fake actor moves: the bench's sleeps and plays take fake seconds, none real."""
    def __init__(self):
        self.now = 0.0

    def time(self):
        return self.now

    perf_counter = time

    def sleep(self, s):
        self.now += s


def test_the_sleep_follows_a_warm_play_not_the_first(monkeypatch, capsys):
    """The first play captures the CUDA graphs: 23.7 s on an H100 against 2.2 s for the next, and a sleep of
    half the first made the run update-bound (2026-12-05). A fake actor whose first play takes 10 fake seconds
    and the others 1: the sleep is half of 1."""
    clock = _Clock()

    class Handle:
        idle_seconds, seconds = 0.0, 1.0

        def wait(self):
            pass

        def result(self):
            clock.now += 1.0
            return []

    class Actor:
        def __init__(self, *args):
            self.plays = 0

        def play(self, rows, n, sampling, uid_prefix):
            self.plays += 1
            clock.now += 10.0 if self.plays == 1 else 1.0
            return [{"ids": list(range(8))}] * len(rows) * n

        def refresh(self, policy):
            pass

        def start(self, *args, **kwargs):
            return Handle()

        def close(self):
            pass

    monkeypatch.setattr(handover, "time", clock)
    monkeypatch.setattr(handover, "RemoteActor", Actor)
    r = handover.main(["--plays", "2", "--rounds", "1", "rollout.prompts=2", "rollout.n=2", "rollout.slots=4"])
    assert r["warmup_plays"] == 3 and r["warmup_s"] == 12.0  # the first play 10 s, the next two 1 s each
    assert r["play_s"] == 1.0 and r["update_s"] == 0.5
    assert r["ahead"]["play_s"] == r["after"]["play_s"] == 1.0 and r["rollout_bound"]
    assert "update-bound" not in capsys.readouterr().err
    r = handover.main(["--plays", "2", "--rounds", "1", "--update", "2", "rollout.prompts=2", "rollout.n=2",
                       "rollout.slots=4"])
    assert r["update_s"] == 2.0 and not r["rollout_bound"]  # a sleep longer than the plays: update-bound
    assert "warning: update-bound (the sleep, 2.000 s, outlasted the plays)" in capsys.readouterr().err
