"""Evaluate a model on a task split: `python eval.py --config X model.path=... eval.limit=N`.

model.path may be an HF folder, a .gguf, the short name, or a run folder
(its hf/ export is used; a run without one is a one-line error that says
how to export it, and an hf/ older than the run's latest checkpoint is used
with a one-line warning). A LoRA run folder (model.lora_generator: adapters)
is evaluated as its generator ran: its base with adapter/ unmerged
(eval.adapter), since the merged hf/ export, bf16 on a GPU, rounds small
adapter updates away (bench/lora_precision.py); where its base is gone, hf/
with a warning. No trainer is built: an actor alone (r1/actor.py
`standalone`: the model in the rollout dtype and its generator) plays the
episodes of r1/evaluate.py. Prints one final JSON line with accuracy, n,
mean_turns, mean_tool_calls, malformed_rate, mean_response_len (and
pass@k with eval.n > 1); writes the greedy trajectories, eval.json and the
resolved config.yaml to eval.out (default: runs/eval-<time>/), nothing else.
"""
if __name__ == "__main__":  # first: Ctrl-C while the imports below load says one line (r1/interrupt.py)
    from r1.interrupt import quiet_start

    quiet_start("no results were written")

import argparse
import json
import os
import sys
import time

from r1.atomic import write_text
from r1.config import ConfigError, dump, load_config
from r1.exits import USER_ERRORS, node_error, run_main, says
from r1.interrupt import started


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", action="append", help="YAML config file; repeat to layer files (e.g. a base config, then an ablation)")
    p.add_argument("overrides", nargs="*")
    a = p.parse_args(argv)
    try:
        cfg = load_config(a.config, a.overrides)
    except ConfigError as e:  # the same on every rank: under torchrun only rank 0 says it
        sys.exit(f"error: {e}" if says(e, run_wide=True) else 2)  # 2: as run_main gives sys.exit(text)
    from r1.run import use_kernels

    use_kernels(cfg)  # the code paths of config section kernels, for this process
    path = cfg.model.path
    try:
        if cfg.eval.adapter and os.path.isfile(os.path.join(path, "config.yaml")):
            raise ConfigError(f"eval.adapter={cfg.eval.adapter} goes over a base model, and model.path={path} is a "
                              f"run folder (a LoRA run's adapters are put on its base already): name the base model")
        if cfg.eval.adapter:
            from r1.lora import check_peft_folder

            check_peft_folder(cfg.eval.adapter)  # before any model loads
        base = None if cfg.eval.adapter else lora_run_base(path, cfg)
        if base:
            cfg.model.path, cfg.eval.adapter = base, os.path.join(path, "adapter")
            print(f"evaluating {path} as its generator ran: its base {base} with {cfg.eval.adapter} unmerged",
                  file=sys.stderr)
        else:
            cfg.model.path = run_export(path)
    except (ConfigError, ValueError) as e:
        sys.exit(f"error: {e}")
    out = cfg.eval.out or os.path.join("runs", f"eval-{time.strftime('%Y%m%d-%H%M%S')}")
    if os.path.exists(out) and not os.path.isdir(out):
        raise node_error(f"eval.out {out} exists and is not a folder (nothing was overwritten)")
    if os.path.exists(out) and os.listdir(out):
        raise node_error(f"eval.out {out} exists and is not empty (nothing was overwritten)")
    cfg.run.dir = out
    cfg.run.resume = False
    cfg.train.steps = 0  # nothing is trained: the memory plan counts the generator alone, the disk plan nothing
    cfg.log.tensorboard = cfg.log.progress = False
    from r1.actor import standalone
    from r1.evaluate import evaluate
    from r1.run import check_paths, check_run_dir
    from r1.tasks.data import load_rows
    from r1.tasks.registry import TaskError, check_reset

    try:
        check_run_dir(cfg)  # eval.out can be written (its parent exists or can be made, and is writable)
        check_paths(cfg)
        rows = load_rows(cfg, cfg.eval.split)
        # no more slots than episodes to play (16 test rows with eval.limit=100: 16 slots, not 100)
        if cfg.eval.limit > len(rows):
            print(f"eval.limit={cfg.eval.limit}: the {cfg.eval.split} split has {len(rows)} problems; reading all "
                  f"{len(rows)}")
        cfg.eval.limit = min(cfg.eval.limit or len(rows), len(rows))
        actor = standalone(cfg)
        check_reset(cfg, actor.tok, rows)
    except USER_ERRORS as e:
        if says(e):
            print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("interrupted while starting; no results were written", file=sys.stderr)
        sys.exit(130)
    started()
    try:
        res = evaluate(actor, rows, cfg, out_dir=out)
    except TaskError as e:  # a task's env raised mid-run: one line naming the task, the row and its file:line
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print(f"interrupted: no results were written to {out}", file=sys.stderr)
        sys.exit(130)
    res["model"] = path
    res["task"] = cfg.data.task
    res["split"] = cfg.eval.split
    if actor.d.main:
        write_text(os.path.join(out, "config.yaml"), dump(cfg))  # the resolved config beside its results
        write_text(os.path.join(out, "eval.json"), json.dumps(res, indent=1) + "\n")  # with model, task, split
        from r1.trajectory import EVAL_FILE

        print(f"wrote {os.path.join(out, 'eval.json')} and the greedy episodes, "
              f"{os.path.join(out, EVAL_FILE)} (read one: python -m r1.trajectory show {out} "
              f"--index 0)", file=sys.stderr, flush=True)
        print(json.dumps(res), flush=True)


