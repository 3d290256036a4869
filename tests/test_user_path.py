"""The user's path: what a newcomer meets at the start and end of a run, and after a Ctrl-C.

CPU, a tiny random model, seconds per test; no test reads a wall clock.
"""
import os
import subprocess
import sys
import textwrap
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMOKE = os.path.join(ROOT, "configs", "smoke.yaml")
TINY = ["rollout.prompts=2", "rollout.n=2", "rollout.max_new_tokens=8", "data.train_size=16", "log.tensorboard=false",
        "log.progress=false", "train.steps=1"]


def stop_at(monkeypatch, n):
    """Ctrl-C in RL iteration n (0-based), as a KeyboardInterrupt raised there."""
    from r1.trainer import Trainer

    real = Trainer.iteration

    def iteration(self, it):
        if it == n:
            raise KeyboardInterrupt
        return real(self, it)

    monkeypatch.setattr(Trainer, "iteration", iteration)


# -- 1. a GPU-sized run on a CPU says what it will cost --------------------------------------------

def test_cpu_cost_line_after_the_first_step():
    from r1.logger import cpu_cost_line

    line = cpu_cost_line("step", 1, 16.2, 467, "cpu")
    assert line.startswith("cpu: step 1 took 16.2 s; 467 steps \u2248 2 h 6 min (a GPU is advised")
    assert cpu_cost_line("iteration", 4, 100.0, 70, "cpu").startswith("cpu: iteration 4 took 100.0 s; 70 iterations")
    assert cpu_cost_line("step", 1, 16.2, 467, "cuda") is None  # a GPU says nothing
    assert cpu_cost_line("step", 1, 1.0, 60, "cpu") is None  # a minute on the CPU: nothing to warn about


def test_a_cpu_run_prints_the_cost_line(tmp_path, monkeypatch, capsys):
    """The line is printed by the loop itself (the threshold forced to 0: no run here is long)."""
    import train
    from r1 import logger

    monkeypatch.setattr(logger.cpu_cost_line, "__defaults__", (0.0,))
    train.main(["--config", SMOKE, *TINY, f"run.dir={tmp_path / 'run'}", "train.steps=2"])
    out = capsys.readouterr().out
    assert len([x for x in out.splitlines() if x.startswith("cpu: iteration 1 took ")]) == 1
    assert "; 2 iterations \u2248 " in out


# -- 2. Ctrl-C before the first checkpoint -------------------------------------------------------

def test_ctrl_c_before_the_first_checkpoint_removes_the_new_run_folder(tmp_path, monkeypatch, capsys):
    import train

    run = tmp_path / "runs" / "r"
    stop_at(monkeypatch, 0)
    with pytest.raises(SystemExit) as e:
        train.main(["--config", SMOKE, *TINY, f"run.dir={run}"])
    assert e.value.code == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nothing to resume, so" in err[0] and "was removed" in err[0]
    assert "run the same command to start again" in err[0]
    assert not run.exists() and (tmp_path / "runs").is_dir()  # the parent was there before: kept
    monkeypatch.undo()
    train.main(["--config", SMOKE, *TINY, f"run.dir={run}"])  # the same command starts over
    assert (run / "hf").is_dir()


def test_ctrl_c_keeps_a_run_that_saves_nothing(tmp_path, monkeypatch, capsys):
    """run.save=false (a measurement) never has a checkpoint: Ctrl-C keeps the metrics it logged."""
    import train

    run = tmp_path / "r"
    stop_at(monkeypatch, 2)
    with pytest.raises(SystemExit) as e:
        train.main(["--config", SMOKE, *TINY, f"run.dir={run}", "train.steps=4", "run.save=false"])
    assert e.value.code == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"interrupted: run.save=false, so there is nothing to resume; {run} keeps what the run logged "
                   f"(metrics.jsonl)"]
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 2


def test_ctrl_c_in_an_overlapped_run_prints_a_resume_command_that_is_not_refused(tmp_path, monkeypatch, capsys):
    """An overlapped run cannot resume overlapped (its checkpoint lacks the next rollout's weights): the
    printed command resumes it synchronously, and it runs."""
    import shlex

    import train

    run = tmp_path / "r"
    args = ["--config", SMOKE, *TINY, f"run.dir={run}", "train.steps=3", "train.overlap=1",
            "algo.policy_loss=decoupled_ppo"]
    stop_at(monkeypatch, 2)
    with pytest.raises(SystemExit) as e:
        train.main(args)
    assert e.value.code == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].endswith("run.resume=true train.overlap=0 run.allow_config_change=true"), err
    monkeypatch.undo()
    train.main(shlex.split(err[0].split(" with: python train.py ", 1)[1]))
    assert (run / "hf").is_dir()


