"""Entry point: `python train.py --config configs/smoke.yaml key=value ...` (or under torchrun).

train.stage=rl runs the RL loop (r1/trainer.py); with train.sft_steps > 0 it first runs an SFT warm-up
on the task's expert chats in run.dir/sft/ (r1/sft.py) and starts RL from that policy, all in one
command that `run.resume=true` continues at any point. train.stage=sft runs SFT alone. With
eval.every > 0 it hands the trainer the held-out evaluation (r1/evaluate.py, which the trainer does
not import) and logs the starting policy's as iteration 0.

Exit codes (the same for eval.py): 0 done; 2 a user error found at start (config, paths, data, model,
a run folder in the way or resumed with another config: one `error:` line, nothing written); 130
stopped with Ctrl-C (one line saying which iteration the run resumes after, and the command; before
the first checkpoint, what it created is removed); 1 a failure during training (one `error:` line for
a full disk, an unwritable checkpoint, an all-NaN policy or an env whose reset() raised; other
failures keep their traceback).
"""
if __name__ == "__main__":  # first: Ctrl-C while the imports below load says one line (r1/interrupt.py)
    from r1.interrupt import quiet_start

    quiet_start()

import argparse
import functools
import gc
import os
import shutil
import shlex
import sys

from r1.config import ConfigError, describe, header, load_config, plural
from r1.exits import USER_ERRORS, NodeError, run_main, says
from r1.interrupt import started


def sft_phase(cfg):
    """The SFT phase of an RL run: its set-up (None when it is done already). Checks run.dir first."""
    from r1.sft import setup_sft, warmup_config, warmup_done

    if not cfg.run.resume and os.path.isdir(cfg.run.dir) and os.listdir(cfg.run.dir):
        raise NodeError(f"run.dir {cfg.run.dir} exists and is not empty; pass run.resume=true to continue it "
                        f"or choose another run.dir (nothing was overwritten)")
    main = int(os.environ.get("RANK", "0")) == 0
    if warmup_done(cfg.run.dir):
        if main:
            print(f"SFT warm-up done in {os.path.join(cfg.run.dir, 'sft')}; RL starts from its policy", flush=True)
        return None
    sft = warmup_config(cfg)
    if not sft.run.resume and os.path.isdir(sft.run.dir) and os.listdir(sft.run.dir):
        raise NodeError(f"{sft.run.dir} holds an SFT phase that stopped before its first checkpoint; "
                        f"remove it (or choose another run.dir) and run again")
    if main:
        what = f"resuming from step {_sft_step(sft.run.dir)}" if sft.run.resume else "starting"
        print(f"SFT warm-up: {plural(cfg.train.sft_steps, 'step')} on the task's expert chats in {sft.run.dir} "
              f"({what}), then RL", flush=True)
    return setup_sft(sft, then_rl=cfg)


def rl_after_sft(cfg):
    """Point the RL run at the SFT phase's policy (and its critic and reference init)."""
    from r1 import checkpoint

    cfg.model.path = os.path.join(cfg.run.dir, "sft", "hf")
    if cfg.run.resume and not checkpoint.latest(cfg.run.dir) and not os.path.exists(
            os.path.join(cfg.run.dir, "metrics.jsonl")):
        cfg.run.resume = False  # the SFT phase is all there is so far: RL starts fresh


def check_rl_resume(cfg):
    """run.resume=true on an RL run with checkpoints: the checks the trainer makes at its start (the same run,
    r1/run.check_run_dir), made with the model.path RL will have (rl_after_sft) before the SFT phase runs, so
    that a refused resume writes nothing and trains nothing first."""
    import copy

    from r1 import checkpoint
    from r1.run import check_run_dir
    from r1.sft import warmup_done

    if not cfg.run.resume or not checkpoint.complete(cfg.run.dir):
        return
    if not warmup_done(cfg.run.dir):  # running it again would make another policy than the one RL started from
        sft = os.path.join(cfg.run.dir, "sft")
        raise NodeError(f"run.resume=true: {cfg.run.dir} has RL checkpoints but its SFT phase ({sft}, the policy "
                        f"RL started from{' and the base its LoRA adapters need' if cfg.model.lora_rank else ''}) "
                        f"is gone or unfinished; put {sft} back, or resume with train.sft_steps=0 "
                        f"model.path=MODEL run.allow_config_change=true")
    rl = copy.deepcopy(cfg)
    rl.model.path = os.path.join(cfg.run.dir, "sft", "hf")
    check_run_dir(rl)


