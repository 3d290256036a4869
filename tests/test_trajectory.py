"""The trajectory store: exact save/load, the prompt delta encoding, and the `show` CLI.

Round trips compare whole dataclasses (ids, float logprobs bit for bit,
rewards, info, masks); the delta encoding is checked on append, window-like,
truncated and unrelated prompts; `show` runs as a subprocess on a run folder
whose config names the real SmolLM2 tokenizer.
"""
import json
import os
import random
import subprocess
import sys

import numpy as np
import pytest

from r1.tokenizer import load_tokenizer
from r1.trajectory import Saver, Step, Trajectory, from_record, iter_path, load, render, save, to_record

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("smollm2-135m-instruct")


def rand_ids(rng, n):
    return [rng.randrange(49152) for _ in range(n)]


def step(rng, prompt, n=5, **kw):
    return Step(prompt, rand_ids(rng, n), [-rng.random() * 10 for _ in range(n)], reward=rng.uniform(-1, 1), **kw)


def append_traj(rng, uid="0-0", turns=4):
    t = Trajectory(uid, 0, "s0", termination="answered", meta={"answer": "27", "level": 2})
    prompt = rand_ids(rng, 12)
    for i in range(turns):
        s = step(rng, prompt, info={"tool_calls": 1, "errors": ["bad_json"] * i, "final": i == turns - 1})
        t.steps.append(s)
        prompt = s.prompt_ids + s.response_ids + rand_ids(rng, 3)
    t.steps[-1].done = True
    return t


def rewritten_traj(rng):
    """Prompts that do not extend the previous step: a window, a truncation, an unrelated prompt, a prefix."""
    first = rand_ids(rng, 10)
    a = step(rng, first + rand_ids(rng, 4))
    b = step(rng, first + a.response_ids[2:] + rand_ids(rng, 2), response_mask=[1, 0, 1, 1, 0], finish="length")
    c = step(rng, rand_ids(rng, 7), policy_version=3)
    d = step(rng, c.prompt_ids[:4], n=0)  # shorter than the previous prompt: all kept, nothing new
    e = step(rng, [], n=2)
    return Trajectory("1-0", 1, "s1", [a, b, c, d, e], "context_budget", {"answer": None})


def test_round_trip_is_exact(tmp_path):
    rng = random.Random(0)
    trajs = [append_traj(rng), rewritten_traj(rng), Trajectory("2-0", 2, "s2", [], "context_budget", {}),
             append_traj(rng, uid="3-1", turns=1)]
    trajs[0].steps[1].logprobs[0] = float("-inf")  # a sampler can report it; JSON must carry it
    path = iter_path(str(tmp_path), 7)
    save(trajs, path)
    assert os.path.basename(path) == "iter_000007.jsonl.gz" and os.listdir(os.path.dirname(path)) == [
        "iter_000007.jsonl.gz"]  # the temp file was renamed away
    back = load(path)
    assert back == trajs  # dataclass equality: every id, float, flag, mask and info entry
    assert [s.logprobs for t in back for s in t.steps] == [s.logprobs for t in trajs for s in t.steps]
    assert back[1].steps[1].mask == [1, 0, 1, 1, 0] and back[0].steps[0].mask == [1] * 5


def test_the_background_saver_writes_the_same_files_and_reports_errors(tmp_path):
    """The trainer writes each iteration's file on a thread (r1.trajectory.Saver) while the next iteration
    runs: the files are save()'s, one at a time, and a write that failed is raised at the next call."""
    rng = random.Random(1)
    trajs = [append_traj(rng), rewritten_traj(rng)]
    saver, want = Saver(), []
    for it in (1, 2):
        want.append(list(trajs))
        saver.save(trajs, iter_path(str(tmp_path), it))
        trajs.append(append_traj(rng, uid="late"))  # the caller's list changes after save(): the file does not
    saver.wait()
    assert [load(iter_path(str(tmp_path), it)) for it in (1, 2)] == want
    (tmp_path / "blocked").write_text("a file where the folder would go")
    saver.save(trajs, str(tmp_path / "blocked" / "iter_000003.jsonl.gz"))
    with pytest.raises(OSError):
        saver.wait()
    saver.save(trajs[:1], iter_path(str(tmp_path), 3))  # the saver goes on after an error
    saver.close()
    assert load(iter_path(str(tmp_path), 3)) == trajs[:1]