def test_ctrl_c_never_removes_what_was_there_before(tmp_path, monkeypatch, capsys):
    import train

    run = tmp_path / "r"
    run.mkdir()
    (run / "notes.txt").write_text("mine")
    stop_at(monkeypatch, 0)
    with pytest.raises(SystemExit) as e:
        train.main(["--config", SMOKE, *TINY, f"run.dir={run}", "run.resume=true"])
    assert e.value.code == 130
    err = capsys.readouterr().err
    assert "nothing to resume" in err
    assert sorted(os.listdir(run)) == ["notes.txt"]  # config.yaml, checkpoints/, trajectories/ of this run: gone


def test_ctrl_c_in_rl_after_a_finished_sft_phase_resumes_from_it(tmp_path, monkeypatch, capsys):
    import train

    run = tmp_path / "r"
    args = ["--config", SMOKE, *TINY, f"run.dir={run}", "train.sft_steps=1", "train.sft_batch=2"]
    stop_at(monkeypatch, 0)
    with pytest.raises(SystemExit) as e:
        train.main(args)
    assert e.value.code == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "resumes the finished SFT phase" in err[0] and err[0].endswith("run.resume=true")
    assert os.listdir(run) == ["sft"]  # RL's files went; the finished SFT phase stays
    monkeypatch.undo()
    train.main([*args, "run.resume=true"])  # what the line says works
    assert (run / "hf").is_dir()


# -- 3. eval of a run without hf/, or with an older one ------------------------------------------

def _fake_run(tmp_path, it=3, hf=False):
    run = tmp_path / "run"
    ck = run / "checkpoints" / f"iter_{it:06d}"
    if hf:
        (run / "hf").mkdir(parents=True)
        (run / "hf" / "config.json").write_text("{}")
        old = time.time() - 1000
        os.utime(run / "hf", (old, old))
    ck.mkdir(parents=True)
    (run / "checkpoints" / "latest").write_text(ck.name)
    (run / "config.yaml").write_text("run: {}\n")
    return run


def test_eval_of_a_run_without_hf_says_how_to_export(tmp_path):
    import eval as ev
    from r1.config import ConfigError

    run = _fake_run(tmp_path)
    with pytest.raises(ConfigError) as e:
        ev.run_export(str(run))
    msg = str(e.value)
    assert "no hf/ export yet" in msg and "stopped after iteration 3" in msg
    assert f"python train.py --config {run}/config.yaml run.dir={run} run.resume=true train.steps=3" in msg


def test_eval_of_a_finished_run_whose_hf_was_removed_says_so(tmp_path):
    """The checkpoint is of the run's last iteration: not "stopped before its end" but an export that is gone;
    a run folder with metrics and neither hf/ nor a checkpoint is not called "stopped before its first"."""
    import eval as ev
    from r1.config import ConfigError

    run = _fake_run(tmp_path)
    (run / "config.yaml").write_text("run: {}\ntrain:\n  steps: 3\n")
    with pytest.raises(ConfigError, match="no hf/ export \\(its last checkpoint is of iteration 3, the run's last: "
                                          "the export was removed\\); export it by resuming"):
        ev.run_export(str(run))
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.yaml").write_text("run: {}\n")
    (bare / "metrics.jsonl").write_text('{"iter": 1}\n')
    with pytest.raises(ConfigError, match="whose hf/ export and checkpoints are not there \\(its metrics.jsonl shows"):
        ev.run_export(str(bare))


