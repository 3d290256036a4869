"""Bad input, end to end: `python train.py` / `python eval.py` as a user runs them.

Each case runs the real script in a subprocess once (results are cached for the module) and
two tests read the outcome:
  * the run fails with a non-zero exit and ONE line on stderr, `error: ...`, that names the
    culprit (key, file:line, path), with no Python traceback;
  * nothing on disk is touched: every input file keeps its bytes and mtime, an existing run
    folder is left exactly as it was, and a failed start leaves no half-made run folder behind
    (which would make the corrected command fail with "run.dir exists").
The params() hook can mark a case xfail(strict=True) while its fix is pending; none is now.

Speed: config errors exit before torch is imported (~0.2 s); the others use a byte-level
tokenizer built here (no download, loads in milliseconds) and the tiny random model, so they
fail within the import time of torch (~5-10 s on a shared 2-core machine).
"""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMOKE = os.path.join(ROOT, "configs", "smoke.yaml")
from byte_tokenizer import CHATML, save_byte_tokenizer  # noqa: E402


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad_input")
    save_byte_tokenizer(root / "tok", CHATML)
    save_byte_tokenizer(root / "tok_no_template", None)
    (root / "mamba").mkdir()
    (root / "mamba" / "config.json").write_text(json.dumps({"model_type": "mamba", "hidden_size": 64}))
    good = json.dumps({"question": "Tom has 3 apples and buys 2. How many?", "answer": "3+2=<<3+2=5>>5\n#### 5"})
    (root / "gsm_missing").mkdir()
    (root / "gsm_missing" / "train.jsonl").write_text(good + "\n" + json.dumps({"question": "No answer?"}) + "\n")
    (root / "gsm_unparsable").mkdir()
    (root / "gsm_unparsable" / "train.jsonl").write_text(
        good + "\n" + json.dumps({"question": "How many?", "answer": "lots\n#### many"}) + "\n")
    (root / "bad.yaml").write_text("train:\n  steps: 2\n  lr: [1e-4\n  warmup: 0\n")
    (root / "unknown.yaml").write_text("algo:\n  clip_hi: 0.3\n")
    (root / "wrong_type.yaml").write_text("run:\n  seed: 0\ntrain:\n  lr: fast\n")
    (root / "scalar_section.yaml").write_text("algo: 3\n")
    existing = root / "existing_run"
    (existing / "checkpoints" / "iter_000001").mkdir(parents=True)
    (existing / "config.yaml").write_text("run:\n  dir: old\n")
    (existing / "metrics.jsonl").write_text('{"iter": 1, "reward": 0.5}\n')
    (existing / "checkpoints" / "iter_000001" / "state.bin").write_bytes(b"\x00\x01weights")
    (root / "existing_eval").mkdir()
    (root / "existing_eval" / "eval.json").write_text('{"accuracy": 0.25}\n')
    (root / "runs").mkdir()
    return root


def train(*args):
    return ["train.py", "--config", SMOKE, *args]


