"""What a user meets in a command's first seconds: Ctrl-C while it imports, a config path or an argument that is
wrong, r1's modules run from another folder. Each runs the real command in a subprocess."""
import os
import signal
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMOKE = os.path.join(ROOT, "configs", "smoke.yaml")


def loading_torch(pid: int) -> bool:
    """Whether the process has mapped torch's shared library: it is in the middle of its imports."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            return "torch" in f.read()
    except OSError:
        return False


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="watches /proc/PID/maps to interrupt during imports")
@pytest.mark.parametrize("script", ["train.py", "eval.py"])
def test_ctrl_c_while_importing_says_one_line(script, tmp_path):
    """SIGINT while torch loads: exit 130 and at most 2 lines on stderr, not the import's traceback."""
    out = f"eval.out={tmp_path / 'eval'}" if script == "eval.py" else f"run.dir={tmp_path / 'run'}"
    cmd = [sys.executable, os.path.join(ROOT, script), "--config", SMOKE, out]
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for _ in range(2000):  # bounded: 2000 looks 5 ms apart
        if loading_torch(p.pid) or p.poll() is not None:
            break
        time.sleep(0.005)
    assert p.poll() is None, p.communicate()
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 130, err
    assert len(err.splitlines()) <= 2, err
    assert "interrupted" in err and "Traceback" not in err
    assert not (tmp_path / "run").exists() and not (tmp_path / "eval").exists()


def outside_env() -> dict:
    """The environment with no PYTHONPATH: what finds r1 is its installation, not this checkout on a path."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def test_r1_modules_run_from_another_folder(tmp_path):
    """`make setup` installs r1 (pip install -e .): `python -m r1.*` then works from any folder."""
    found = subprocess.run([sys.executable, "-c", "import r1"], cwd=tmp_path, env=outside_env(),
                           capture_output=True, text=True, timeout=60)
    if found.returncode != 0:
        pytest.skip("r1 is not installed in this environment (make setup runs pip install -e .)")
    p = subprocess.run([sys.executable, "-m", "r1.compare", "--help"], cwd=tmp_path, env=outside_env(),
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "usage:" in p.stdout, p.stderr


def test_a_relative_config_path_not_found_names_the_folder(tmp_path, monkeypatch):
    from r1.config import ConfigError, load_config

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as e:
        load_config("configs/smoke.yaml")
    assert f"configs/smoke.yaml in {tmp_path}" in str(e.value) and "current folder" in str(e.value)


def test_a_config_file_without_config_flag_says_did_you_mean(capsys):
    import train

    with pytest.raises(SystemExit) as e:
        train.main(["configs/smoke.yaml"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.splitlines()) == 1
    assert "did you mean --config configs/smoke.yaml?" in err


def test_eval_on_an_empty_folder_says_what_a_model_path_takes(tmp_path, capsys):
    import eval as eval_script

    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit) as e:
        eval_script.main(["--config", SMOKE, f"model.path={tmp_path / 'empty'}", f"eval.out={tmp_path / 'out'}"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.splitlines()) == 1, err
    assert "has no config.json (it is empty)" in err and "HF model folder" in err and ".gguf" in err
    assert not (tmp_path / "out").exists()


def test_an_episode_cut_at_the_token_limit_is_not_shown_as_answered():
    from r1.trajectory import Step, Trajectory, render

    def episode(finish):
        return Trajectory("0-0-0", 0, "s0", [Step([1, 2], [3, 4], [0.0, 0.0], 0.0, True, finish)], "answered", {})

    assert "termination=length (the last reply was cut at rollout.max_new_tokens" in render(episode("length"))
    assert "termination=answered\n" in render(episode("eos"))


def test_a_mistyped_key_is_reported_before_torch_loads():
    """The algorithm tables (torch functions) load only once every key is known: a typo costs no torch import."""
    code = ("import sys, train\ntry:\n    train.main(['--config', sys.argv[1], 'algo.clipp=1'])\n"
            "except SystemExit as e:\n    print(e.code, 'torch' in sys.modules)")
    p = subprocess.run([sys.executable, "-c", code, SMOKE], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.stdout.split() == ["2", "False"], p.stdout + p.stderr
    assert "unknown config key 'algo.clipp'" in p.stderr