def lora_run_base(path: str, cfg) -> str | None:
    """The base model of a LoRA run folder whose generator ran the adapters unmerged (its config.yaml's
    model.path; its own sft/hf/ where the run's SFT warm-up made the base), when path is one with adapter/ and
    that base is the one it trained on; else None, and its merged hf/ is evaluated, with a warning line saying
    why: a base that is gone, whose weights differ from the run's identity.json, or, for the random tiny model,
    eval settings that would build another one. Sets model.tokenizer to the run's (hf/ carries it) if unset."""
    import yaml

    from r1.identity import weights_fingerprint

    conf, adapter = os.path.join(path, "config.yaml"), os.path.join(path, "adapter")
    if not (os.path.isdir(path) and os.path.isfile(conf) and os.path.isdir(adapter)):
        return None
    try:
        with open(conf, encoding="utf-8") as f:
            saved = yaml.safe_load(f) or {}
        model, run = saved.get("model") or {}, saved.get("run") or {}
    except (OSError, yaml.YAMLError, AttributeError):
        return None  # run_export and the loader say what is wrong with the folder
    base = model.get("path")
    if not model.get("lora_rank") or model.get("lora_generator", "adapters") != "adapters" or not base:
        return None
    if run.get("dir") and os.path.normpath(base) == os.path.normpath(os.path.join(run["dir"], "sft", "hf")):
        base = os.path.join(path, "sft", "hf")  # the run's own SFT warm-up: where the folder is now

    def merged(why: str):
        hf = os.path.join(path, "hf")
        if not os.path.isdir(hf):  # nothing to fall back on: one error line, not a warning and then another error
            raise ConfigError(f"model.path={path} is a LoRA run whose base {base} {why}, and it has no hf/ export "
                              f"to evaluate instead; put the base back at {base} (eval.py then runs it with "
                              f"{adapter} unmerged)")
        try:
            with open(os.path.join(hf, "config.json"), encoding="utf-8") as f:
                hf_conf = json.load(f)
            dtype = hf_conf.get("torch_dtype") or hf_conf.get("dtype")
        except (OSError, ValueError, AttributeError):
            dtype = None
        cost = ("which rounds small adapter updates away" if dtype in ("bfloat16", "float16") else
                "which matches the adapters up to float rounding" if dtype == "float32" else
                "which rounds small adapter updates away when saved in bf16 (on a GPU)")
        print(f"warning: {path}'s base {base} {why}: evaluating its merged hf/ export ({dtype or 'dtype unknown'}) "
              f"instead, {cost}", file=sys.stderr)

    m = cfg.model
    if base == "tiny":  # rebuilt from these settings: the run's, or another random model
        now = (m.arch, m.tiny_layers, m.tiny_hidden, cfg.run.seed)
        then = (model.get("arch", now[0]), model.get("tiny_layers", now[1]), model.get("tiny_hidden", now[2]),
                run.get("seed", now[3]))
        if now != then:
            return merged(f"is the random tiny model, and these eval settings (model.arch, model.tiny_*, run.seed) "
                          f"would build another one than the run's")
    else:
        try:
            fingerprint = weights_fingerprint(base)
        except OSError:
            return merged("is not here")
        ident = os.path.join(path, "identity.json")
        try:
            with open(ident, encoding="utf-8") as f:
                then = json.load(f).get("model.path")
        except (OSError, ValueError, AttributeError):
            then = None
        if then and then != fingerprint:
            return merged("holds other weights than the run trained on (identity.json)")
    warn_if_stale(path, adapter, "adapters")
    if m.tokenizer is None and os.path.isdir(os.path.join(path, "hf")):
        m.tokenizer = os.path.join(path, "hf")  # the run's tokenizer, saved with its export
    return base