def test_delta_encoding_stores_append_prompts_once(tmp_path):
    rng = random.Random(1)
    t = append_traj(rng, turns=6)
    record = to_record(t)
    prev = []
    for s, d in zip(t.steps, record["steps"]):
        assert d["prompt_keep"] == len(prev) and d["prompt_new"] == s.prompt_ids[len(prev):]
        prev = s.prompt_ids + s.response_ids
    stored = sum(len(d["prompt_new"]) for d in record["steps"])
    assert stored == 12 + 3 * 5 and sum(len(s.prompt_ids) for s in t.steps) > 4 * stored
    assert record["num_steps"] == 6 and record["num_tool_calls"] == 6 and record["total_reward"] == t.total_reward
    assert from_record(json.loads(json.dumps(record))) == t


def test_delta_encoding_handles_rewritten_prompts():
    t = rewritten_traj(random.Random(2))
    record = to_record(t)
    keeps = [d["prompt_keep"] for d in record["steps"]]
    assert keeps == [0, 10, 0, 4, 0]
    assert record["steps"][3]["prompt_new"] == [] and not t.is_append_only()
    assert from_record(json.loads(json.dumps(record))) == t


def test_load_errors_name_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="iter_000001"):
        load(iter_path(str(tmp_path), 1))


def show(*args):
    return subprocess.run([sys.executable, "-m", "r1.trajectory", "show", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_show_cli_prints_turns_rewards_and_masks(tmp_path, tok):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("model:\n  tokenizer: smollm2-135m-instruct\n  path: null\n")
    prompt = tok.render([{"role": "user", "content": "What is 48/2?"}])
    r1 = tok.encode('<tool_call>{"name": "calculator", "arguments": {"expression": "48/2"}}</tool_call>') + [2]
    obs = tok.close_turn_ids(r1) + tok.render_next([{"role": "tool", "content": "24"}])
    r2 = tok.encode("#### 24") + [2]
    steps = [Step(prompt, r1, [-0.5] * len(r1), -0.25, info={"tool_calls": 1, "errors": []}),
             Step(prompt + r1 + obs, r2, [-0.1] * len(r2), 1.0, True, response_mask=[1] * (len(r2) - 1) + [0],
                  info={"final": True})]
    other = Trajectory("0-0", 0, "s0", [], "context_budget")
    save([other, Trajectory("0-1", 0, "s0", steps, "answered")], iter_path(str(run), 3))

    out = show(run, "--iter", 3, "--index", 1)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "trajectory 0-1" in text and "reward=0.75" in text and "termination=answered" in text
    assert "--- step 0" in text and "--- step 1" in text and "could not load" not in text
    assert "What is 48/2?" in text and '"expression": "48/2"' in text and "<tool_response>\n24" in text
    assert f"response {len(r2)} tokens (mask {len(r2) - 1}/{len(r2)})" in text and "reward -0.25" in text
    assert f"({len(obs)} new, mask 0)" in text  # step 1 shows only the observation as new prompt

    ids = show(run, "--iter", 3, "--index", 1, "--ids")
    assert ids.returncode == 0 and " ".join(map(str, r2)) in ids.stdout

    for bad in ("2", "-1"):
        out = show(run, "--iter", 3, "--index", bad, "--ids")
        assert out.returncode != 0 and "out of range" in out.stderr and "has 2 trajectories" in out.stderr
        assert "Traceback" not in out.stderr
    out = show(run, "--iter", 4, "--ids")
    assert out.returncode != 0 and "iter_000004" in out.stderr and "Traceback" not in out.stderr
    assert out.stderr.strip().endswith("saved: iteration 3")  # what --iter may name
    save([other], iter_path(str(run), 5))
    assert show(run, "--iter", 4, "--ids").stderr.strip().endswith("saved: iterations 3, 5")
    out = show(tmp_path, "--iter", 1)
    assert out.returncode != 0 and "has no trajectories/ folder" in out.stderr and "\n" not in out.stderr.strip()


def test_show_reads_an_eval_folder_and_a_trajectory_file(tmp_path, tok):
    """eval.py's greedy episodes (eval.out/eval_trajectories.jsonl.gz, config.yaml beside) need no --iter; a
    trajectory file is read as it is, with the tokenizer of the folder it lies in (a run's, for trajectories/)."""
    out_dir = tmp_path / "eval-val"
    out_dir.mkdir()
    (out_dir / "config.yaml").write_text("model:\n  tokenizer: smollm2-135m-instruct\n  path: null\n")
    prompt = tok.render([{"role": "user", "content": "What is 6*7?"}])
    resp = tok.encode("#### 42") + [2]
    t = Trajectory("eval-0-0", 0, "gsm8k-test-7", [Step(prompt, resp, [-0.1] * len(resp), 1.0, True)], "answered")
    save([t], str(out_dir / "eval_trajectories.jsonl.gz"))
    for target in (out_dir, out_dir / "eval_trajectories.jsonl.gz"):
        got = show(target)
        assert got.returncode == 0, got.stderr
        assert "trajectory eval-0-0" in got.stdout and "What is 6*7?" in got.stdout and "#### 42" in got.stdout
        assert "iteration" not in got.stdout and "could not load" not in got.stdout
    got = show(out_dir, "--iter", 1)  # an eval folder has no iterations: said so, not "no trajectories/ folder"
    assert got.returncode != 0 and "is an eval.out folder" in got.stderr and "drop it" in got.stderr
    got = show(out_dir, "--index", 1)
    assert got.returncode != 0 and "out of range" in got.stderr and "has 1 trajectories" in got.stderr
    run = tmp_path / "run"  # a run folder's file, named directly: the run's config.yaml decodes it
    run.mkdir()
    (run / "config.yaml").write_text("model:\n  tokenizer: smollm2-135m-instruct\n  path: null\n")
    save([t], iter_path(str(run), 2))
    got = show(iter_path(str(run), 2))
    assert got.returncode == 0 and "What is 6*7?" in got.stdout, got.stderr
    inside = subprocess.run([sys.executable, "-m", "r1.trajectory", "show", os.path.basename(iter_path(str(run), 2))],
                            cwd=os.path.dirname(iter_path(str(run), 2)), capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PYTHONPATH": ROOT})  # a bare file name, from inside trajectories/
    assert inside.returncode == 0 and "What is 6*7?" in inside.stdout, inside.stderr
    got = show(iter_path(str(run), 2), "--iter", 5)  # a file and an --iter that could disagree: refused
    assert got.returncode != 0 and "--iter is for a run folder" in got.stderr and "Traceback" not in got.stderr
    elsewhere = tmp_path / "published"  # a file whose run is not here (docs/results/): --tokenizer decodes it
    elsewhere.mkdir()
    save([t], str(elsewhere / "eval-test.jsonl.gz"))
    got = show(elsewhere / "eval-test.jsonl.gz")
    assert got.returncode == 0 and "could not load" in got.stdout and "--tokenizer NAME" in got.stdout
    got = show(elsewhere / "eval-test.jsonl.gz", "--tokenizer", "smollm2-135m-instruct")
    assert got.returncode == 0 and "What is 6*7?" in got.stdout and "could not load" not in got.stdout, got.stderr
    got = show(elsewhere / "eval-test.jsonl.gz", "--tokenizer", tmp_path / "no-such-tokenizer")
    assert got.returncode != 0 and got.stderr.startswith("error: --tokenizer ") and "Traceback" not in got.stderr
    got = show(elsewhere)  # a folder of trajectory files that are not eval.py's name: listed
    assert got.returncode != 0 and "trajectory files in it: eval-test.jsonl.gz" in got.stderr
    for target, words in ((run, "--iter N names the iteration of a training run; saved: iteration 2"),
                          (tmp_path / "nope", "no such run folder, eval.out folder or trajectory file")):
        got = show(target)  # no --iter and no eval file: one line that says what to give
        assert got.returncode != 0 and words in got.stderr and "Traceback" not in got.stderr, got.stderr


def test_render_counts_new_prompt_tokens_for_rewritten_prompts():
    t = rewritten_traj(random.Random(3))
    text = render(t)
    assert "--- step 1: prompt 15 tokens (15 new, mask 0), response 5 tokens (mask 3/5)" in text
    assert "step 3: prompt 4 tokens (4 new" in text  # not a prefix-extension: shown whole


def test_common_prefix_equals_the_element_by_element_count():
    import random

    from r1.trajectory import common_prefix

    rng = random.Random(0)
    for _ in range(300):
        a = [rng.randrange(4) for _ in range(rng.randrange(12))]
        b = a[: rng.randrange(len(a) + 1)] + [rng.randrange(4) for _ in range(rng.randrange(12))]
        naive = 0
        while naive < min(len(a), len(b)) and a[naive] == b[naive]:
            naive += 1
        assert common_prefix(a, b) == common_prefix(b, a) == naive, (a, b)


class _Float(float):
    pass


DEFECTS = [  # (what, how a step is spoiled): the loop finishes the episode, except for the last four (it accepts them)
    ("nan logprob", lambda s: s.logprobs.__setitem__(0, float("nan"))),
    ("inf logprob", lambda s: s.logprobs.__setitem__(-1, float("-inf"))),
    ("None logprob", lambda s: s.logprobs.__setitem__(0, None)),
    ("str logprob", lambda s: s.logprobs.__setitem__(0, "-0.5")),
    ("numpy float32 logprob", lambda s: s.logprobs.__setitem__(0, np.float32(-0.5))),
    ("one logprob short", lambda s: s.logprobs.pop()),
    ("negative id", lambda s: s.response_ids.__setitem__(0, -1)),
    ("id = vocab", lambda s: s.response_ids.__setitem__(0, 50)),
    ("id past int64", lambda s: s.response_ids.__setitem__(0, 2**70)),
    ("nan, then an int too large for a float", lambda s: (s.response_ids.__setitem__(slice(None), [3, 4]),
                                                         s.logprobs.__setitem__(slice(None), [float("nan"), 10**400]))),
    ("bad id, reward too large for a float", lambda s: (s.response_ids.__setitem__(0, 99), setattr(s, "reward", 10**400))),
    ("nan reward", lambda s: setattr(s, "reward", float("nan"))),
    ("None reward", lambda s: setattr(s, "reward", None)),
    ("bool logprob", lambda s: s.logprobs.__setitem__(0, True)),
    ("float subclass logprob", lambda s: s.logprobs.__setitem__(0, _Float(-0.5))),
    ("float id", lambda s: s.response_ids.__setitem__(0, 3.0)),
    ("bool reward", lambda s: setattr(s, "reward", True)),
]
ACCEPTED = {"bool logprob", "float subclass logprob", "float id", "bool reward"}


@pytest.mark.parametrize("what,spoil", DEFECTS, ids=[d[0] for d in DEFECTS])
def test_check_episodes_fast_path_agrees_with_the_step_by_step_loop(what, spoil):
    """check_episodes' whole-batch check (_all_valid) only ever skips the loop when the loop would find
    nothing: with one odd value anywhere, both give the same reasons and leave the same episodes."""
    import copy

    from r1.trajectory import _all_valid, _finish_bad, check_episodes

    rng = random.Random(what)

    def batch():
        out = []
        for i in range(6):
            steps = []
            for _ in range(rng.randrange(1, 4)):
                resp = [rng.randrange(50) for _ in range(rng.randrange(1, 5))]
                steps.append(Step([1, 2], resp, [-rng.random() for _ in resp], float(rng.random() < 0.5)))
            out.append(Trajectory(str(i), i // 2, str(i // 2), steps))
        return out

    clean = batch()
    assert _all_valid(clean, 50)  # the fast path is taken on a clean batch
    assert check_episodes(copy.deepcopy(clean), 50) == [] == _finish_bad(copy.deepcopy(clean), 50)
    for _ in range(4):
        trajs = copy.deepcopy(clean)
        t = trajs[rng.randrange(len(trajs))]
        spoil(t.steps[rng.randrange(len(t.steps))])
        a, b = copy.deepcopy(trajs), copy.deepcopy(trajs)
        want = _finish_bad(b, 50)
        assert check_episodes(a, 50) == want and bool(want) == (what not in ACCEPTED), what
        assert [(x.uid, len(x.steps), x.termination, x.meta) for x in a] == \
            [(x.uid, len(x.steps), x.termination, x.meta) for x in b]
