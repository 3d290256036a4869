"""The learning jobs of bench/device.py besides recipe and ablate: what a run learns, against what, on what.

learn: the learning proof on two GPUs (SFT, then step-level PPO on one GPU and GRPO on the other, equal time,
test reads), then FSDP and the quickstart. grpo-pair: two GRPO lanes from one SFT that differ in environment
or overrides (the overlapped schedule, micro-batch sizes). cli: the command-line task at level 3, SFT on level
2 or on level 3, what RL adds. tune: the SFT grid and RL variants chosen on the validation split. peer-trl:
ours against TRL's GRPOTrainer from one SFT at equal wall time (bench/peer_trl.py).
"""
import os
import subprocess

from device import FIRST, configs, fail, job, read
from device_engine import gpu_tests
from device_jobs import stamp_file
from phases import ROOT, Job, python

GSM = configs(*FIRST) + ["log.progress=false"]  # the first recipe: what these jobs measured
SFT_SCHEDULE = ["train.lr=5e-5", "train.warmup=20", "train.schedule=cosine", "train.checkpoint_every=100000"]


def sft(a, j: Job, cfg: list, name="sft", gpu=None, steps=None, more=()) -> bool:
    """The SFT warm-up the lanes start from: RES/<name>/hf."""
    d = j.path(name)
    return j.phase(name, [python(), "train.py", *cfg, f"model.path={a.model}", "train.stage=sft", "train.sft_steps=0",
                          f"run.dir={d}", f"train.steps={steps or a.sft_steps}", *SFT_SCHEDULE, *more, *a.set],
                   gpu=gpu, keep=[os.path.join(d, "hf")], fresh=[d])


BOOL = {"0": "false", "1": "true"}
ENV = ("R1_PROFILE", "R1_SWITCH_US")  # the environment variables a lane may set: when, not what, a run computes


def env_and_overrides(words: list) -> tuple:
    """R1_PROFILE=... and R1_SWITCH_US=... words are the environment, the rest train.py overrides (kernels.*
    among them); any other R1_* word is refused (pair_check), as r1/environment.py refuses it."""
    env = dict(w.split("=", 1) for w in words if w.split("=", 1)[0] in ENV and "=" in w)
    return env, [w for w in words if not (w.split("=", 1)[0] in ENV and "=" in w)]


def pair_check(a):
    """A lane word R1_*=... other than ENV: one line naming it (a moved switch: its kernels.* key)."""
    import sys
    sys.path.insert(0, ROOT)
    from r1.environment import MOVED

    for flag, words in (("--a", a.a), ("--b", a.b)):
        for w in words:
            name, eq, value = w.partition("=")
            if eq and name.startswith("R1_") and name not in ENV:
                if name in MOVED:
                    fail(f"{flag} {w}: {name} was removed, write {MOVED[name]}={BOOL.get(value, value)}")
                fail(f"{flag} {w}: no environment variable {name} (a lane may set {', '.join(ENV)})")


@job("learn", "the learning proof on 2 GPUs: SFT, PPO and GRPO side by side for equal time, test reads; "
              "then FSDP over both and the quickstart")
