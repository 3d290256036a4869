"""r1/disk.py: the start-up disk plan.

The estimates are checked against what the code really writes: a tiny RL run's
checkpoint (policy and critic) and its float32 export, a tiny SFT run's
checkpoint (policy only), tensor counts against the modules (and, in
tests/test_trainer.py, a checkpoint sharded over 2 ranks); and against a
measured run (the 3B shape, policy + critic on 2 ranks: `du -h` said 65G).
The counts of saves and of checkpoints on disk at once are checked against a
replay of the trainer's save-and-prune loop. Then the refusal, one line naming
the key, before run.dir exists; and evaluation, which saves nothing, is never
refused.
"""
import importlib
import os

import pytest

import train
from r1 import disk
from r1.config import load_config
from r1.memory import param_count
from r1.model import Transformer, tiny_config
from test_memory import QWEN3B_SMOL, refusal  # the 3B shape of the 2 x H200 run; a one-line ConfigError

GiB = 2 ** 30
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMOKE = os.path.join(ROOT, "configs", "smoke.yaml")
TINY = ["rollout.prompts=2", "rollout.n=2", "rollout.max_new_tokens=8", "data.train_size=16", "data.test_size=4",
        "log.tensorboard=false"]


def folder_bytes(path) -> int:
    return sum(os.path.getsize(os.path.join(r, f)) for r, _, files in os.walk(path) for f in files)


# ------------------------------------------------------------------ sizes


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("tie", [True, False])
def test_tensor_count_is_the_modules(arch, tie):
    mc = tiny_config(arch, tie=tie, vocab_size=97, num_layers=3)
    for value_head in (False, True):
        assert disk.tensor_count(mc, value_head) == len(Transformer(mc, value_head=value_head).state_dict())


def test_rl_checkpoint_and_export_estimates_match_what_a_tiny_run_writes(tmp_path, capsys):
    """The smoke config trains a policy and a critic (step_gae) and exports float32 on the CPU."""
    run = tmp_path / "run"
    args = [f"run.dir={run}", *TINY, "train.steps=1"]
    train.main(["--config", SMOKE, *args])
    cfg = load_config(SMOKE, args)
    mc = tiny_config(cfg.model.arch, tie=True, vocab_size=49152, num_layers=cfg.model.tiny_layers,
                     hidden_size=cfg.model.tiny_hidden, intermediate_size=2 * cfg.model.tiny_hidden)
    written = folder_bytes(run / "checkpoints" / "iter_000001")
    est = disk.checkpoint_bytes(cfg, mc, world=1)
    assert est > 12 * (param_count(mc) + param_count(mc, value_head=True))  # both models
    assert written <= est < 1.005 * written, (est, written)  # an upper bound, within 0.5%
    weights = os.path.getsize(run / "hf" / "model.safetensors")
    assert abs(4 * param_count(mc) - weights) < 0.001 * weights  # float32 on the CPU, the tied head once
    hf = folder_bytes(run / "hf")
    assert hf <= disk.hf_bytes(mc, 4) <= hf + disk.TOKENIZER_BYTES * mc.vocab_size
    # the plan was printed once, before the run, with these numbers
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("disk plan")]
    assert len(lines) == 1 and f"checkpoint {disk._gib(est)} x 1 + hf/ {disk._gib(disk.hf_bytes(mc, 4))}" in lines[0]


def test_sft_checkpoint_estimate_matches_what_a_tiny_sft_run_writes(tmp_path, tok_dir, capsys):
    run = tmp_path / "sft"
    args = [f"run.dir={run}", f"model.tokenizer={tok_dir}", *TINY, "train.stage=sft", "train.steps=1",
            "train.sft_batch=2"]
    train.main(["--config", SMOKE, *args])
    cfg = load_config(SMOKE, args)
    mc = tiny_config(cfg.model.arch, tie=True, vocab_size=49152, num_layers=cfg.model.tiny_layers,
                     hidden_size=cfg.model.tiny_hidden, intermediate_size=2 * cfg.model.tiny_hidden)
    written = folder_bytes(run / "checkpoints" / "iter_000001")
    est = disk.checkpoint_bytes(cfg, mc, world=1)  # the policy alone: SFT trains no critic
    assert 12 * param_count(mc) < est and written <= est < 1.005 * written, (est, written)
    assert "disk plan: checkpoint" in capsys.readouterr().out


