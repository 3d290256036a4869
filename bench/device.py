"""The one driver of device jobs: named jobs of resumable phases, and the wait-and-collect calls that follow them.

    python3 bench/device.py JOB RESULTS_DIR [options]        (from the repository root; --help lists the jobs)
    setsid nohup python3 bench/device.py recipe /root/res --model /root/stage/smollm2.gguf > /root/res.out 2>&1 &
    python3 bench/device.py wait /root/res --out $OUT --limit 540    (each later call, until it exits 0, 1 or 3)
    python3 bench/device.py speedrun /root/res --model /root/stage/smollm2.gguf --commit HASH   (RES/speedrun.json)

A device call lasts 10 minutes at most and the machine goes back 30 s after it, so a job longer than a call
runs in the background and calls that follow it back to back wait on it and copy its results to $OUT
(bench/wait.py). Every phase is marked done when it succeeds and skipped when the job is started again on the
same folder (bench/phases.py). Every JSON a job writes carries device, torch, commit and date (bench/phases.py
stamp; --commit names the commit where the machine has no .git). --dry-run prints each phase's command and runs
nothing. JOBS registers them: recipe, speedrun and ablate here, the others in bench/device_jobs.py (iteration,
lora, scale), bench/device_engine.py (rollout, agent, fa4, compile), bench/device_learn.py (learn, cli, peers).
"""
import argparse
import json
import os
import sys
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from phases import ROOT, Job, last_json, python, stamp  # noqa: E402

JOBS = {}  # name -> (function(args, Job) -> exit status, help line); the function's options() adds its flags
RECIPE = "configs/gsm8k_tool.yaml"
FIRST = (RECIPE, "configs/ablations/first_recipe.yaml")  # the base the speed and learning jobs measure
SPEEDRUN = "configs/ablations/speedrun.yaml"


def job(name: str, help_line: str):
    """Register a job: the decorated function gets (args, Job); its `options` attribute adds its flags and its
    `check` attribute refuses wrong arguments before anything is written."""
    def register(fn):
        JOBS[name] = (fn, help_line)
        return fn
    return register


def fail(message: str):
    """A wrong argument: one line, exit 2, before anything is written."""
    print(f"bench/device.py: {message}", file=sys.stderr)
    raise SystemExit(2)


def ablation(name: str) -> str:
    path = os.path.join("configs", "ablations", name + ".yaml")
    if not os.path.isfile(os.path.join(ROOT, path)):
        fail(f"no ablation {name!r} (no {path})")
    return path


def configs(*files) -> list:
    """--config FILE ... for train.py and eval.py."""
    return [w for f in files if f for w in ("--config", f)]


def write_json(path: str, obj):
    with open(path + ".tmp", "w") as f:
        json.dump(obj, f, indent=1)
        f.write("\n")
    os.replace(path + ".tmp", path)


def read(j: Job, name: str, cfg: list, model: str, split: str, more=(), gpu=None) -> bool:
    """Phase `name`: eval.py on all of `split` into RES/<name>/ (eval.out), its result also in RES/<name>.json."""
    out = j.path(name)
    ok = j.phase(name, [python(), "eval.py", *cfg, f"model.path={model}", f"eval.split={split}", "eval.limit=0",
                        f"eval.out={out}", *more], gpu=gpu, keep=[out + ".json"])
    if ok and not j.dry and not os.path.exists(out + ".json"):
        res = last_json(out + ".log")
        if res is not None:  # one line, as eval.py prints it (bench/ablation_table.py reads JSON lines)
            with open(out + ".json", "w") as f:
                f.write(json.dumps(res) + "\n")
    return ok


# ---------------------------------------------------------------- recipe


@job("recipe", f"one train.py command (SFT, RL, in-run reads, exports) timed whole, then its test reads "
               f"(default {RECIPE}; --base-abl synchronous: the synchronous 30-minute recipe); the result in "
               f"RESULTS_DIR/speedrun.json (bench/speedrun.py)")