def _sft_step(run_dir):
    """The step of the SFT phase's latest checkpoint: its folder is named iter_<step> (r1.checkpoint)."""
    from r1 import checkpoint

    return int(os.path.basename(checkpoint.latest(run_dir)).rpartition("_")[2])


def _free_cuda():
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def fail(e, same_on_every_rank=False):
    """One line, exit 2. A config error is the same on every rank: under torchrun only rank 0 prints it; an
    error about this node's files (NodeError), local rank 0 (r1.exits.says)."""
    if says(e, run_wide=same_on_every_rank):
        print(f"error: {e}", file=sys.stderr)
    sys.exit(2)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", action="append", help="YAML config file; repeat to layer files (e.g. a base config, then an ablation)")
    p.add_argument("--keys", nargs="?", const="", metavar="SECTION",
                   help="list every config key (or one section's, e.g. --keys algo) with its default and meaning")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. train.steps=4 algo.advantage=grpo")
    a = p.parse_args(argv)
    a.argv = list(sys.argv[1:] if argv is None else argv)
    if a.keys is not None:
        try:
            print(describe(a.keys))
        except ConfigError as e:
            fail(e)
        return
    try:
        cfg = load_config(a.config, a.overrides)
    except ConfigError as e:
        fail(e, same_on_every_rank=True)
    if int(os.environ.get("RANK", "0")) == 0:  # the resolved config goes to run.dir/config.yaml, not here
        print(header(cfg, a.config), flush=True)
    try:
        from r1.run import check_paths, use_kernels

        use_kernels(cfg)  # the code paths of config section kernels, for this process

        check_paths(cfg)  # a missing model or data path names its key before any other line
    except ConfigError as e:
        fail(e)
    before = _listing(cfg.run.dir)
    started()  # from here a Ctrl-C says what is kept in run.dir (_interrupted)
    try:
        run(cfg, a)
    except KeyboardInterrupt:
        sys.exit(_interrupted(cfg, a, before))
    except Exception as e:  # noqa: BLE001 - the known failures of a run get one line, the rest their traceback
        if not _one_line_failure(e):
            raise
        print(f"error: {'no space left on device: ' if isinstance(e, OSError) else ''}{e}", file=sys.stderr)
        sys.exit(1)


def _one_line_failure(e) -> bool:
    from r1.atomic import describe_os_error
    from r1.checkpoint import CheckpointError
    from r1.tasks.registry import TaskError
    from r1.trainer import TrainingStopped

    if isinstance(e, OSError):
        return describe_os_error(e) == "no space left on device"
    return isinstance(e, (CheckpointError, TrainingStopped, TaskError))  # TaskError: the task's env raised


def _listing(d: str):
    """The names in run.dir before this command touched it (None: there was no such folder)."""
    return set(os.listdir(d)) if os.path.isdir(d) else None


def _interrupted(cfg, a, before) -> int:
    """Ctrl-C: one line saying what is kept and how to go on; no traceback. Exit status 130.

    Before the first checkpoint (RL's, or the SFT phase's) there is nothing to resume: what this command
    created in run.dir is removed (a folder or file that was there before it started is never touched), so
    the same command starts over; a finished SFT phase stays and run.resume=true starts RL from it. A run with
    run.save=false keeps everything: its logs are all it was for."""
    from r1 import checkpoint
    from r1.sft import warmup_done

    if int(os.environ.get("RANK", "0")) != 0:
        return 130
    d = cfg.run.dir
    if not cfg.run.save:  # a measurement: what it logged is the result, and no checkpoint was ever coming
        print(f"interrupted: run.save=false, so there is nothing to resume; {d} keeps what the run logged "
              f"(metrics.jsonl)", file=sys.stderr, flush=True)
        return 130
    last = checkpoint.latest(d)
    sft_dir = os.path.join(d, "sft")
    sft = None if last else checkpoint.latest(sft_dir)
    sft_kept = bool(sft) or (cfg.train.stage == "rl" and warmup_done(d))
    args = shlex.join(x for x in a.argv if not x.startswith("run.resume="))
    if last is not None or sft_kept:
        if last or sft:
            it = int(os.path.basename(last or sft).split("_")[1])
            where = f"after iteration {it}" if last else f"after SFT step {it}"  # the step its checkpoint holds
        else:
            where = "the finished SFT phase (RL starts from its policy)"
        if not last:
            _remove_new(d, before, keep={"sft"})
        # train.overlap: a checkpoint lacks the weights the next rollout would sample with, so the run resumes
        # synchronously (the trainer refuses an overlapped resume: r1/overlap.py)
        sync = " train.overlap=0 run.allow_config_change=true" if last and cfg.train.overlap else ""
        print(f"interrupted: {d} resumes {where} with: python train.py {args} run.resume=true{sync}",
              file=sys.stderr, flush=True)
        return 130
    removed = _remove_new(d, before)
    if before is None or removed:
        print(f"interrupted before the first checkpoint: nothing to resume, so {d} was removed "
              f"(what this command created); run the same command to start again", file=sys.stderr, flush=True)
    else:
        print(f"interrupted before the first checkpoint: nothing to resume; {d} held files before this command "
              f"and was left as it was", file=sys.stderr, flush=True)
    return 130