# name -> (argv builder, substrings the error line must hold). {r} is the inputs folder, {run} a fresh run.dir.
CASES = {
    "bad_yaml": (lambda r, run: ["train.py", "--config", f"{r}/bad.yaml"], ["{r}/bad.yaml:4", "line 3"]),
    "missing_config_file": (lambda r, run: ["train.py", "--config", f"{r}/nope.yaml"], ["{r}/nope.yaml"]),
    "unknown_key_file": (lambda r, run: ["train.py", "--config", f"{r}/unknown.yaml"],
                         ["algo.clip_hi", "{r}/unknown.yaml:2", "algo.clip_high"]),
    "unknown_key_cli": (lambda r, run: train("algo.clip_hi=0.3", f"run.dir={run}"), ["algo.clip_hi", "algo.clip_high"]),
    "wrong_type_file": (lambda r, run: ["train.py", "--config", f"{r}/wrong_type.yaml"],
                        ["train.lr", "{r}/wrong_type.yaml:4", "float"]),
    "wrong_type_cli": (lambda r, run: train("train.steps=two", f"run.dir={run}"), ["train.steps", "int"]),
    "scalar_section": (lambda r, run: ["train.py", "--config", f"{r}/scalar_section.yaml"],
                       ["'algo'", "{r}/scalar_section.yaml:1"]),
    "missing_model": (lambda r, run: train(f"model.path={r}/nope", f"model.tokenizer={r}/tok", f"run.dir={run}"),
                      ["{r}/nope"]),
    "unknown_architecture": (lambda r, run: train(f"model.path={r}/mamba", f"model.tokenizer={r}/tok",
                                                  f"run.dir={run}"), ["mamba", "{r}/mamba"]),
    "gsm8k_missing_field": (lambda r, run: train("data.task=gsm8k", f"data.path={r}/gsm_missing",
                                                 f"model.tokenizer={r}/tok", f"run.dir={run}"),
                            ["{r}/gsm_missing/train.jsonl:2", "answer"]),
    "gsm8k_unparsable_answer": (lambda r, run: train("data.task=gsm8k", f"data.path={r}/gsm_unparsable",
                                                     f"model.tokenizer={r}/tok", f"run.dir={run}"),
                                ["{r}/gsm_unparsable/train.jsonl:2", "####"]),
    "no_chat_template": (lambda r, run: train(f"model.tokenizer={r}/tok_no_template", f"run.dir={run}"),
                         ["{r}/tok_no_template", "chat template"]),
    "run_dir_exists": (lambda r, run: train(f"model.tokenizer={r}/tok", f"run.dir={r}/existing_run"),
                       ["run.dir", "{r}/existing_run"]),
    "eval_missing_model": (lambda r, run: ["eval.py", "--config", SMOKE, f"model.path={r}/nope",
                                           f"model.tokenizer={r}/tok", f"eval.out={run}"], ["{r}/nope"]),
    "eval_out_exists": (lambda r, run: ["eval.py", "--config", SMOKE, f"model.tokenizer={r}/tok",
                                        f"eval.out={r}/existing_eval"], ["eval.out", "{r}/existing_eval"]),
}

ERROR_XFAIL = {}  # every case gets its one-line error (train.py / eval.py USER_ERRORS handler)
DISK_XFAIL = {}  # run.dir is created only after models, tokenizer and data loaded


def params(xfails):
    return [pytest.param(name, marks=pytest.mark.xfail(reason=xfails[name], strict=True)) if name in xfails
            else name for name in CASES]


def snapshot(root, skip):
    """{relative path: (mtime_ns, bytes)} of every file under root, except those under `skip`."""
    out = {}
    for folder, _, files in os.walk(root):
        for f in files:
            path = os.path.join(folder, f)
            if not path.startswith(str(skip) + os.sep):
                with open(path, "rb") as fh:
                    out[os.path.relpath(path, root)] = (os.stat(path).st_mtime_ns, fh.read())
    return out


RESULTS = {}


def outcome(name, root):
    """Run one case once: (CompletedProcess, inputs before, inputs after, its fresh run.dir)."""
    if name not in RESULTS:
        build, _ = CASES[name]
        run = root / "runs" / name
        before = snapshot(root, root / "runs")
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="2")
        proc = subprocess.run([sys.executable, *build(root, run)], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=300)
        RESULTS[name] = (proc, before, snapshot(root, root / "runs"), run)
    return RESULTS[name]


@pytest.mark.parametrize("name", params(ERROR_XFAIL))
def test_fails_with_one_line_naming_the_culprit(name, inputs):
    proc = outcome(name, inputs)[0]
    assert proc.returncode > 0, f"exit {proc.returncode}; stderr: {proc.stderr[-400:]}"
    assert "Traceback" not in proc.stderr, proc.stderr[-600:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-600:]
    for culprit in CASES[name][1]:
        assert culprit.format(r=inputs) in lines[0], f"{culprit!r} not in {lines[0]!r}"


@pytest.mark.parametrize("name", params(DISK_XFAIL))
def test_leaves_disk_alone(name, inputs):
    proc, before, after, run = outcome(name, inputs)
    assert proc.returncode != 0
    assert after == before, "input files changed: " + ", ".join(
        sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k)))
    assert not run.exists(), f"a failed start left {run}: {sorted(os.listdir(run))}"