def test_two_h200_3b_checkpoint_is_the_measured_65_gib():
    """2 x H200: Qwen2.5-3B shape with SmolLM2's vocabulary (2.88 B parameters), policy + critic, FSDP on 2
    ranks: `du -h` of one checkpoint said 65G (it rounds up), of hf/ (bf16) 5.4G; 115 GiB were free."""
    cfg = load_config(SMOKE, ["model.path=/root/r1-3b", "run.dir=/root/sc/n2", "train.steps=2"])
    assert param_count(QWEN3B_SMOL) == 2_875_437_056
    ck = disk.checkpoint_bytes(cfg, QWEN3B_SMOL, world=2)
    assert 64 * GiB < ck <= 65 * GiB
    assert 5.3 * GiB < disk.hf_bytes(QWEN3B_SMOL, 2) < 5.45 * GiB
    msg = refusal(lambda: disk.plan(cfg, QWEN3B_SMOL, 2, "cuda", disk.Found("/root/sc", 115 * GiB)))
    assert msg.startswith("disk: 2 checkpoints of 64.3 GiB + hf/ 5.4 GiB need 133.9 GiB under /root/sc "
                          "(115.0 GiB free, 18.9 GiB short)"), msg
    # keep_checkpoints=1 would not help (2 saves, the second written before the first is pruned): not offered
    assert "train.checkpoint_every=2" in msg and "keep_checkpoints" not in msg and "run.dir" in msg


# ------------------------------------------------------------------ counts


def replay(steps, every, keep, start=0, existing=0, stop=None):
    """r1/trainer.py fit + r1/checkpoint.py save, on a list of names: (saves, most on disk at once)."""
    on_disk, most, n = list(range(existing)), existing, 0
    for it in range(start, steps):
        out_of_time = stop is not None and it + 1 >= stop
        if (it + 1) % every == 0 or it + 1 == steps or out_of_time:
            n += 1
            on_disk.append(it + 1)
            most = max(most, len(on_disk))
            on_disk = on_disk[-keep:]
        if out_of_time:
            break
    return n, most


@pytest.mark.parametrize("steps", [0, 1, 2, 3, 7, 10, 12])
@pytest.mark.parametrize("every", [1, 2, 3, 5, 100])
@pytest.mark.parametrize("keep", [1, 2, 3])
def test_saves_and_coexisting_replay_the_trainer(steps, every, keep):
    for start in range(0, steps + 1):
        for existing in ([0] if start == 0 else [0, 1, keep, keep + 2]):
            n, most = replay(steps, every, keep, start, existing)
            assert disk.saves(steps, every, start) == n
            assert disk.coexisting(n, keep, existing) == most, (steps, every, keep, start, existing)


@pytest.mark.parametrize("steps,every,keep", [(10, 3, 2), (10, 100, 2), (6, 3, 1), (5, 1, 3), (12, 5, 2)])
def test_a_time_limit_never_adds_checkpoints(steps, every, keep):
    """train.time_limit ends the run after some iteration with a save there: never more saves, nor more
    checkpoints at once, than running to the end."""
    full_n, full_most = replay(steps, every, keep)
    for stop in range(1, steps + 1):
        n, most = replay(steps, every, keep, stop=stop)
        assert disk.saves(steps, every, stop=stop) == n <= full_n
        assert disk.coexisting(n, keep) == most <= full_most


# ------------------------------------------------------------------ the plan


def tiny_plan(*overrides, free, found_checkpoints=None, sft_of=None):
    cfg = load_config(SMOKE, ["run.dir=/data/run", *overrides])
    mc = tiny_config("llama", vocab_size=1000, num_layers=2)
    return cfg, mc, lambda: disk.plan(cfg, mc, 1, "cpu", disk.Found("/data", free, found_checkpoints or {}), sft_of)


