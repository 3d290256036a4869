"""The run folder: nothing outside run.dir is written or deleted through a link inside it, an export a
crash cut short does not outlive the next one, one process writes a run folder at a time, and a resume
whose config, data or weights changed is refused."""
import json
import os
import subprocess
import sys

import pytest
import torch

from r1.atomic import lock_folder, refuse_links
from r1.logger import Logger
from r1.weights import save_hf

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMOKE = os.path.join(ROOT, "configs", "smoke.yaml")
HF_CONFIG = {"model_type": "llama", "vocab_size": 8, "hidden_size": 4, "intermediate_size": 8,
             "num_hidden_layers": 1, "num_attention_heads": 1, "num_key_value_heads": 1}


def _outside(tmp_path):
    out = tmp_path / "outside"
    out.mkdir()
    (out / "precious.txt").write_text("keep me")
    return out


def test_export_over_an_hf_link_replaces_the_link_and_leaves_its_target_alone(tmp_path):
    """Before the fix: save_hf resolved run.dir/hf through the link, then moved and deleted the outside folder."""
    outside, run = _outside(tmp_path), tmp_path / "run"
    run.mkdir()
    (run / "hf").symlink_to(outside, target_is_directory=True)
    save_hf({"model.embed_tokens.weight": torch.zeros(8, 4)}, HF_CONFIG, run / "hf")
    assert (outside / "precious.txt").read_text() == "keep me" and sorted(os.listdir(outside)) == ["precious.txt"]
    assert not (run / "hf").is_symlink() and (run / "hf" / "config.json").is_file()


def test_an_export_cut_short_is_removed_by_the_next(tmp_path):
    run = tmp_path / "run"
    (run / ".hf.tmp-abc123").mkdir(parents=True)
    (run / ".hf.tmp-abc123" / "model.safetensors").write_bytes(b"x" * 1000)
    (run / ".hf.old-def456" / "export").mkdir(parents=True)
    save_hf({"model.embed_tokens.weight": torch.zeros(8, 4)}, HF_CONFIG, run / "hf")
    assert sorted(os.listdir(run)) == ["hf"]


def test_a_metrics_link_is_refused_and_nothing_is_created_outside(tmp_path):
    """Before the fix: a dangling metrics.jsonl link made the run create the file it pointed at."""
    outside, run = _outside(tmp_path), tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").symlink_to(outside / "made.jsonl")
    log = Logger(str(run), True, False, False, 1, 0)
    with pytest.raises(OSError, match="metrics.jsonl is a symbolic link"):
        log.log(1, {"reward": 1.0})
    assert sorted(os.listdir(outside)) == ["precious.txt"]