def recipe(a, j: Job) -> int:
    files = [a.config, *[ablation(n) for n in a.base_abl]]
    cfg = configs(*files)
    run = j.path("recipe")
    label = " + ".join(files)
    info = stamp(a.commit)
    if not j.done("recipe") and not j.dry:
        write_json(j.path("job.json"), {"job": a.job, "config": label, "model": a.model, **info})
    t0 = time.time()
    was_done = j.done("recipe")
    if not j.phase("recipe", [python(), "train.py", *cfg, f"model.path={a.model}", f"run.dir={run}",
                              "log.progress=false", *a.set, *a.train_set], fresh=[run]):
        return j.finish()
    if not was_done and not j.dry:
        with open(j.path("wall_s"), "w") as f:
            f.write(f"{time.time() - t0:.1f}\n")
    more = [*a.set, *a.eval_set]
    read(j, "test-sft", cfg, os.path.join(run, "sft", "hf"), "test", more)
    read(j, "test-final", cfg, os.path.join(run, "hf"), "test", more)
    j.phase("result", [python(), os.path.join(ROOT, "bench", "speedrun.py"), j.res] + (["--save", a.save] if a.save else []))
    read(j, "val-final", cfg, os.path.join(run, "hf"), "val", more)  # picks nothing: last, so a cut run loses it only
    return j.finish()


def recipe_options(p):
    p.add_argument("--model", required=True, help="the model train.py starts from (e.g. /root/stage/smollm2.gguf)")
    p.add_argument("--config", default=RECIPE)
    p.add_argument("--base-abl", nargs="*", default=[], metavar="NAME",
                   help="configs/ablations/NAME.yaml layered on the config in every command (a candidate recipe)")
    p.add_argument("--train-set", nargs="*", default=[], metavar="KEY=VALUE", help="overrides for train.py only")
    p.add_argument("--eval-set", nargs="*", default=[], metavar="KEY=VALUE", help="overrides for eval.py only")
    p.add_argument("--save", default="", help="append the result to this JSON list too (it is always in "
                   "RESULTS_DIR/speedrun.json: on a device, append the collected copy here with bench/speedrun.py)")


def recipe_check(a):
    for n in a.base_abl:
        ablation(n)
    if not os.path.isfile(os.path.join(ROOT, a.config)):
        fail(f"no config {a.config}")


recipe.options, recipe.check = recipe_options, recipe_check


@job("speedrun", f"the recipe job with {SPEEDRUN} layered on {RECIPE} (after any --base-abl): SFT and PPO in "
                 f"one command timed whole, its test reads, RESULTS_DIR/speedrun.json (bench/speedrun.py)")
def speedrun(a, j: Job) -> int:
    return recipe(a, j)


def speedrun_check(a):
    recipe_check(a)
    a.base_abl = [n for n in a.base_abl if n != "speedrun"] + ["speedrun"]


speedrun.options, speedrun.check = recipe_options, speedrun_check


# ---------------------------------------------------------------- ablate


def lane_name(arm: str, seed) -> str:
    return arm if seed is None else f"{arm}-s{seed}"


def changes_env(arm: str) -> bool:
    """An ablation file that changes the environment: the recipe's lane is read under it too."""
    if arm == "recipe":
        return False
    with open(os.path.join(ROOT, ablation(arm))) as f:
        return any(line.startswith("env:") for line in f)


# A lane (task, arm, seed) is done when its RL run and every read of it are marked done; it needs its weights
# only while a read is pending. So a results folder that `wait` brought back (small files and markers, no
# weights), extracted and carried to a later session, reruns only the lanes not done there, after a new SFT
# (whose id, RES/TASK/sft.id, each lane records: compare.jsonl says whether a pair shares one).
@job("ablate", "SFT once a task, then lanes (task, arm, seed) one at a time a GPU from it, equal RL seconds, "
               "validation (and --test) reads; a lane done is skipped on rerun")
