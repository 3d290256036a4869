"""bench/learning_result.py copies eval.py's numbers into the issue's JSON and refuses files that do not fit."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "bench", "learning_result.py")


def _eval(path, acc, n=1319):
    path.write_text("memory plan ...\n" + json.dumps({"n": n, "accuracy": acc, "mean_turns": 3.0, "split": "test"}) + "\n")
    return str(path)


def _run(tmp_path, sft, test):
    out = tmp_path / "res" / "learning.json"
    p = subprocess.run([sys.executable, SCRIPT, "--run", "runs/r", "--sft-eval", sft, "--test-eval", test,
                        "--wall", "1712.34", "--config", "configs/gsm8k_tool.yaml", "--save", str(out)],
                       capture_output=True, text=True)
    return p, out


def test_writes_the_issue_fields_from_the_eval_files(tmp_path):
    p, out = _run(tmp_path, _eval(tmp_path / "s.json", 0.0705), _eval(tmp_path / "t.json", 0.1213))
    assert p.returncode == 0, p.stderr
    res = json.loads(out.read_text())
    assert res == json.loads(p.stdout)
    assert (res["name"], res["task"], res["n"]) == ("learning", "gsm8k_tool", 1319)
    assert (res["sft_accuracy"], res["test_accuracy"], res["wall_s"]) == (0.0705, 0.1213, 1712.3)
    assert res["config"] == "configs/gsm8k_tool.yaml" and res["model"] and res["date"]
    assert res["device"] == "not recorded"  # no --device given: said, not guessed


def test_the_device_is_recorded(tmp_path):
    """A run meant for an H200 was lent an H100 (docs/results/recipe4): the JSON says which GPU it ran on."""
    out = tmp_path / "learning.json"
    p = subprocess.run([sys.executable, SCRIPT, "--run", "runs/r", "--sft-eval", _eval(tmp_path / "s.json", 0.08),
                        "--test-eval", _eval(tmp_path / "t.json", 0.14), "--wall", "1423", "--config", "c.yaml",
                        "--device", "NVIDIA H100 80GB HBM3", "--save", str(out)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert json.loads(out.read_text())["device"] == "NVIDIA H100 80GB HBM3"


def test_a_dry_run_on_the_tiny_model_is_labelled_so(tmp_path):
    """The run's config.yaml names the model: a CPU dry run (model.path=tiny) is not reported as SmolLM2."""
    run = tmp_path / "recipe"
    (run / "sft").mkdir(parents=True)  # as train.py leaves it: RL's config names the SFT export, SFT's the model
    (run / "config.yaml").write_text(f"model:\n  path: {run}/sft/hf\ndata:\n  task: gsm8k_tool\n")
    (run / "sft" / "config.yaml").write_text("model:\n  path: tiny\ndata:\n  task: gsm8k_tool\n")
    p = subprocess.run([sys.executable, SCRIPT, "--run", str(run), "--sft-eval", _eval(tmp_path / "s.json", 0.0),
                        "--test-eval", _eval(tmp_path / "t.json", 0.0), "--wall", "46", "--config", "c.yaml"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["model"] == "tiny (random weights)"


def test_refuses_evaluations_of_different_sizes_and_non_results(tmp_path):
    p, out = _run(tmp_path, _eval(tmp_path / "s.json", 0.07, n=500), _eval(tmp_path / "t.json", 0.12))
    assert p.returncode != 0 and "500 and 1319" in p.stderr and not out.exists()
    val = tmp_path / "v.json"
    val.write_text(json.dumps({"n": 1319, "accuracy": 0.2, "split": "val"}) + "\n")
    p, out = _run(tmp_path, _eval(tmp_path / "s.json", 0.07), str(val))
    assert p.returncode != 0 and "split 'val', not test" in p.stderr and not out.exists()
    (tmp_path / "bad.json").write_text("Traceback ...\n")
    p, out = _run(tmp_path, str(tmp_path / "bad.json"), _eval(tmp_path / "t.json", 0.12))
    assert p.returncode != 0 and "bad.json" in p.stderr and not out.exists()


def test_reads_eval_json_as_eval_py_writes_it_and_refuses_in_one_line(tmp_path):
    """eval.out/eval.json (indented, many lines) is read as the log's last line is; a missing file, or an
    eval.json without its split (written before eval.py recorded it), is one line, no traceback."""
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "eval.json").write_text(json.dumps({"n": 1319, "accuracy": 0.1213, "split": "test"}, indent=1))
    p, out = _run(tmp_path, _eval(tmp_path / "s.json", 0.07), str(tmp_path / "e" / "eval.json"))
    assert p.returncode == 0, p.stderr
    assert json.loads(out.read_text())["test_accuracy"] == 0.1213
    p, out = _run(tmp_path, str(tmp_path / "nope.json"), _eval(tmp_path / "t.json", 0.12))
    assert p.returncode != 0 and p.stderr.strip() == f"error: {tmp_path / 'nope.json'}: No such file or directory"
    (tmp_path / "old.json").write_text(json.dumps({"n": 1319, "accuracy": 0.1}, indent=1))
    p, out = _run(tmp_path, str(tmp_path / "old.json"), _eval(tmp_path / "t.json", 0.12))
    assert p.returncode != 0 and "old.json: no split" in p.stderr and "Traceback" not in p.stderr


def test_ablation_table_leaves_out_the_sft_run_and_reads_partial_lines(tmp_path, capsys):
    """The lora-pair job (bench/device.py) puts its SFT run beside the lanes: not a lane. A lane cut off mid-line keeps its
    whole lines (a warning); a bad line elsewhere is one error naming file:line."""
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import ablation_table

    for name in ("recipe", "sft"):
        (tmp_path / name).mkdir()
    (tmp_path / "sft" / "metrics.jsonl").write_text(json.dumps({"iter": 1, "sft_loss": 1.0}) + "\n")
    (tmp_path / "recipe" / "metrics.jsonl").write_text(
        "".join(json.dumps({"iter": i, "reward_mean": 0.1}) + "\n" for i in (1, 2)) + '{"iter": 3, "rew')
    table = ablation_table.rows(str(tmp_path))
    assert [(r["name"], r["iterations"]) for r in table] == [("recipe", 2)]
    assert "partial last line" in capsys.readouterr().err
    (tmp_path / "recipe" / "metrics.jsonl").write_text('{"iter": 1}\nnot json\n{"iter": 2}\n')
    with pytest.raises(SystemExit, match=r"recipe/metrics.jsonl:2: not a JSON line"):
        ablation_table.rows(str(tmp_path))


def test_ablation_table_reads_the_lanes_files(tmp_path):
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import ablation_table

    for name, acc in (("recipe", 0.12), ("grpo", 0.1)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.jsonl").write_text(
            "".join(json.dumps({"iter": i, "reward_mean": 0.1, "entropy": 0.3 - i / 100}) + "\n" for i in (1, 2)))
        (tmp_path / f"val-{name}.json").write_text(json.dumps({"n": 500, "accuracy": acc}) + "\n")
        (tmp_path / f"test-{name}.json").write_text(json.dumps({"n": 1319, "accuracy": 0.5}) + "\n")  # never read
    (tmp_path / "compare.jsonl").write_text(json.dumps({"ablation": "grpo", "vs_recipe": {
        "delta_points": -2.0, "gained": 10, "lost": 36, "p": 0.0001}}) + "\n")
    table = ablation_table.rows(str(tmp_path))
    assert [r["name"] for r in table] == ["recipe", "grpo"] and table[1]["iterations"] == 2
    text = ablation_table.markdown(table)
    assert "validation accuracy" in text and "test" not in text
    assert "| recipe | 2 | 12.00% of 500 |  | 0.280 |" in text
    assert "| grpo | 2 | 10.00% of 500 | -2.00 (10 / 36, p = 0.0001) | 0.280 |" in text
    assert ablation_table.lane_cost(str(tmp_path)) == ""  # no solo run: nothing claimed
    (tmp_path / "solo" / "recipe").mkdir(parents=True)
    (tmp_path / "solo" / "recipe" / "metrics.jsonl").write_text(  # alone: 2 s an iteration, then 9 s after the lane's last
        "".join(json.dumps({"iter": i, "reward_mean": 0.1, "time_rollout": 1.0, "time_score": 0.5,
                            "time_train": 0.5 if i < 4 else 7.5}) + "\n" for i in (1, 2, 3, 4)))
    assert ablation_table.lane_cost(str(tmp_path)) == ""  # the lane logged no phase times: nothing to set against
    for name in ("recipe", "grpo"):  # the lanes beside each other: 8 s an iteration (iteration 1, with captures, 60 s)
        (tmp_path / name / "metrics.jsonl").write_text("".join(json.dumps(
            {"iter": i, "reward_mean": 0.1, "entropy": 0.28, "time_rollout": 4.0 if i > 1 else 54.0,
             "time_score": 2.0, "time_train": 2.0}) + "\n" for i in (1, 2)))
    cost = ablation_table.lane_cost(str(tmp_path))
    assert "8.00 s an iteration beside the others and 2.00 s alone" in cost and "iterations 2..2" in cost
    assert "0.25 of its speed alone" in cost
    other = tmp_path / "solo" / "elsewhere"  # --solo: a solo run made in another session
    other.mkdir()
    (other / "metrics.jsonl").write_text("".join(json.dumps(
        {"iter": i, "reward_mean": 0.1, "time_rollout": 2.0, "time_score": 1.0, "time_train": 1.0}) + "\n"
        for i in (1, 2, 3)))
    assert "4.00 s alone" in ablation_table.lane_cost(str(tmp_path), str(other)) and "0.50 of" in \
        ablation_table.lane_cost(str(tmp_path), str(other))
    assert [r["name"] for r in ablation_table.rows(str(tmp_path))] == ["recipe", "grpo"]
    with pytest.raises(SystemExit, match="missing is not a folder"):
        ablation_table.main([str(tmp_path / "missing")])
    # the final recipes read once on test: apart from the table, paired with the first named
    (tmp_path / "test-compare.jsonl").write_text(json.dumps({"test": "grpo", "baseline": "recipe", "result": {
        "delta_points": 1.5, "gained": 40, "lost": 20, "p": 0.01}}) + "\n")
    assert ablation_table.test_lines(str(tmp_path)) == [
        "grpo: 50.00% of 1319 test problems, +1.50 points against recipe (40 gained / 20 lost, p = 0.01)",
        "recipe: 50.00% of 1319 test problems"]
    # as a user runs it, from the repository root, curves included (r1.plot must import from bench/)
    pytest.importorskip("matplotlib")
    out = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "ablation_table.py"), str(tmp_path),
                          "--png-prefix", str(tmp_path / "abl")], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "| recipe |" in out.stdout and "Lane cost" in out.stdout
    assert all((tmp_path / f"abl_{k}.png").stat().st_size > 0 for k in ("reward", "entropy"))
    assert not (tmp_path / "abl_val.png").exists() and "no " in out.stderr and "eval_accuracy" in out.stderr
    bad = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "ablation_table.py"), str(tmp_path),
                          "--solo", str(tmp_path / "no-run")], capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode != 0 and "--solo" in bad.stderr and "no metrics.jsonl" in bad.stderr
    assert "Traceback" not in bad.stderr
    norecipe = tmp_path / "norecipe" / "sft"  # lanes, but none named recipe (a recipe run's own folder, say)
    norecipe.mkdir(parents=True)
    (norecipe / "metrics.jsonl").write_text(json.dumps({"iter": 1, "reward_mean": 0.1}) + "\n")
    with pytest.raises(SystemExit, match="has no recipe lane"):
        ablation_table.main([str(norecipe.parent)])