RESUME = "python train.py --config {}/config.yaml run.dir={} run.resume=true train.steps={}"


def warn_if_stale(path: str, export: str, what: str):
    """One warning line when run folder `path` has a checkpoint newer than its `export` (hf/, adapter/): a run
    resumed and stopped before its end, which exports only there."""
    from r1 import checkpoint

    last = checkpoint.latest(path)
    if last and os.path.getmtime(last) > os.path.getmtime(export):
        it = int(os.path.basename(last).rpartition("_")[2])
        print(f"warning: {export} is older than {path}'s latest checkpoint ({os.path.basename(last)}): evaluating "
              f"the older {what}; to export the latest: {RESUME.format(path, path, it)}", file=sys.stderr)


def run_export(path: str) -> str:
    """model.path as eval loads it: a run folder's hf/ export (one warning line when the run has a checkpoint
    newer than it), or the path itself. A run folder without hf/ (stopped before its end) is a ConfigError
    that says how to get one."""
    from r1 import checkpoint

    if not os.path.isdir(path):
        return path
    hf, last = os.path.join(path, "hf"), checkpoint.latest(path)
    if os.path.isdir(hf):
        warn_if_stale(path, hf, "export")
        return hf
    if os.path.isfile(os.path.join(path, "config.json")) or not os.path.isfile(os.path.join(path, "config.yaml")):
        return path  # an HF folder (or not a run: the loader says what is wrong)
    if last:
        it = int(os.path.basename(last).rpartition("_")[2])
        steps = _saved_steps(path)
        state = (f"export (its last checkpoint is of iteration {it}, the run's last: the export was removed)" if
                 steps and it >= steps else f"export yet (stopped after iteration {it}, before its end)")
        raise ConfigError(f"model.path={path} is a run with no hf/ {state}; export it by resuming the run, which "
                          f"exports at its end: {RESUME.format(path, path, it)}")
    sft = os.path.join(path, "sft", "hf")
    if os.path.isdir(sft):
        raise ConfigError(f"model.path={path} is a run with no hf/ export yet (its RL phase has no checkpoint); "
                          f"its SFT phase's export is {sft} (model.path={sft})")
    metrics = os.path.join(path, "metrics.jsonl")
    if os.path.isfile(metrics) and os.path.getsize(metrics) > 0:
        raise ConfigError(f"model.path={path} is a run folder whose hf/ export and checkpoints are not there (its "
                          f"metrics.jsonl shows it ran): there is no policy in it to evaluate")
    raise ConfigError(f"model.path={path} is a run folder with no hf/ export and no checkpoint (stopped before its "
                      f"first); run it again, or resume it with run.resume=true until it finishes")


def _saved_steps(path: str):
    """train.steps of the run folder's saved config.yaml (None when it cannot be read)."""
    import yaml

    try:
        with open(os.path.join(path, "config.yaml"), encoding="utf-8") as f:
            return int((yaml.safe_load(f) or {})["train"]["steps"])
    except (OSError, yaml.YAMLError, KeyError, TypeError, ValueError):
        return None


if __name__ == "__main__":
    run_main(main)