def ablate(a, j: Job) -> int:
    arms = ["recipe"] + [x for x in a.arms if x != "recipe"]
    seeds = a.seeds or [None]
    gpus = a.gpus or [None]
    base = [ablation(n) for n in a.base_abl]
    info = stamp(a.commit)
    for task, cfg_file in a.task:
        d = task
        if not j.dry:
            os.makedirs(j.path(d), exist_ok=True)
        cfg = configs(cfg_file, *base)
        armcfg = {arm: cfg + configs(None if arm == "recipe" else ablation(arm)) for arm in arms}
        lanes = [(arm, seed) for seed in seeds for arm in arms]

        def reads(arm, seed):
            """The read phases that need this lane's weights."""
            n = lane_name(arm, seed)
            out = [f"{d}/val-{n}"] + ([f"{d}/test-{n}"] if arm in a.test else [])
            if arm == "recipe":
                out += [f"{d}/val-{lane_name('recipe-as-' + x, seed)}" for x in arms[1:] if changes_env(x)]
            return out

        pending = [(arm, seed) for arm, seed in lanes
                   if not j.done(f"{d}/rl-{lane_name(arm, seed)}") or not all(j.done(r) for r in reads(arm, seed))]
        if not pending:
            j.log(f"{task}: every lane done")
        else:
            sft = j.path(f"{d}/sft")
            steps, lr = sft_settings(a, cfg_file)
            was_done = j.done(f"{d}/sft") and os.path.isdir(os.path.join(sft, "hf"))
            ok = j.phase(f"{d}/sft", [python(), "train.py", *configs(cfg_file), f"model.path={a.model}",
                                      f"run.dir={sft}", "train.stage=sft", "train.sft_steps=0", f"train.steps={steps}",
                                      f"train.lr={lr}", f"train.warmup={min(20, steps // 10)}",
                                      "train.schedule=cosine", "train.checkpoint_every=100000", "log.progress=false",
                                      *a.set], gpu=gpus[0], keep=[os.path.join(sft, "hf")], fresh=[sft])
            if not ok:
                continue
            if not was_done and not j.dry:
                with open(j.path(f"{d}/sft.id"), "w") as f:
                    f.write(uuid.uuid4().hex[:12] + "\n")

            def lane(arm, seed, gpu):
                n = lane_name(arm, seed)
                run = j.path(f"{d}/{n}")
                needs = not all(j.done(r) for r in reads(arm, seed))
                seed_set = [] if seed is None else [f"run.seed={seed}"]
                ok = j.phase(f"{d}/rl-{n}", [python(), "train.py", *armcfg[arm], f"model.path={sft}/hf",
                                             f"run.dir={run}", "train.sft_steps=0", f"train.time_limit={a.rl_seconds}",
                                             "eval.every=10", "eval.limit=200", f"run.memory_fraction={a.memory_fraction}",
                                             "log.progress=false", *seed_set, *a.set],
                             gpu=gpu, keep=[os.path.join(run, "hf")] if needs else (), fresh=[run])
                if ok and not j.dry and not os.path.exists(run + ".lane.json"):
                    with open(j.path(f"{d}/sft.id")) as f:
                        sft_id = f.read().strip()
                    write_json(run + ".lane.json", {"task": task, "config": cfg_file, "arm": arm, "seed": seed,
                                                    "base_abl": a.base_abl, "rl_seconds": a.rl_seconds, "sft": sft_id,
                                                    **info})
                if not ok:
                    return
                mem = [f"run.memory_fraction={a.memory_fraction}"]
                read(j, f"{d}/val-{n}", armcfg[arm], run, "val", mem + a.set, gpu=gpu)
                if arm == "recipe":  # read under each environment-changing arm's file: what training changed
                    for x in arms[1:]:
                        if changes_env(x):
                            read(j, f"{d}/val-{lane_name('recipe-as-' + x, seed)}", armcfg[x], run, "val",
                                 mem + a.set, gpu=gpu)
                if arm in a.test:  # final recipes only, read once, never to choose
                    read(j, f"{d}/test-{n}", armcfg[arm], run, "test", a.set, gpu=gpu)

            for i in range(0, len(pending), len(gpus)):
                wave = pending[i:i + len(gpus)]
                Job.parallel(*[(lambda arm=arm, seed=seed, g=g: lane(arm, seed, g)) for (arm, seed), g in zip(wave, gpus)])
        if not j.dry:
            compare(j, d, arms, seeds, a.test)
    return j.finish()