def test_ablation_table_of_several_sets_compares_each_lane_with_its_own_recipe(tmp_path, capsys):
    """Sets from different sessions (each its own SFT policy and recipe lane) in one table with a set column;
    a lane's comparison is its own set's; --solo is for one set; two folders of one name are refused."""
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import ablation_table

    for s, lanes in (("s1", {"recipe": 0.12, "grpo": 0.10}), ("s2", {"recipe": 0.11, "cispo": 0.13})):
        for name, acc in lanes.items():
            (tmp_path / s / name).mkdir(parents=True)
            (tmp_path / s / name / "metrics.jsonl").write_text(json.dumps({"iter": 1, "reward_mean": 0.1}) + "\n")
            (tmp_path / s / f"val-{name}.json").write_text(json.dumps({"n": 500, "accuracy": acc}) + "\n")
        other = next(n for n in lanes if n != "recipe")
        (tmp_path / s / "compare.jsonl").write_text(json.dumps({"ablation": other, "vs_recipe": {
            "delta_points": 100 * (lanes[other] - lanes["recipe"]), "gained": 7, "lost": 3, "p": 0.2}}) + "\n")
    ablation_table.main([str(tmp_path / "s1"), str(tmp_path / "s2")])
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "| set | lane | iterations | validation accuracy | vs recipe (gained / lost, p) | entropy, last |"
    assert out[1].startswith("| --- | --- |") and out[1].count("---") == 6
    assert out[2:] == ["| s1 | recipe | 1 | 12.00% of 500 |  |  |", "| s1 | grpo | 1 | 10.00% of 500 | -2.00 (7 / 3, p = 0.2) |  |",
                       "| s2 | recipe | 1 | 11.00% of 500 |  |  |", "| s2 | cispo | 1 | 13.00% of 500 | +2.00 (7 / 3, p = 0.2) |  |"]
    with pytest.raises(SystemExit, match="--solo goes with one RESULTS_DIR"):
        ablation_table.main([str(tmp_path / "s1"), str(tmp_path / "s2"), "--solo", str(tmp_path / "s1" / "recipe")])
    (tmp_path / "x" / "s1").mkdir(parents=True)
    with pytest.raises(SystemExit, match="two results folders share a name"):
        ablation_table.main([str(tmp_path / "s1"), str(tmp_path / "x" / "s1")])
    with pytest.raises(SystemExit, match="no lanes .* in .*s9|s9 is not a folder"):
        ablation_table.main([str(tmp_path / "s1"), str(tmp_path / "s9")])