def test_a_moved_run_with_its_sft_phase_resumes_and_a_missing_sft_is_refused_first(tmp_path, capsys):
    """An RL run's model.path is its own run.dir/sft/hf: after the folder is moved, the same path inside the new
    run.dir is not a config change. With sft/ gone, a resume is refused before any SFT step runs or writes."""
    import shutil

    import train

    run, moved = tmp_path / "r", tmp_path / "moved"
    args = ["--config", SMOKE, *TINY, "train.sft_steps=1", "train.sft_batch=2"]
    train.main([*args, f"run.dir={run}", "train.steps=1"])
    shutil.copytree(run, moved)  # a copy: a move in this process would carry the lock it still holds
    capsys.readouterr()
    train.main([*args, f"run.dir={moved}", "train.steps=2", "run.resume=true"])
    assert "resuming" in capsys.readouterr().out and (moved / "checkpoints" / "iter_000002").is_dir()
    shutil.rmtree(moved / "sft")
    before = sorted(os.listdir(moved))
    with pytest.raises(SystemExit) as e:
        train.main([*args, f"run.dir={moved}", "train.steps=3", "run.resume=true"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "has RL checkpoints but its SFT phase" in err[0] and "is gone or unfinished" in err[0]
    assert sorted(os.listdir(moved)) == before  # no sft/ written, nothing trained


def test_eval_main_on_a_run_without_hf_is_one_line(tmp_path, capsys):
    import eval as ev
    from r1.exits import run_main

    run = _fake_run(tmp_path)
    with pytest.raises(SystemExit) as e:
        run_main(lambda: ev.main(["--config", SMOKE, f"model.path={run}", f"eval.out={tmp_path / 'e'}"]))
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: model.path=") and "no hf/ export yet" in err[0]


def test_eval_warns_when_hf_is_older_than_the_latest_checkpoint(tmp_path, capsys):
    import eval as ev

    run = _fake_run(tmp_path, hf=True)
    assert ev.run_export(str(run)) == str(run / "hf")
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is older than" in err[0] and "iter_000003" in err[0]


def test_resuming_a_stopped_run_with_its_steps_exports_it(tmp_path, monkeypatch, capsys):
    """The command the eval error gives: resume at the checkpoint's iteration, nothing trained, hf/ written."""
    import train

    run = tmp_path / "r"
    stop_at(monkeypatch, 1)
    with pytest.raises(SystemExit):
        train.main(["--config", SMOKE, *TINY, f"run.dir={run}", "train.steps=3"])
    monkeypatch.undo()
    assert not (run / "hf").exists()
    train.main(["--config", str(run / "config.yaml"), f"run.dir={run}", "run.resume=true", "train.steps=1"])
    assert (run / "hf" / "config.json").is_file()


# -- 5. an env whose reset() raises -----------------------------------------------------------------

BAD_TASK = '''
from r1.envs.base import Env
from r1.tasks.registry import Task


class Bad(Env):
    def reset(self, sample):
        raise KeyError("question")


def rows(cfg, split):
    return [{"id": f"b-{i}", "q": "x"} for i in range(4)]


def make_env(cfg, tokenizer, tools):
    return Bad(tokenizer, max_context=cfg.env.max_context, max_new_tokens=cfg.rollout.max_new_tokens)


TASK = Task("bad_reset", rows, make_env)
'''


def test_a_raising_reset_is_one_line_naming_task_row_and_file(tmp_path, monkeypatch, capsys):
    import train

    (tmp_path / "badtask.py").write_text(textwrap.dedent(BAD_TASK))
    monkeypatch.syspath_prepend(str(tmp_path))
    run = tmp_path / "run"
    with pytest.raises(SystemExit) as e:
        train.main(["--config", SMOKE, *TINY, f"run.dir={run}", "data.task=badtask:TASK"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert "task bad_reset" in err[0] and "row 'b-0'" in err[0] and "KeyError" in err[0]
    assert f"{tmp_path / 'badtask.py'}:8" in err[0]
    assert not run.exists()


def test_a_reset_raising_mid_run_is_one_line(tmp_path, monkeypatch):
    """The rollout loop turns a reset() that raises into a TaskError (train.py prints it as one line)."""
    from r1.rollout import AgentEnvLoop
    from r1.tasks.registry import TaskError

    class Env:
        def reset(self, sample):
            raise RuntimeError("boom")

        def first_prompt(self, obs):
            return [1], None

        def close(self):
            pass

    class Gen:
        slots = 1

        def free_slots(self):
            return 1

        def finish(self):
            return []

    factory = lambda: Env()  # noqa: E731
    factory.task = "mine"
    loop = AgentEnvLoop(Gen(), None, factory, 8)
    with pytest.raises(TaskError, match=r"task mine: its env's reset\(\) of row 'r7' raised RuntimeError: boom"):
        loop.run([{"id": "r7"}])
    from train import _one_line_failure

    assert _one_line_failure(TaskError("x"))


# -- 6. the start of a run: a header, path keys named, data first ---------------------------------

def test_a_run_starts_with_a_short_header_not_the_config(tmp_path, monkeypatch, capsys):
    import train

    stop_at(monkeypatch, 0)
    with pytest.raises(SystemExit):
        train.main(["--config", SMOKE, *TINY, f"run.dir={tmp_path / 'r'}"])
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"config: {SMOKE}; run.dir {tmp_path / 'r'}")
    assert out[1].startswith("task synthetic; model tiny; algorithm step_gae (ppo); RL 1 iteration x 4 episodes")  # 1 iteration, not "1 iterations"
    assert not any(line.startswith("algo:") for line in out)  # the resolved config is in run.dir/config.yaml


@pytest.mark.parametrize("override,key,hint", [
    ("model.path=smollm2-135m", "model.path", "did you mean smollm2-135m-instruct?"),
    ("model.tokenizer=/tmp/nope-r1", "model.tokenizer", "a model key takes"),
    ("data.path=/tmp/nope-r1-data", "data.path", ""),
])
def test_a_missing_path_names_its_key(tmp_path, capsys, override, key, hint):
    import train

    with pytest.raises(SystemExit) as e:
        train.main(["--config", SMOKE, *TINY, f"run.dir={tmp_path / 'r'}", override])
    assert e.value.code == 2
    out, err = capsys.readouterr()
    assert err.startswith(f"error: config key {key}=") and hint in err and len(err.strip().splitlines()) == 1
    assert "memory plan" not in out and not (tmp_path / "r").exists()


def test_bad_data_comes_before_the_memory_plan(tmp_path, capsys):
    import train

    with pytest.raises(SystemExit) as e:
        train.main(["--config", SMOKE, *TINY, f"run.dir={tmp_path / 'r'}", "data.task=gsm8k", f"data.path={tmp_path}"])
    assert e.value.code == 2
    out, err = capsys.readouterr()
    assert "no GSM8K split" in err and "memory plan" not in out


# -- 8. smaller -------------------------------------------------------------------------------------

def test_keys_takes_a_section_and_prints_yaml_values(capsys):
    import train

    train.main(["--keys", "model"])
    out = capsys.readouterr().out
    assert out.startswith("model:") and "rollout." not in out
    assert "model.tokenizer = null" in out
    train.main(["--keys", "rollout"])
    out = capsys.readouterr().out
    assert "rollout.slots = auto" in out
    train.main(["--keys", "log"])
    assert "log.trajectories = true" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        train.main(["--keys", "algx"])
    assert "did you mean algo?" in capsys.readouterr().err


def test_ppo_as_an_advantage_points_to_step_gae():
    from r1.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="for PPO use step_gae"):
        load_config(SMOKE, ["algo.advantage=ppo"])


def test_plot_ticks_iterations_as_whole_numbers(tmp_path, monkeypatch):
    import json

    import matplotlib.figure

    from r1 import plot

    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps({"iter": i, "reward_mean": 0.1 * i}) + "\n" for i in (1, 2, 3)))
    seen = []
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda fig, *a, **k: seen.append(fig))
    plot.plot([str(run)], ["reward_mean"], str(tmp_path / "p.png"))
    ticks = [t for t in seen[0].axes[0].get_xticks() if 1 <= t <= 3]
    assert ticks and all(float(t).is_integer() for t in ticks)