def compare(j: Job, d: str, arms: list, seeds: list, test: list):
    """RES/TASK/compare.jsonl: each lane's validation read against the recipe lane of its seed (python -m
    r1.compare: gained / lost / McNemar p); test-compare.jsonl: each --test arm against the first."""
    import subprocess

    def pair(a_name, b_name):
        pa, pb = j.path(f"{d}/{a_name}"), j.path(f"{d}/{b_name}")
        if not (os.path.exists(pa + ".json") and os.path.exists(pb + ".json")):
            return None
        r = subprocess.run([python(), "-m", "r1.compare", pa, pb], capture_output=True, text=True, cwd=ROOT)
        lines = [ln for ln in r.stdout.splitlines() if ln.strip()]
        try:
            return json.loads(lines[-1]) if r.returncode == 0 and lines else None
        except json.JSONDecodeError:
            return None

    rows, test_rows = [], []
    for seed in seeds:
        for arm in arms[1:]:
            n = lane_name(arm, seed)
            res = pair(f"val-{lane_name('recipe', seed)}", f"val-{n}")
            if res is not None:  # same_sft: lanes of one SFT policy (a lane rerun in another session has its own)
                rows.append({"ablation": n, "vs_recipe": res,
                             "same_sft": sft_of(j, d, lane_name("recipe", seed)) == sft_of(j, d, n)})
            if changes_env(arm):
                res = pair(f"val-{lane_name('recipe-as-' + arm, seed)}", f"val-{n}")
                if res is not None:
                    rows.append({"ablation": n, "vs_recipe_same_env": res})
        for arm in test[1:]:
            res = pair(f"test-{lane_name(test[0], seed)}", f"test-{lane_name(arm, seed)}")
            if res is not None:
                test_rows.append({"test": lane_name(arm, seed), "baseline": lane_name(test[0], seed), "result": res})
    for name, out in (("compare.jsonl", rows), ("test-compare.jsonl", test_rows)):
        with open(j.path(f"{d}/{name}"), "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in out)


def sft_of(j: Job, d: str, lane: str) -> str:
    try:
        with open(j.path(f"{d}/{lane}.lane.json")) as f:
            return json.load(f)["sft"]
    except (OSError, ValueError, KeyError):
        return ""


def task_spec(text: str):
    name, _, cfg = text.partition("=")
    if not name or not cfg:
        raise argparse.ArgumentTypeError(f"a task is NAME=CONFIG (e.g. gsm8k={RECIPE}), got {text!r}")
    if not os.path.isfile(os.path.join(ROOT, cfg)):
        raise argparse.ArgumentTypeError(f"no config {cfg} (task {name})")
    return name, cfg


def ablate_options(p):
    p.add_argument("--model", required=True, help="the model each task's SFT starts from (the GGUF)")
    p.add_argument("--arms", nargs="+", required=True, metavar="NAME",
                   help="configs/ablations/NAME.yaml each; the recipe's lane (no file) always runs too")
    p.add_argument("--seeds", nargs="*", type=int, default=[], help="run.seed of each lane (default: the config's,"
                   " lanes named ARM; with seeds, ARM-sSEED)")
    p.add_argument("--task", nargs="+", type=task_spec, default=[("gsm8k", RECIPE)], metavar="NAME=CONFIG",
                   help=f"tasks, each with its folder RES/NAME and its own SFT (default gsm8k={RECIPE})")
    p.add_argument("--rl-seconds", type=float, default=300.0, help="train.time_limit of every lane")
    p.add_argument("--test", nargs="*", default=[], metavar="ARM",
                   help="arms that are final recipes: read once on the test split, paired with the first named")
    p.add_argument("--base-abl", nargs="*", default=[], metavar="NAME", help="ablation files under every lane")
    p.add_argument("--sft-steps", type=int, default=None, help="default: the config's train.sft_steps")
    p.add_argument("--sft-lr", type=float, default=None, help="default: the config's train.sft_lr")
    p.add_argument("--gpus", nargs="*", default=[], help="device ids: the SFT on the first, a lane on each, side by side")
    p.add_argument("--memory-fraction", type=float, default=0.88)


def sft_settings(a, cfg_file: str) -> tuple:
    """(steps, lr) of a task's SFT: --sft-steps / --sft-lr, else the config's warm-up (train.sft_steps, sft_lr)."""
    steps, lr = a.sft_steps, a.sft_lr
    if steps is None or lr is None:
        sys.path.insert(0, ROOT)
        from r1.config import ConfigError, load_config
        try:
            c = load_config([os.path.join(ROOT, cfg_file)])
        except ConfigError as e:
            fail(f"--task {cfg_file}: {e}")
        steps = c.train.sft_steps if steps is None else steps
        lr = c.train.sft_lr if lr is None else lr
    return steps, lr


def ablate_check(a):
    arms = ["recipe"] + [x for x in a.arms if x != "recipe"]
    for x in arms[1:] + a.base_abl:
        ablation(x)
    for x in a.test:
        if x not in arms:
            fail(f"--test names {x}, not an arm ({' '.join(arms)})")
    names = [t for t, _ in a.task]
    if len(set(names)) < len(names):
        fail(f"--task names a task twice ({' '.join(names)})")
    for _, cfg_file in a.task:
        if not sft_settings(a, cfg_file)[0]:
            fail(f"{cfg_file} has no train.sft_steps: give --sft-steps")


ablate.options, ablate.check = ablate_options, ablate_check


# ---------------------------------------------------------------- the command line


def parser() -> argparse.ArgumentParser:
    import device_engine  # noqa: F401 - these register the other jobs
    import device_jobs  # noqa: F401
    import device_learn  # noqa: F401

    p = argparse.ArgumentParser(prog="bench/device.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="job", metavar="JOB", required=True)
    for name, (fn, h) in JOBS.items():
        s = sub.add_parser(name, help=h, description=h)
        s.add_argument("results_dir")
        s.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                       help="overrides for every train.py and eval.py command (a CPU dry run: configs/smoke.yaml)")
        s.add_argument("--skip", nargs="*", default=[], metavar="PHASE", help="phases not to run")
        s.add_argument("--commit", default="", help="the commit the tree is at (the device has no .git)")
        s.add_argument("--dry-run", action="store_true", help="print each phase's command, run nothing")
        fn.options(s)
    w = sub.add_parser("wait", help="wait on jobs started in the background, then copy their results")
    w.add_argument("results_dirs", nargs="+")
    w.add_argument("--out", required=True, help="where the results go (e.g. $OUT); OUT/<folder name>/ for several")
    w.add_argument("--limit", type=float, default=540, help="seconds to wait at most (default 540)")
    c = sub.add_parser("collect", help="copy a job's results to --out now")
    c.add_argument("results_dir")
    c.add_argument("--out", required=True)
    return p


def main(argv=None) -> int:
    a = parser().parse_args(argv)
    if a.job in ("wait", "collect"):
        import wait
        if a.job == "collect":
            print(wait.collect(a.results_dir, a.out))
            return 0
        if len(a.results_dirs) == 1:
            return wait.wait(a.results_dirs[0], a.out, a.limit)
        return wait.wait_all(a.out, a.limit, a.results_dirs)
    if not os.path.isdir(os.path.join(ROOT, "configs", "ablations")):
        fail(f"no configs/ablations under {ROOT}")
    fn = JOBS[a.job][0]
    fn.check(a)
    res = os.path.abspath(a.results_dir)
    return fn(a, Job(res, a.skip, what=f"{a.job} {' '.join(sys.argv[2:])}", dry=a.dry_run))


if __name__ == "__main__":
    import device  # one copy of JOBS: the other job files register into the module they import by this name

    sys.exit(device.main())
