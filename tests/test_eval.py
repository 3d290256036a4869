"""Evaluation: eval.py end to end, and the batch metrics and pass@k against hand counts.

`summarize` is what both eval.py and the trainer's metrics.jsonl report, so
its numbers are checked against a hand-written set of trajectories whose
counts are worked out in the comments; pass@k against exact fractions and
a brute-force enumeration of subsets.
"""
import importlib
import itertools
import json
import math
import os

import pytest

from r1.evaluate import pass_at_k, summarize
from r1.rollout_stats import traj_stats as _traj_stats
from r1.trajectory import Step, Trajectory, load as load_trajs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMOKE = os.path.join(ROOT, "configs", "smoke.yaml")
eval_py = importlib.import_module("eval")  # the entry point (a module named like the builtin)


def test_eval_py_prints_final_json(tmp_path, capsys):
    out = str(tmp_path / "eval")
    eval_py.main(["--config", SMOKE, "eval.limit=4", f"eval.out={out}", "rollout.max_new_tokens=8"])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    res = json.loads(last)
    assert res["n"] == 4 and res["task"] == "synthetic" and res["model"] == "tiny" and res["split"] == "test"
    for k in ("accuracy", "mean_turns", "mean_tool_calls", "malformed_rate", "mean_response_len"):
        assert isinstance(res[k], float), k
    # the printed numbers are those of the saved greedy trajectories
    trajs = load_trajs(os.path.join(out, "eval_trajectories.jsonl.gz"))
    assert len(trajs) == 4
    assert res["mean_turns"] == sum(len(t.steps) for t in trajs) / 4
    assert res["mean_tool_calls"] == sum(t.num_tool_calls for t in trajs) / 4
    assert res["mean_response_len"] == sum(len(s.response_ids) for t in trajs for s in t.steps) / 4
    assert all(len(s.response_ids) <= 8 for t in trajs for s in t.steps)
    with open(os.path.join(out, "eval.json")) as f:
        saved = json.load(f)
    assert saved == res  # the printed line's object, model, task and split included
    # no trainer, no run-folder layout: the results and the resolved config, nothing else
    assert sorted(os.listdir(out)) == ["config.yaml", "eval.json", "eval_trajectories.jsonl.gz"]
    # a second evaluation into the same folder is refused and overwrites nothing
    before = sorted(os.listdir(out))
    with pytest.raises(SystemExit) as e:
        eval_py.main(["--config", SMOKE, "eval.limit=4", f"eval.out={out}"])
    assert str(e.value.code).startswith("error:") and sorted(os.listdir(out)) == before
    afile = tmp_path / "afile"
    afile.write_text("keep me")
    with pytest.raises(SystemExit, match="^error: eval.out .*afile exists and is not a folder"):
        eval_py.main(["--config", SMOKE, "eval.limit=4", f"eval.out={afile}"])
    assert afile.read_text() == "keep me"


def test_a_limit_past_the_split_says_how_many_it_reads(tmp_path, capsys):
    """The quickstart's `next:` hint asks for 100 of a 12-problem split: eval.py read 12 and said nothing."""
    eval_py.main(["--config", SMOKE, "eval.limit=100", f"eval.out={tmp_path / 'e'}", "rollout.max_new_tokens=4"])
    out = capsys.readouterr().out
    assert "eval.limit=100: the test split has 8 problems; reading all 8" in out
    assert json.loads(out.strip().splitlines()[-1])["n"] == 8


def test_periodic_evaluation_is_handed_to_the_trainer_and_matches_eval_py(tmp_path, capsys):
    """eval.every: train.py hands the trainer r1/evaluate.py's evaluation (the trainer does not import it);
    it logs eval_* at iteration 0 (the starting policy) and after every eval.every-th iteration. The
    starting policy's numbers are eval.py's on the same model: both play through an actor, greedy."""
    import train
    from r1.config import load_config

    run, out = str(tmp_path / "run"), str(tmp_path / "eval")
    tiny = ["rollout.prompts=2", "rollout.n=2", "rollout.max_new_tokens=8", "data.train_size=16", "data.test_size=4",
            "log.tensorboard=false", "eval.limit=4"]
    train.main(["--config", SMOKE, *tiny, f"run.dir={run}", "eval.every=2", "train.steps=2"])
    with open(os.path.join(run, "metrics.jsonl")) as f:
        lines = [json.loads(x) for x in f]
    assert [m["iter"] for m in lines] == [0, 1, 2]
    assert [("eval_accuracy" in m) for m in lines] == [True, False, True]
    assert lines[0]["eval_n"] == lines[2]["eval_n"] == 4
    assert not os.path.exists(os.path.join(run, "eval.json"))  # periodic evaluation writes no files
    capsys.readouterr()
    eval_py.main(["--config", SMOKE, *tiny, f"eval.out={out}"])
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for k in ("accuracy", "mean_turns", "mean_tool_calls", "mean_response_len", "reward_mean"):
        assert lines[0][f"eval_{k}"] == res[k], k
    assert load_config(os.path.join(out, "config.yaml")).train.steps == 0