def learn(a, j: Job) -> int:
    cfg = GSM + ([f"data.path={a.data}"] if a.data else [])
    ga, gb = a.gpus
    ok = Job.parallel(lambda: gpu_tests(j, "check-decode", ("-x", "tests/test_decode_kernel.py"), gpu=ga),
                      lambda: gpu_tests(j, "check-sample", ("-x", "tests/test_sample_kernel.py"), gpu=gb))
    kernels = ([] if ok[0] else ["decode=sdpa"]) + ([] if ok[1] else ["sample=torch"])  # where a kernel failed
    j.log(f"kernels: {' '.join(kernels) or 'triton decode and sampling'}")
    overrides, flags = ["kernels." + w for w in kernels], (["--kernels", *kernels] if kernels else [])
    rl_args = ["rollout.prompts=64", "rollout.n=8", "rollout.slots=512", "algo.minibatches=4", "train.critic_lr=1e-5",
               "train.steps=1000", f"train.time_limit={a.rl_seconds}", "train.checkpoint_every=1000", "eval.every=5",
               "eval.limit=256", *a.rl_set]

    def rl(gpu, name, adv, more):
        run = j.path(name)
        if j.phase(name, [python(), "train.py", *cfg, f"model.path={j.path('sft')}/hf", f"run.dir={run}",
                          f"algo.advantage={adv}", f"train.lr={a.rl_lr}", *rl_args, *overrides, *more], gpu=gpu,
                   fresh=[run]):
            read(j, f"eval-{name}", cfg, os.path.join(run, "hf"), "test", gpu=gpu)

    def lane_a():
        read(j, "eval-base", cfg, a.model, "test", gpu=ga)
        gpu_tests(j, gpu=ga)
        j.phase("logprob-gap", [python(), "bench/logprob_gap.py", "--save", *flags], gpu=ga)
        while not j.done("sft") and not os.path.exists(j.path("sft.failed")) and not j.dry:
            import time
            time.sleep(5)
        if j.done("sft"):
            rl(ga, "rl-ppo", "step_gae", a.ppo_set)

    def lane_b():
        if os.path.exists(j.path("sft.failed")):
            os.remove(j.path("sft.failed"))
        if not sft(a, j, cfg, gpu=gb, more=[]):
            open(j.path("sft.failed"), "w").close()
            return
        read(j, "eval-sft", cfg, j.path("sft") + "/hf", "test", gpu=gb)
        rl(gb, "rl-grpo", "grpo", a.grpo_set)

    Job.parallel(lane_a, lane_b)
    j.phase("fsdp", ["torchrun", "--standalone", "--nproc_per_node=2", "train.py", *cfg, f"model.path={a.model}",
                     f"run.dir={j.path('fsdp')}", "train.steps=3", "eval.every=0", "train.checkpoint_every=3"],
            fresh=[j.path("fsdp")])
    j.phase("quickstart", [python(), "train.py", *configs("configs/quickstart.yaml"), f"run.dir={j.path('quickstart')}",
                           "log.progress=false"], gpu=ga, fresh=[j.path("quickstart")])
    return j.finish()


def learn_options(p):
    p.add_argument("--model", required=True, help="the GGUF")
    p.add_argument("--data", default="", help="a GSM8K folder (default: the config's)")
    p.add_argument("--rl-seconds", type=float, default=600.0)
    p.add_argument("--sft-steps", type=int, default=467, help="2 epochs of 7,473 problems at 32")
    p.add_argument("--rl-lr", default="1e-5")
    p.add_argument("--rl-set", nargs="*", default=[], help="overrides for both RL runs")
    p.add_argument("--ppo-set", nargs="*", default=[])
    p.add_argument("--grpo-set", nargs="*", default=[], help="e.g. algo.drop_uniform_groups=true")
    p.add_argument("--gpus", nargs=2, default=["0", "1"], metavar=("A", "B"))


learn.options, learn.check = learn_options, lambda a: None


@job("grpo-pair", "two GRPO lanes from one SFT, the same seed and iterations, differing in --a / --b "
                  "(train.py overrides, kernels.* among them): the overlapped schedule, micro-batch sizes")
def grpo_pair(a, j: Job) -> int:
    if not sft(a, j, GSM, gpu=0):
        return j.finish()

    def lane(gpu, name, words):
        env, more = env_and_overrides(words)
        j.phase(name, [python(), "train.py", *GSM, f"model.path={j.path('sft')}/hf", "train.sft_steps=0",
                       f"run.dir={j.path(name)}", "algo.advantage=grpo", f"train.steps={a.iters}",
                       "train.checkpoint_every=100000", "eval.every=0", *more, *a.set],
                gpu=gpu, env=env, fresh=[j.path(name)])

    if a.seq:
        lane(0, "grpo-a", a.a)
        lane(0, "grpo-b", a.b)
    else:
        Job.parallel(lambda: lane(0, "grpo-a", a.a), lambda: lane(1, "grpo-b", a.b))
    return j.finish()


def grpo_pair_options(p):
    p.add_argument("--model", required=True, help="the GGUF")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--sft-steps", type=int, default=467)
    p.add_argument("--a", nargs="*", default=[], help="lane A's words (default: the defaults)")
    p.add_argument("--b", nargs="*", default=["kernels.launch_ahead=false"],
                   help="lane B's words (e.g. train.micro_tokens=16384; R1_SWITCH_US=200 sets the environment)")
    p.add_argument("--seq", action="store_true", help="lane B after lane A, both on GPU 0 (one GPU)")