def test_plan_line_and_refusal_naming_the_keys():
    cfg, mc, _ = tiny_plan(free=0)
    ck, hf = disk.checkpoint_bytes(cfg, mc, 1), disk.hf_bytes(mc, 4)
    steps = ["train.steps=10", "train.keep_checkpoints=3"]  # 4 checkpoints at once
    _, _, fits = tiny_plan(*steps, free=4 * ck + hf)
    line = fits()
    assert "\n" not in line and line.startswith(f"disk plan: checkpoint {disk._gib(ck)} x 4 + hf/")
    assert line.endswith("free under /data")
    _, _, short = tiny_plan(*steps, free=4 * ck + hf - 1)
    msg = refusal(short)
    assert msg.startswith("disk: 4 checkpoints of") and "under /data" in msg
    assert "set train.keep_checkpoints=2 or train.checkpoint_every=4, or use a run.dir on a larger disk" in msg
    _, _, tiny = tiny_plan(*steps, free=ck)  # not even one checkpoint and the export
    assert refusal(tiny).endswith("; use a run.dir on a larger disk")


def test_checkpoints_a_resume_prunes_count_as_room():
    cfg, mc, _ = tiny_plan(free=0)
    ck, hf = disk.checkpoint_bytes(cfg, mc, 1), disk.hf_bytes(mc, 4)
    held = {"/data/run": (2, 2 * ck, 4)}  # iter 3 and 4 on disk; resuming to 10 keeps 2, writes a third first
    _, _, fits = tiny_plan("train.steps=10", "run.resume=true", free=ck + hf, found_checkpoints=held)
    assert "of earlier checkpoints" in fits()
    _, _, short = tiny_plan("train.steps=10", "run.resume=true", free=ck + hf - 1, found_checkpoints=held)
    msg = refusal(short)
    assert msg.startswith("disk: 3 checkpoints") and ", 0.0 MiB short); free 0.0 MiB under /data" in msg, msg
    assert "larger disk" not in msg  # moving run.dir away would start the run over
    done = {"/data/run": (2, 2 * ck, 10)}  # finished: resuming saves nothing and its hf/ is there already
    _, _, finished = tiny_plan("train.steps=10", "run.resume=true", free=0, found_checkpoints=done)
    assert "x 2 + hf/ 0.0 MiB" in finished()


def test_sft_phase_and_rl_phase_are_planned_together():
    from r1.sft import warmup_config

    cfg, mc, _ = tiny_plan(free=0)
    ck_sft = disk.checkpoint_bytes(warmup_config(cfg), mc, 1)  # the policy alone
    ck_rl, hf_rl, hf_sft = disk.checkpoint_bytes(cfg, mc, 1), disk.hf_bytes(mc, 4), disk.hf_bytes(mc, 4)
    assert ck_sft < ck_rl
    # SFT: 30 steps saved every 10 x checkpoint_every, 2 kept (3 at once); RL: 4 iterations, 2 kept (3 at once),
    # beside the SFT phase's export (its checkpoints removed by then)
    rl_need = hf_sft + 3 * ck_rl + hf_rl
    over = ["train.sft_steps=30", "train.steps=4"]
    _, _, fits = tiny_plan(*over, free=rl_need, sft_of=warmup_config)
    line = fits()
    assert line.startswith(f"disk plan: SFT checkpoint {disk._gib(ck_sft)} x 3 + sft/hf/")
    assert ", then RL checkpoint" in line and f"peak {disk._gib(rl_need)}" in line
    _, _, short = tiny_plan(*over, free=rl_need - 1, sft_of=warmup_config)
    assert refusal(short).startswith("disk: 3 RL checkpoints")


# ------------------------------------------------------------------ start-up