def step(n_tokens, reward=0.0, final=False, tool_calls=0, errors=()):
    return Step([1, 2], [5] * n_tokens, [0.0] * n_tokens, reward=reward,
                info={"final": final, "tool_calls": tool_calls, "errors": list(errors)})


HAND = [
    # one calculator call, then a correct answer: reward 1, 2 turns, 1 call, 30 tokens
    Trajectory("a", 0, "0", [step(20, tool_calls=1), step(10, 1.0, final=True)], "answered"),
    # two calls (one malformed), then out of steps: reward 0, 3 turns, 2 calls, 1 malformed step, 50 tokens
    Trajectory("b", 1, "1", [step(20, tool_calls=1), step(20, tool_calls=1, errors=["bad_json"]), step(10)],
               "max_steps"),
    # a malformed call penalised -0.5 ending the episode on a wrong answer: 1 turn, 0 calls, 1 malformed step
    Trajectory("c", 2, "2", [step(10, -0.5, final=True, errors=["unclosed_tag"])], "answered"),
    # correct after one call: reward 1, 2 turns, 1 call, 20 tokens
    Trajectory("d", 3, "3", [step(15, tool_calls=1), step(5, 1.0, final=True)], "answered"),
]


def test_summarize_matches_hand_count():
    stats = [_traj_stats(t) for t in HAND]
    assert [s["correct"] for s in stats] == [1.0, 0.0, 0.0, 1.0]
    assert [s["response_len"] for s in stats] == [30, 50, 10, 20]
    res = summarize(stats)
    rewards = [1.0, 0.0, -0.5, 1.0]  # mean 0.375; squared deviations .390625 .140625 .765625 .390625
    assert res["n"] == 4
    assert res["reward_mean"] == pytest.approx(0.375)
    assert res["reward_std"] == pytest.approx(math.sqrt(1.6875 / 4))  # population std
    assert res["reward_mean"] == pytest.approx(sum(rewards) / 4)
    assert res["accuracy"] == 0.5
    assert res["mean_turns"] == 2.0  # (2 + 3 + 1 + 2) / 4
    assert res["mean_tool_calls"] == 1.0  # (1 + 2 + 0 + 1) / 4
    assert res["malformed_rate"] == 0.25  # 2 malformed steps out of 8 turns
    assert res["mean_response_len"] == 27.5  # (30 + 50 + 10 + 20) / 4
    assert res["max_response_len"] == 50
    assert res["term_answered"] == 0.75 and res["term_max_steps"] == 0.25
    assert summarize([]) == {"n": 0}


def brute_pass_at_k(n, c, k):
    """Fraction of k-subsets of n samples (c correct) holding at least one correct sample."""
    subsets = list(itertools.combinations([1] * c + [0] * (n - c), k))
    return sum(any(s) for s in subsets) / len(subsets)


def test_pass_at_k_known_values():
    assert pass_at_k(5, 2, 1) == pytest.approx(2 / 5)
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 - C(3,2)/C(5,2)
    assert pass_at_k(10, 3, 5) == pytest.approx(1 - 21 / 252)  # 1 - C(7,5)/C(10,5)
    assert pass_at_k(4, 0, 2) == 0.0
    assert pass_at_k(4, 4, 1) == 1.0
    assert pass_at_k(4, 2, 3) == 1.0  # fewer than k wrong samples: every k-subset holds a correct one
    for n in range(1, 8):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(brute_pass_at_k(n, c, k)), (n, c, k)