def test_trajectory_show_says_how_the_uid_counts(tmp_path, capsys):
    from r1 import trajectory

    t = trajectory.Trajectory("2-0-0", 0, "s0", [], "answered", {})
    trajectory.save([t], trajectory.iter_path(str(tmp_path), 3))
    trajectory.main(["show", str(tmp_path), "--iter", "3", "--index", "0", "--ids"])
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("iteration 3 (--iter counts from 1; the uid 2-0-0 is <iteration - 1>-<group>-<sample>)")


def test_a_missing_model_path_comes_before_the_sft_line(tmp_path, capsys):
    import train

    with pytest.raises(SystemExit) as e:
        train.main(["--config", SMOKE, *TINY, f"run.dir={tmp_path / 'r'}", "train.sft_steps=2",
                    "model.path=smollm2-135m"])
    assert e.value.code == 2
    out, err = capsys.readouterr()
    assert "SFT warm-up" not in out and "did you mean smollm2-135m-instruct?" in err


def test_eval_slots_do_not_exceed_the_rows_it_plays(tmp_path, capsys):
    """smoke.yaml's test split has 8 rows: eval.limit=100 sizes 8 slots, not 100."""
    import eval as ev

    ev.main(["--config", SMOKE, "rollout.max_new_tokens=4", "eval.limit=100", f"eval.out={tmp_path / 'e'}"])
    out = capsys.readouterr().out
    assert "kv cache 0.0 GiB (8 slots x" in out
    assert '"n": 8' in out.splitlines()[-1]


def test_output_piped_into_a_reader_that_stops_early_ends_quietly(tmp_path):
    """`python -m r1.trajectory show ... | head`: the reader closes the pipe; the command ends with status 141
    and nothing on stderr, not a BrokenPipeError traceback (run_main)."""
    script = tmp_path / "many_lines.py"
    script.write_text("import sys\nsys.path.insert(0, %r)\nfrom r1.exits import run_main\n"
                      "run_main(lambda: [print('line', i) for i in range(200_000)])\n" % ROOT)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.readline() == b"line 0\n"
    proc.stdout.close()  # the reader stops, as head does
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141 and err == ""