def test_refuse_links_names_the_link_at_any_depth(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints" / "iter_1").mkdir(parents=True)
    refuse_links(str(run))
    (run / "checkpoints" / "iter_1" / "extra.json").symlink_to(tmp_path / "nowhere")
    with pytest.raises(ValueError, match=r"iter_1/extra.json is a symbolic link"):
        refuse_links(str(run))


def test_resuming_a_run_folder_that_holds_a_link_is_one_line_and_writes_nothing(tmp_path):
    outside, run = _outside(tmp_path), tmp_path / "run"
    args = [sys.executable, "train.py", "--config", SMOKE, f"run.dir={run}", "train.steps=1", "rollout.prompts=2",
            "rollout.n=2", "rollout.max_new_tokens=4", "data.train_size=4", "log.tensorboard=false"]
    first = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr[-600:]
    os.remove(run / "metrics.jsonl")
    (run / "metrics.jsonl").symlink_to(outside / "made.jsonl")
    again = subprocess.run(args[:-1] + ["train.steps=2", "run.resume=true", "log.tensorboard=false"], cwd=ROOT,
                           capture_output=True, text=True, timeout=600)
    lines = again.stderr.strip().splitlines()
    assert again.returncode == 2 and len(lines) == 1 and "metrics.jsonl is a symbolic link" in lines[0], again.stderr
    assert sorted(os.listdir(outside)) == ["precious.txt"]


def test_a_folder_locked_by_another_process_is_refused_naming_its_pid(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys, time\n"
        f"fd = os.open({str(run / '.lock')!r}, os.O_RDWR | os.O_CREAT)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX); os.pwrite(fd, str(os.getpid()).encode(), 0)\n"
        "print('locked', flush=True); time.sleep(120)\n")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(ValueError, match=rf"in use by another process \(pid {holder.pid}\)"):
            lock_folder(str(run))
    finally:
        holder.kill()
        holder.wait()
    lock_folder(str(run))  # free again: this process takes it, and may take it again
    lock_folder(str(run))
    assert (run / ".lock").read_text() == str(os.getpid())


def test_a_resume_that_cannot_be_checked_or_reshapes_the_schedule_is_refused(tmp_path):
    """Before the fix: with config.yaml gone a resume skipped the config check; train.steps changed under a cosine
    schedule silently redrew the learning rate of the rest of the run."""
    run = tmp_path / "run"
    args = [sys.executable, "train.py", "--config", SMOKE, f"run.dir={run}", "rollout.prompts=2", "rollout.n=2",
            "rollout.max_new_tokens=4", "data.train_size=4", "log.tensorboard=false", "train.schedule=cosine"]

    def train(*more):
        return subprocess.run(args + list(more), cwd=ROOT, capture_output=True, text=True, timeout=600)

    first = train("train.steps=1")
    assert first.returncode == 0, first.stderr[-600:]
    longer = train("train.steps=3", "run.resume=true")
    lines = longer.stderr.strip().splitlines()
    assert longer.returncode == 2 and len(lines) == 1 and "train.steps 1 -> 3" in lines[0], longer.stderr[-600:]
    os.remove(run / "config.yaml")
    blind = train("train.steps=1", "run.resume=true")
    lines = blind.stderr.strip().splitlines()
    assert blind.returncode == 2 and len(lines) == 1 and "no config.yaml" in lines[0], blind.stderr[-600:]
    with open(run / "metrics.jsonl") as f:
        assert [json.loads(x)["iter"] for x in f] == [1]  # nothing was trained by the refused resumes
    ok = train("train.steps=2", "run.resume=true", "run.allow_config_change=true")
    assert ok.returncode == 0, ok.stderr[-600:]


def test_a_resume_whose_data_or_weights_changed_is_refused(tmp_path):
    """Before the fix: the task data or the starting (and reference) weights changing between start and resume went
    unnoticed. The run records fingerprints in identity.json at start."""
    import shutil

    model = tmp_path / "model"
    first_args = ["--config", SMOKE, "rollout.prompts=2", "rollout.n=2", "rollout.max_new_tokens=4",
                  "data.task=gsm8k_tool", "data.train_size=4", "log.tensorboard=false"]
    sft = subprocess.run([sys.executable, "train.py", *first_args, f"run.dir={model}", "train.stage=sft",
                          "train.steps=1", "train.sft_batch=2"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert sft.returncode == 0, sft.stderr[-600:]
    run = tmp_path / "run"
    args = [sys.executable, "train.py", *first_args, f"model.path={model}/hf", f"run.dir={run}"]

    def train(*more):
        return subprocess.run(args + list(more), cwd=ROOT, capture_output=True, text=True, timeout=600)

    assert train("train.steps=1").returncode == 0
    saved = json.loads((run / "identity.json").read_text())
    assert set(saved) == {"data", "model.path"}
    other = train("train.steps=2", "run.resume=true", "data.train_size=5")  # other rows, same keys otherwise
    assert other.returncode == 2 and "data.train_size" in other.stderr  # a key change: the config check says so
    # the same keys, other files behind model.path
    weights = model / "hf" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    changed = train("train.steps=2", "run.resume=true")
    lines = changed.stderr.strip().splitlines()
    assert changed.returncode == 2 and len(lines) == 1 and "model.path no longer holds" in lines[0], changed.stderr
    shutil.copy(run / "identity.json", tmp_path / "before.json")
    ok = train("train.steps=2", "run.resume=true", "run.allow_config_change=true")
    assert ok.returncode == 0, ok.stderr[-600:]
    assert json.loads((run / "identity.json").read_text())["model.path"] != saved["model.path"]


def test_fingerprints_follow_content_not_names(tmp_path):
    from r1.identity import changes, rows_fingerprint, weights_fingerprint

    rows = [{"id": "a", "question": "1+1?", "answer": "2"}, {"id": "b", "question": "2+2?", "answer": "4"}]
    assert rows_fingerprint(rows) == rows_fingerprint([dict(r) for r in rows])
    assert rows_fingerprint(rows) != rows_fingerprint([rows[0], {**rows[1], "answer": "5"}])
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "model.safetensors").write_bytes(b"w" * (3 << 20))
    (tmp_path / "m" / "config.json").write_text("{}")
    before = weights_fingerprint(str(tmp_path / "m"))
    os.utime(tmp_path / "m" / "model.safetensors", (0, 0))  # another mtime (a copy): the same weights
    assert weights_fingerprint(str(tmp_path / "m")) == before and weights_fingerprint("tiny") is None
    (tmp_path / "m" / "config.json").write_text('{"x": 1}')
    assert weights_fingerprint(str(tmp_path / "m")) != before
    assert changes({"data": "1", "model.path": "2"}, {"data": "1", "model.path": "3", "model.ref_path": "4"}) == \
        ["model.path"]


@pytest.mark.parametrize("where,err", [("export", "EROFS"), ("trajectories", "ENOSPC"), ("metrics", "EACCES")])
def test_a_write_that_fails_late_is_one_line_saying_the_checkpoint_is_intact(tmp_path, monkeypatch, capsys, where,
                                                                             err):
    """Before the fix: a read-only folder at export was a traceback; a full disk while writing trajectories did not say
    which file or that the last checkpoint stood."""
    import errno

    import train
    import r1.trajectory
    import r1.weights

    def fail(*a, **k):
        raise OSError(getattr(errno, err), os.strerror(getattr(errno, err)))

    import r1.logger

    target = {"export": (r1.weights, "save_hf"), "trajectories": (r1.trajectory, "save"),
              "metrics": (r1.logger.Logger, "log")}[where]
    monkeypatch.setattr(*target, fail)
    run = tmp_path / "run"
    with pytest.raises(SystemExit) as e:
        train.main(["--config", SMOKE, f"run.dir={run}", "train.steps=1", "rollout.prompts=2", "rollout.n=2",
                    "rollout.max_new_tokens=4", "data.train_size=4", "log.tensorboard=false", "log.progress=false"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 1 and len(lines) == 1, lines
    if where == "export":
        assert f"could not write the export {run}/hf: permission denied" in lines[0]
        assert f"{run}/checkpoints/iter_000001 is intact" in lines[0]
    elif where == "trajectories":
        assert f"could not write trajectory file {run}/trajectories/iter_000001.jsonl.gz" in lines[0]
        assert "no space left on device; no checkpoint was written yet" in lines[0]
    else:  # a run folder made read-only mid-run (before the fix: a traceback)
        assert f"could not write metrics {run}/metrics.jsonl: permission denied" in lines[0]


def test_non_finite_weights_and_a_tiny_temperature_are_refused_at_start(tmp_path):
    """Before the fix: a reference with NaN weights made every update skip with exit 0; a temperature of 1e-40
    overflowed the logits and was reported as broken weights after the first rollout."""
    import transformers

    from r1.config import ConfigError, load_config

    for key in ("rollout.temperature", "eval.temperature"):
        with pytest.raises(ConfigError, match=rf"{key}.* must be 0 \(greedy\) or >= 0.001, got 1e-40"):
            load_config(SMOKE, [f"{key}=1e-40"])
    config = transformers.LlamaConfig(vocab_size=49152, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    model = transformers.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        model.model.layers[0].mlp.up_proj.weight[0, 0] = float("nan")
    model.save_pretrained(tmp_path / "ref")
    proc = subprocess.run([sys.executable, "train.py", "--config", SMOKE, f"run.dir={tmp_path / 'run'}",
                           f"model.ref_path={tmp_path / 'ref'}", "algo.kl_coef=0.1", "train.steps=1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-800:]
    assert "holds non-finite weights (NaN or inf in model.layers.0.mlp.up_proj" in lines[0] and not (tmp_path / "run").exists()