def test_exact_mcnemar_p_against_a_float64_binomial_sum():
    """The exact test against the binomial tail summed term by term in float64, both tails, small and large n; its
    known values (10 / 0 -> 2 / 1024); symmetric; 1 when nothing differs or the counts are equal."""
    from r1.compare import exact_p

    def ref(g, l):  # the pmf from log-gamma: no integer beyond a float's range
        n = g + l
        pmf = [math.exp(math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) - n * math.log(2))
               for i in range(n + 1)]
        lo, hi = sum(pmf[: min(g, l) + 1]), sum(pmf[max(g, l):])
        return min(1.0, lo + hi)

    for g, l in [(10, 0), (5, 2), (48, 75), (101, 48), (0, 1), (3, 3), (20, 27), (700, 650)]:
        assert exact_p(g, l) == pytest.approx(ref(g, l), rel=1e-9, abs=1e-300), (g, l)
        assert exact_p(g, l) == exact_p(l, g)
    assert exact_p(10, 0) == 2 / 1024 and exact_p(0, 0) == 1.0 and exact_p(4, 4) == 1.0


def test_compare_counts_paired_gains_and_losses(tmp_path, capsys):
    """r1.compare on two saved evals: gained/lost by hand, McNemar z and p against a float64 formula,
    problems present in one eval only are reported, not compared; a duplicate problem id is an error."""
    from r1 import compare
    from r1.trajectory import save as save_trajs

    def ans(uid, sid, right):
        return Trajectory(uid, 0, sid, [step(5, 1.0 if right else 0.0, final=True)], "answered")

    # problems 0..9: A right on 0-3, B right on 2-8 (gained 4,5,6,7,8 = 5; lost 0,1 = 2); A also has 99
    a = [ans(f"a{i}", str(i), i < 4) for i in range(10)] + [ans("a99", "99", True)]
    b = [ans(f"b{i}", str(i), 2 <= i <= 8) for i in range(10)]
    os.makedirs(tmp_path / "a")
    save_trajs(a, str(tmp_path / "a" / "eval_trajectories.jsonl.gz"))
    save_trajs(b, str(tmp_path / "b.jsonl.gz"))
    r = compare.main([str(tmp_path / "a"), str(tmp_path / "b.jsonl.gz")])
    assert (r["n"], r["gained"], r["lost"], r["only_in_a"], r["only_in_b"]) == (10, 5, 2, 1, 0)
    assert (r["acc_a"], r["acc_b"]) == (0.4, 0.7) and abs(r["delta_points"] - 30.0) < 1e-12
    z = 3 / math.sqrt(7)
    assert abs(r["z"] - z) < 1e-12 and abs(r["p"] - math.erfc(z / math.sqrt(2))) < 1e-12
    assert abs(r["p_exact"] - 2 * (1 + 7 + 21) / 2 ** 7) < 1e-15  # 2 P(X <= 2), X ~ Bin(7, 1/2)
    printed = capsys.readouterr().out
    assert "gained 5, lost 2" in printed and "left out: 1 only in" in printed
    save_trajs(b + [ans("dup", "3", True)], str(tmp_path / "dup.jsonl.gz"))
    with pytest.raises(ValueError, match="appears twice"):
        compare.correct_by_problem(str(tmp_path / "dup.jsonl.gz"))
    with pytest.raises(ValueError, match="share no problem"):
        compare.mcnemar({"x": 1.0}, {"y": 1.0})
    save_trajs([], str(tmp_path / "empty.jsonl.gz"))
    with pytest.raises(SystemExit, match="^error: .*empty.jsonl.gz holds no trajectories"):
        compare.main([str(tmp_path / "b.jsonl.gz"), str(tmp_path / "empty.jsonl.gz")])
    with pytest.raises(SystemExit, match="^error: no trajectory file .*nope"):  # one line, no traceback
        compare.main([str(tmp_path / "nope"), str(tmp_path / "b.jsonl.gz")])
    (tmp_path / "junk.jsonl.gz").write_text("not gzip")
    with pytest.raises(SystemExit, match="^error: .*junk.jsonl.gz is not a trajectory file"):  # the wrong file
        compare.main([str(tmp_path / "b.jsonl.gz"), str(tmp_path / "junk.jsonl.gz")])
    whole = (tmp_path / "b.jsonl.gz").read_bytes()
    (tmp_path / "cut.jsonl.gz").write_bytes(whole[:len(whole) // 2])  # a damaged one: truncated, what is readable
    with pytest.raises(SystemExit, match="^error: .*cut.jsonl.gz: truncated or corrupt after line"):
        compare.main([str(tmp_path / "b.jsonl.gz"), str(tmp_path / "cut.jsonl.gz")])
    with pytest.raises(SystemExit):
        compare.main([str(tmp_path / "b.jsonl.gz")])
    assert capsys.readouterr().err.startswith("usage: python -m r1.compare ")
