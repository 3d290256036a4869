"""bench/recipe_rule.py, issue 29's rule chosen in advance: the reads after half a run's RL time, by time and
not by iteration; recipe3's own reads give the 14.5% the rule was written with; a run it cannot judge is an
error naming the file."""
import json
from pathlib import Path

import pytest

from bench import recipe_rule

RECIPE3 = Path(__file__).resolve().parents[2] / "docs" / "results" / "recipe3"


def write_run(path, reads, seconds_per_iter, iters):
    """A run's metrics.jsonl: the read before RL, then `iters` iterations, a read at each key of `reads`."""
    path.mkdir()
    lines = [{"iter": 0, "eval_accuracy": 0.1}]
    for it in range(1, iters + 1):
        m = {"iter": it, "time_elapsed": it * seconds_per_iter}
        if it in reads:
            m["eval_accuracy"] = reads[it]
        lines.append(m)
    (path / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    return str(path)


def test_recipe3_against_itself_gives_the_rules_number():
    r = recipe_rule.main([str(RECIPE3), str(RECIPE3)])
    assert [x[0] for x in r["recipe"]["reads"]] == [200, 250, 300, 350]  # iterations 200-350 of 372
    assert r["recipe"]["mean"] == pytest.approx(0.145) and r["candidate_wins"]


def test_the_second_half_is_by_time_not_iterations(tmp_path):
    """A candidate twice as fast runs twice the iterations: its reads after its iteration 100 of 200 (half its
    time) count, and the recipe's after its 50 of 100; a read at half the time exactly does not."""
    fast = write_run(tmp_path / "fast", {50: 0.9, 100: 0.9, 150: 0.2, 200: 0.2}, 1.0, 200)
    slow = write_run(tmp_path / "slow", {50: 0.9, 100: 0.3}, 2.0, 100)
    r = recipe_rule.main([fast, slow, "--save", str(tmp_path / "rule.json")])
    assert [x[0] for x in r["candidate"]["reads"]] == [150, 200] and r["candidate"]["mean"] == pytest.approx(0.2)
    assert [x[0] for x in r["recipe"]["reads"]] == [100] and not r["candidate_wins"]
    assert json.loads((tmp_path / "rule.json").read_text()) == json.loads(json.dumps(r))


def test_a_run_it_cannot_judge_is_an_error_naming_the_file(tmp_path):
    none = write_run(tmp_path / "none", {}, 1.0, 10)
    with pytest.raises(SystemExit, match=r"none/metrics.jsonl: no held-out read .* eval.every > 0"):
        recipe_rule.main([none, str(RECIPE3)])
    with pytest.raises(SystemExit, match=r"missing/metrics.jsonl: No such file"):
        recipe_rule.main([str(tmp_path / "missing"), str(RECIPE3)])
    (tmp_path / "list").mkdir()
    (tmp_path / "list" / "metrics.jsonl").write_text('{"iter": 0}\n[1, 2]\n')
    with pytest.raises(SystemExit, match=r"list/metrics.jsonl: line 2 is not a JSON object"):
        recipe_rule.main([str(tmp_path / "list"), str(RECIPE3)])


def test_runs_that_read_different_things_are_refused(tmp_path):
    """A quickstart run (12 synthetic problems a read) once came out the winner against recipe3 (500 of
    GSM8K-tool's validation split): a different task or number of problems a read is an error naming both."""
    other = write_run(tmp_path / "quick", {2: 0.8, 3: 0.8}, 1.0, 3)
    lines = [json.loads(ln) for ln in Path(other, "metrics.jsonl").read_text().splitlines()]
    Path(other, "metrics.jsonl").write_text("".join(json.dumps(dict(m, eval_n=12) if "eval_accuracy" in m else m)
                                                    + "\n" for m in lines))
    with pytest.raises(SystemExit, match=r"quick and .*recipe3 read different things \(problems a read: 12 against 500"):
        recipe_rule.main([other, str(RECIPE3)])
    Path(other, "config.yaml").write_text("data:\n  task: calc\n")
    with pytest.raises(SystemExit, match=r"\(task: calc against gsm8k_tool\)"):
        recipe_rule.main([other, str(RECIPE3)])
    Path(other, "config.yaml").write_text("data: [\n")
    with pytest.raises(SystemExit, match=r"quick/config.yaml: not YAML"):
        recipe_rule.main([other, str(RECIPE3)])
