"""Training faults: non-finite losses and gradients, a process killed while writing a checkpoint.

A bad update must change nothing (parameters, optimizer moments, schedule)
and say so; a run killed mid-checkpoint must leave the previous checkpoint
as `latest`, and `run.resume=true` must then reproduce the run that was
never interrupted (CPU runs are deterministic). The kill is a real SIGKILL
of a subprocess, sent from inside `dcp.save` after its data files are
written, i.e. in the window where a naive writer would have replaced the
previous checkpoint.
"""
import copy
import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch
from safetensors.torch import load_file

import r1.trainer
import train
from r1 import checkpoint
from r1.config import load_config
from r1.trainer import Trainer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMOKE = os.path.join(ROOT, "configs", "smoke.yaml")
TINY = ["rollout.prompts=2", "rollout.n=2", "rollout.max_new_tokens=8", "data.train_size=16", "log.tensorboard=false"]




def snapshot(trainer):
    """Everything an update may touch: parameters, optimizer states, scheduler states."""
    return {
        "params": {n: {k: v.detach().clone() for k, v in m.state_dict().items()} for n, m in trainer.learner.models.items()},
        "optim": {n: copy.deepcopy(o.state_dict()) for n, o in trainer.learner.optims.items()},
        "sched": {n: copy.deepcopy(s.state_dict()) for n, s in trainer.learner.scheds.items()},
    }


def same(a, b):
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if torch.is_tensor(a):
        return torch.equal(a, b)
    return a == b


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A trainer after one normal iteration, so Adam has moments and a step count to protect."""
    run = str(tmp_path_factory.mktemp("faults") / "run")
    trainer = Trainer(load_config(SMOKE, [f"run.dir={run}", *TINY]))
    m = trainer.iteration(0)
    assert m["skipped_updates"] == 0 and trainer.learner.opt.state_dict()["state"]
    yield trainer
    shutil.rmtree(os.path.dirname(run), ignore_errors=True)  # module-scoped: pytest's retention policy never removes it


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_loss_skips_update(trained, monkeypatch, bad):
    real = r1.algos.policy_losses.ppo_policy_loss

    def poisoned(*args, **kw):  # the loss is non-finite while its gradient stays finite: only the loss check sees it
        loss, m = real(*args, **kw)
        return loss + bad, m

    monkeypatch.setattr(r1.algos.policy_losses, "ppo_policy_loss", poisoned)
    before = snapshot(trained)
    with pytest.warns(UserWarning, match="non-finite loss or gradient: update skipped"):
        m = trained.iteration(1)
    assert m["skipped_updates"] == trained.cfg.algo.minibatches * trained.cfg.algo.ppo_epochs
    assert "grad_norm" not in m  # metrics describe updates that happened
    assert same(snapshot(trained), before)
    assert all(p.grad is None for mod in trained.learner.models.values() for p in mod.parameters())


@pytest.mark.parametrize("which", ["policy", "critic"])
def test_non_finite_gradient_skips_both_updates(trained, which):
    """A NaN gradient in either model skips the whole update: the policy and critic stay in step."""
    model = trained.learner.models[which]
    param = next(p for n, p in model.named_parameters() if "layers.0" in n)
    handle = param.register_hook(lambda g: torch.full_like(g, float("nan")))
    before = snapshot(trained)
    try:
        with pytest.warns(UserWarning, match="update skipped"):
            m = trained.iteration(2)
    finally:
        handle.remove()
    assert m["skipped_updates"] == trained.cfg.algo.minibatches
    assert same(snapshot(trained), before)
    m = trained.iteration(3)  # and the next clean iteration trains again
    assert m["skipped_updates"] == 0 and m["grad_norm"] > 0
    assert not same(snapshot(trained)["params"], before["params"])


def comparable(line):
    """A metrics line without wall-clock quantities (times and throughputs)."""
    return {k: v for k, v in json.loads(line).items() if not k.startswith("time_") and not k.endswith("_tok_s")}


KILL_IN_SAVE = textwrap.dedent("""
    import os, signal, sys
    import torch.distributed.checkpoint as dcp
    real_save = dcp.save

    def dying_save(state, **kw):
        real_save(state, **kw)  # the data files are on disk ...
        if os.path.basename(kw["checkpoint_id"]) == "iter_000002.tmp":
            os.kill(os.getpid(), signal.SIGKILL)  # ... and the process dies before the checkpoint is complete

    dcp.save = dying_save
    import train
    train.main(sys.argv[1:])
""")


def test_kill_during_checkpoint_then_resume(tmp_path, tok_dir):
    killed, straight = str(tmp_path / "killed"), str(tmp_path / "straight")
    args = ["--config", SMOKE, *TINY, f"model.tokenizer={tok_dir}"]
    proc = subprocess.run([sys.executable, "-c", KILL_IN_SAVE, *args, f"run.dir={killed}", "train.steps=3"],
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT}, capture_output=True, text=True, timeout=240)
    assert proc.returncode == -9, proc.stderr[-3000:]
    ck = os.path.join(killed, "checkpoints")
    assert sorted(os.listdir(ck)) == ["iter_000001", "iter_000002.tmp", "latest"]
    assert checkpoint.latest(killed) == os.path.join(ck, "iter_000001")
    with open(os.path.join(killed, "metrics.jsonl")) as f:
        assert [json.loads(x)["iter"] for x in f] == [1, 2]  # iteration 2 was logged, its checkpoint never finished

    train.main(args + [f"run.dir={killed}", "train.steps=3", "run.resume=true"])
    assert sorted(os.listdir(ck)) == ["iter_000002", "iter_000003", "latest"]  # the half-written one is gone
    train.main(args + [f"run.dir={straight}", "train.steps=3"])
    a, b = (open(os.path.join(r, "metrics.jsonl")).read().splitlines() for r in (straight, killed))
    assert [comparable(x) for x in b] == [comparable(x) for x in a]
    assert [json.loads(x)["iter"] for x in b] == [1, 2, 3]
    wa, wb = (load_file(os.path.join(r, "hf", "model.safetensors")) for r in (straight, killed))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_resume_without_a_complete_checkpoint_is_refused(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints" / "iter_000001.tmp").mkdir(parents=True)  # killed during its first checkpoint
    (run / "metrics.jsonl").write_text('{"iter": 1}\n')
    with pytest.raises(SystemExit) as e:
        train.main(["--config", SMOKE, *TINY, f"run.dir={run}", "run.resume=true"])
    assert "no complete checkpoint" in str(e.value.code) and str(run) in str(e.value.code)
    assert (run / "metrics.jsonl").read_text() == '{"iter": 1}\n'