grpo_pair.options, grpo_pair.check = grpo_pair_options, pair_check


@job("cli", "the command-line task at level 3: SFT on level 2 (sft2) or 3 (sft3), then PPO, side by side on one "
            "GPU; the SFT and final policies read on held-out level 3 and compared")
def cli(a, j: Job) -> int:
    cfg = configs("configs/cli.yaml")

    def lane(name, more):
        run = j.path(name)
        mem = ["run.memory_fraction=0.45"]
        if not j.phase(f"train-{name}", [python(), "train.py", *cfg, f"model.path={a.model}", f"run.dir={run}", *more,
                                         "train.steps=100000", f"train.time_limit={a.rl_seconds}", *mem,
                                         "log.progress=false", *a.set], fresh=[run]):
            return
        for m, path in (("sft", os.path.join(run, "sft", "hf")), ("final", os.path.join(run, "hf"))):
            read(j, f"test-{name}-{m}", cfg + more, path, "test", mem + a.set)
        if not j.dry:
            r = subprocess.run([python(), "-m", "r1.compare", j.path(f"test-{name}-sft"), j.path(f"test-{name}-final")],
                               capture_output=True, text=True)
            with open(j.path(f"compare-{name}.txt"), "w") as f:
                f.write(r.stdout + r.stderr)

    Job.parallel(lambda: lane("sft2", []), lambda: lane("sft3", ["data.sft_level=0"]))
    return j.finish()


def cli_options(p):
    p.add_argument("--model", required=True, help="the GGUF")
    p.add_argument("--rl-seconds", type=float, default=300.0)


cli.options, cli.check = cli_options, lambda a: None


@job("tune", "tuning on the validation split, side by side on one GPU: a 2x2 SFT grid (lr x epochs), then RL "
             "variants from the recipe's SFT, each read on all of validation")
def tune(a, j: Job) -> int:
    cfg = GSM + ["data.val_size=500", "eval.split=val"]

    def ev(name, model, frac):
        read(j, f"eval-{name}", cfg, model, "val", [f"run.memory_fraction={frac}", *a.set])

    def sft_lane(name, steps, lr):
        if sft(a, j, cfg, name, steps=steps, more=[f"train.lr={lr}", "run.memory_fraction=0.07"]):
            ev(name, j.path(name) + "/hf", 0.08)
            return True
        return False

    def rl(name, more):
        run = j.path(name)
        if j.phase(name, [python(), "train.py", *cfg, f"model.path={j.path('sft-lr5e-5-ep2')}/hf", f"run.dir={run}",
                          "train.sft_steps=0", "train.steps=100000", f"train.time_limit={a.rl_seconds}",
                          "train.checkpoint_every=100000", "eval.every=10", "eval.limit=0", "run.memory_fraction=0.15",
                          "train.micro_tokens=4096", *more, *a.set], fresh=[run]):
            ev(name, run + "/hf", 0.08)

    def recipe_then_rl():
        if sft_lane("sft-lr5e-5-ep2", a.ep2, "5e-5"):
            Job.parallel(lambda: rl("rl-ppo-lr1e-5", ["train.lr=1e-5"]),
                         lambda: rl("rl-ppo-lr2e-5", ["train.lr=2e-5", "train.critic_lr=2e-5"]),
                         lambda: rl("rl-grpo-lr2e-5", ["algo.advantage=grpo", "train.lr=2e-5",
                                                       "algo.drop_uniform_groups=true"]),
                         lambda: rl("rl-ppo-lr1e-5-p128", ["train.lr=1e-5", "rollout.prompts=128"]))

    Job.parallel(lambda: sft_lane("sft-lr1.5e-4-ep2", a.ep2, "1.5e-4"), lambda: sft_lane("sft-lr5e-5-ep4", a.ep4, "5e-5"),
                 lambda: sft_lane("sft-lr1.5e-4-ep4", a.ep4, "1.5e-4"), recipe_then_rl)
    return j.finish()