def test_a_run_without_room_is_refused_in_one_line_before_run_dir_exists(tmp_path, monkeypatch, capsys):
    real = disk.shutil.disk_usage
    monkeypatch.setattr(disk.shutil, "disk_usage", lambda p: real(p)._replace(free=200 * 2**20))
    run = tmp_path / "run"
    with pytest.raises(SystemExit) as e:
        train.main(["--config", SMOKE, *TINY, f"run.dir={run}", "train.steps=4", "train.keep_checkpoints=3"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: disk: 4 checkpoints of"), err
    assert "train.keep_checkpoints=1" in err[0] and "run.dir" in err[0]
    assert not run.exists()


def test_sft_phase_is_refused_before_it_starts(tmp_path, tok_dir, monkeypatch, capsys):
    real = disk.shutil.disk_usage
    monkeypatch.setattr(disk.shutil, "disk_usage", lambda p: real(p)._replace(free=10 * 2**20))
    run = tmp_path / "run"
    with pytest.raises(SystemExit) as e:
        train.main(["--config", SMOKE, *TINY, f"run.dir={run}", f"model.tokenizer={tok_dir}", "train.sft_steps=2"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "error: disk: " in err and not (run / "sft" / "metrics.jsonl").exists()


def test_evaluation_saves_nothing_and_is_never_refused(tmp_path, monkeypatch, capsys):
    real = disk.shutil.disk_usage
    monkeypatch.setattr(disk.shutil, "disk_usage", lambda p: real(p)._replace(free=0))
    eval_py = importlib.import_module("eval")
    eval_py.main(["--config", SMOKE, "eval.limit=2", f"eval.out={tmp_path / 'eval'}", "rollout.max_new_tokens=4"])
    assert "disk plan" not in capsys.readouterr().out


def test_a_disk_that_cannot_be_measured_is_one_line(tmp_path, monkeypatch, capsys):
    """Rank 0 measures for every rank: its failure is turned into the same one-line error on all of them
    (under torchrun the others would otherwise wait in the gather forever)."""
    def broken(path):
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(disk.shutil, "disk_usage", broken)
    with pytest.raises(SystemExit) as e:
        train.main(["--config", SMOKE, *TINY, f"run.dir={tmp_path / 'run'}", "train.steps=1"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: disk: could not measure the free space for run.dir"), err


def test_a_run_that_saves_nothing_plans_nothing_and_writes_nothing(tmp_path, monkeypatch, capsys):
    """run.save=false (benchmarks of big shapes): no checkpoint, no hf/, so no disk is needed for them."""
    real = disk.shutil.disk_usage
    monkeypatch.setattr(disk.shutil, "disk_usage", lambda p: real(p)._replace(free=0))
    run = tmp_path / "run"
    train.main(["--config", SMOKE, *TINY, f"run.dir={run}", "train.steps=2", "run.save=false"])
    plan = [x for x in capsys.readouterr().out.splitlines() if x.startswith("disk plan")]
    assert len(plan) == 1 and plan[0].startswith("disk plan: checkpoint") and " x 0 + hf/ 0.0 MiB = 0.0 MiB" in plan[0]
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 2
    assert not (run / "hf").exists() and not os.listdir(run / "checkpoints")
    with pytest.raises(SystemExit) as e:  # a resume finds nothing to start from, and says so
        train.main(["--config", SMOKE, *TINY, f"run.dir={run}", "train.steps=3", "run.resume=true"])
    assert "has no complete checkpoint to resume from" in str(e.value.code)


def test_a_resume_may_stop_saving(tmp_path):
    """run.save is where results go, not what the run is: a resume may turn it off (and writes no checkpoint)."""
    run = tmp_path / "run"
    train.main(["--config", SMOKE, *TINY, f"run.dir={run}", "train.steps=2"])
    train.main(["--config", SMOKE, *TINY, f"run.dir={run}", "train.steps=3", "run.resume=true", "run.save=false"])
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 3
    assert sorted(os.listdir(run / "checkpoints")) == ["iter_000001", "iter_000002", "latest"]


def test_save_false_refuses_an_sft_warm_up(tmp_path):
    from r1.config import ConfigError

    with pytest.raises(ConfigError, match=r"run.save.*=false leaves no SFT export .* train.sft_steps=0, got 2"):
        load_config(SMOKE, [f"run.dir={tmp_path}", "run.save=false", "train.sft_steps=2"])