def _remove_new(d: str, before, keep=()) -> bool:
    """Remove what this command created in run.dir (names not in `before`, except `keep`), and run.dir itself
    when this command created it and nothing else is left. True when something was removed."""
    if not os.path.isdir(d):
        return False
    new = set(os.listdir(d)) - (before or set()) - set(keep)
    for name in new:
        p = os.path.join(d, name)
        shutil.rmtree(p, ignore_errors=True) if os.path.isdir(p) and not os.path.islink(p) else os.remove(p)
    if before is None and not os.listdir(d):
        os.rmdir(d)
        return True
    return bool(new)


def run(cfg, a):
    from r1.checkpoint import CheckpointError
    from r1.sft import train_sft

    if cfg.train.stage == "sft" or cfg.train.sft_steps:
        try:
            if cfg.train.stage == "rl":
                check_rl_resume(cfg)  # a resume the RL phase would refuse is refused before any SFT step runs
                from r1.tasks.data import load_rows, rl_rows

                rl_rows(cfg, load_rows(cfg, "train"))  # so is a data.rl_max_difficulty that leaves RL no row
            if cfg.train.stage == "sft":
                from r1.sft import setup_sft

                sft = setup_sft(cfg)
            else:
                sft = sft_phase(cfg)
        except (*USER_ERRORS, CheckpointError) as e:  # set-up errors are the user's: one line, exit 2
            fail(e)
        if sft is not None:
            train_sft(sft)  # a failure during training keeps its traceback
            del sft
            gc.collect()
            _free_cuda()
            if cfg.train.stage == "rl" and int(os.environ.get("RANK", "0")) == 0:
                # the phase is done and exported (sft/hf): no resume needs its optimizer state any more
                shutil.rmtree(os.path.join(cfg.run.dir, "sft", "checkpoints"), ignore_errors=True)
        if cfg.train.stage == "sft":
            return
        rl_after_sft(cfg)
    try:
        from r1.tasks.data import load_rows
        from r1.trainer import Trainer

        eval_rows = load_rows(cfg, cfg.eval.split) if cfg.eval.every else []  # a bad split fails before run.dir
        job = Trainer(cfg)
    except (*USER_ERRORS, CheckpointError) as e:
        fail(e)
    evaluation = None
    if cfg.eval.every:  # the trainer runs it every eval.every iterations, on its current weights
        from r1.evaluate import evaluate

        evaluation = functools.partial(evaluate, rows=eval_rows, cfg=cfg)
        if job.start == 0:
            eval_before(job, evaluation)
    job.fit(evaluation)  # a failure during training keeps its traceback
    if job.d.main:
        from r1.summary import summarize_run

        print("\n" + "\n".join(summarize_run(cfg.run.dir)), flush=True)  # hints on run.dir/config.yaml


def eval_before(job, evaluation):
    """Held-out accuracy of the starting policy, logged as iteration 0, so every curve has a 'before'."""
    res = job.held_out(evaluation)
    bar, job.logger.bar = job.logger.bar, None  # iteration 0 is not a step of the progress bar
    job.logger.log(0, res)
    job.logger.bar = bar
    if job.d.main:
        split = "validation" if job.cfg.eval.split == "val" else "held-out"  # eval.split=val: not the test set
        print(f"{split} accuracy before RL: {100 * res.get('eval_accuracy', 0):.1f}% of {res.get('eval_n', 0)} "
              f"problems", flush=True)


if __name__ == "__main__":
    run_main(main)