def tune_options(p):
    p.add_argument("--model", required=True, help="the GGUF")
    p.add_argument("--rl-seconds", type=float, default=780.0)
    p.add_argument("--ep2", type=int, default=436, help="SFT steps of 2 epochs (6,973 rows / 32 a step)")
    p.add_argument("--ep4", type=int, default=872)


tune.options, tune.check = tune_options, lambda a: None


@job("peer-trl", "ours against TRL's GRPOTrainer from one SFT, a GPU each, equal wall time, test reads, report")
def peer_trl(a, j: Job) -> int:
    tok = [f"model.tokenizer={j.path('sft')}/hf"]

    def lane_sft():
        return sft(a, j, GSM, gpu=0) and read(j, "eval-sft", GSM + tok, j.path("sft") + "/hf", "test", gpu=0)

    def lane_cli():  # the command-line assistant on the other GPU meanwhile: held-out success before and after RL
        ccfg = configs("configs/cli.yaml") + ["log.progress=false"]
        if j.phase("cli", [python(), "train.py", *ccfg, f"model.path={a.model}", f"run.dir={j.path('cli')}",
                           f"train.time_limit={a.cli_seconds}", "train.steps=1000", "eval.every=0",
                           "train.checkpoint_every=100000"], gpu=1, fresh=[j.path("cli")]):
            for name, model in (("base", a.model), ("sft", j.path("cli") + "/sft/hf"), ("rl", j.path("cli"))):
                read(j, f"eval-cli-{name}", ccfg, model, "test", gpu=1)

    if not Job.parallel(lane_sft, *([lane_cli] if a.cli_seconds else []))[0]:
        return j.finish()
    smi = None if j.dry else subprocess.Popen(
        ["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits", "-lms", "500"],
        stdout=open(j.path("smi.csv"), "w"), stderr=subprocess.DEVNULL) if _has("nvidia-smi") else None
    Job.parallel(
        lambda: j.phase("ours", [python(), "train.py", *GSM, f"model.path={j.path('sft')}/hf", "train.sft_steps=0",
                                 f"run.dir={j.path('ours')}", "algo.advantage=grpo", "env.rewards.malformed=0",
                                 f"train.time_limit={a.seconds}", "train.steps=100000", "train.checkpoint_every=100000",
                                 "eval.every=0", *a.set], gpu=0, fresh=[j.path("ours")]),
        lambda: j.phase("trl", [python(), "bench/peer_trl.py", "train", "--model", j.path("sft") + "/hf",
                                "--tokenizer", j.path("sft") + "/hf", "--out", j.path("trl"), "--seconds",
                                str(a.seconds), *a.trl_args], gpu=1))
    if smi is not None:
        smi.terminate()
    Job.parallel(lambda: read(j, "eval-ours", GSM + tok, j.path("ours"), "test", gpu=0),
                 lambda: read(j, "eval-trl", GSM + tok, j.path("trl") + "/hf", "test", gpu=1))
    out = j.path("peer_trl.json")
    if j.phase("report", [python(), "bench/peer_trl.py", "report", "--ours", j.path("ours"), "--trl", j.path("trl"),
                          "--sft-eval", j.path("eval-sft"), "--ours-eval", j.path("eval-ours"), "--trl-eval",
                          j.path("eval-trl"), "--smi", j.path("smi.csv"), "--seconds", str(a.seconds), "--hardware",
                          a.hardware, "--json", out]) and not j.dry:
        stamp_file(out, a.commit)
    return j.finish()


def _has(cmd: str) -> bool:
    import shutil
    return shutil.which(cmd) is not None


def peer_trl_options(p):
    p.add_argument("--model", required=True, help="the GGUF")
    p.add_argument("--seconds", type=float, default=300.0, help="training wall time each")
    p.add_argument("--sft-steps", type=int, default=467)
    p.add_argument("--cli-seconds", type=float, default=0.0, help="RL seconds of the cli lane during the SFT (0: none)")
    p.add_argument("--trl-args", nargs="*", default=[], help="flags for bench/peer_trl.py train")
    p.add_argument("--hardware", default="one GPU per trainer", help="the report's hardware line")


peer_trl.options, peer_trl.check = peer_trl_options, lambda a: None
