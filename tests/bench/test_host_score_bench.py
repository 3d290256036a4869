"""bench/host_score.py on a few episodes: both lanes run, their micro-batches are the same, and a lane that
builds different ones stops the benchmark."""
import dataclasses
from pathlib import Path

import pytest

from bench import host_score

CONFIG = str(Path(__file__).resolve().parents[2] / "configs" / "gsm8k_tool.yaml")


def test_host_score_lanes_agree_and_are_timed():
    r = host_score.main(["--config", CONFIG, "--episodes", "16", "--repeats", "1"])
    assert r["episodes"] == 16 and r["tokens"] > 16 * 300
    assert r["total_s"] > 0 and r["lists_total_s"] > 0 and r["plan_s"] > 0


def test_host_score_refuses_lanes_that_differ(monkeypatch):
    real = host_score.list_collate

    def off_by_one(seqs, trajs, order, device, share=False):
        mb = real(seqs, trajs, order, device, share)
        return dataclasses.replace(mb, position_ids=mb.position_ids + 1)

    monkeypatch.setattr(host_score, "list_collate", off_by_one)
    with pytest.raises(SystemExit, match="different micro-batches"):
        host_score.main(["--config", CONFIG, "--episodes", "8", "--repeats", "1"])


def test_host_score_refuses_zero_repeats():
    with pytest.raises(SystemExit, match="error: --repeats must be at least 1"):
        host_score.main(["--config", CONFIG, "--repeats", "0"])


@pytest.mark.parametrize("args,says", [(["--episodes", "-3"], "--episodes must be at least 1"),
                                       (["--config", "configs/nope.yaml"], "config file not found: configs/nope.yaml")])
def test_host_score_refuses_bad_arguments_in_one_line(args, says):
    with pytest.raises(SystemExit, match=says) as e:
        host_score.main((["--config", CONFIG] if "--config" not in args else []) + args)
    assert str(e.value.code).startswith("error: ") and "\n" not in str(e.value.code)
