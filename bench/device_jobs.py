"""The speed jobs of bench/device.py: iteration time (and its precision / share-prefix sets), LoRA, scaling.

iteration: train.py runs of the first recipe (configs/gsm8k_tool.yaml + ablations/first_recipe.yaml: synchronous,
PPO, fp32 autocast: the base every lane switches from), STEPS iterations each, one after another with the GPU
to themselves, a lane a set of overrides (LANES), then bench/iteration_result.py's medians in RES/iteration.json.
--shape 3b runs them on a random model of that shape (bench/random_model.py), --sft-steps first trains the SFT
policy they start from. precision and share-prefix are iteration sets with their GPU tests (and benchmarks)
first. lora times full fine-tuning against adapters at Qwen2.5 shapes (bench/lora.py); lora-pair is the ablate
job for LoRA against full fine-tuning at equal RL time, both read on test; scale is FSDP weak scaling.
"""
import json
import os

from device import FIRST, ROOT, configs, fail, job, stamp, write_json
from phases import Job, python

OV1 = ["train.overlap=1", "algo.policy_loss=decoupled_ppo", "algo.tis_cap=2"]
OV2 = ["train.overlap=2", "algo.policy_loss=decoupled_ppo", "algo.tis_cap=2"]  # the rollout in a process
GRPO, SP, BF, MB1 = ["algo.advantage=grpo"], ["train.share_prefix=true"], ["train.precision=bf16"], ["algo.minibatches=1"]
FUSE, SW = ["kernels.fuse_train=true"], {"R1_SWITCH_US": "200"}
# name -> (environment, overrides): the lanes measured so far, in the order they run
LANES = {
    "ppo-o0": ({}, []), "ppo-o1": ({}, OV1), "grpo-o0": ({}, GRPO), "grpo-o1": ({}, GRPO + OV1),
    "ppo-o2": ({}, OV2), "grpo-o2": ({}, GRPO + OV2),
    "ppo-o1-sw200": (SW, OV1),  # the interpreter's switch interval 5 ms -> 0.2 ms (r1/overlap.py)
    "ppo-mt4096-frac015": ({}, ["train.micro_tokens=4096", "run.memory_fraction=0.15"]),
    "ppo-mt4096": ({}, ["train.micro_tokens=4096"]),
    "ppo-o0-ft": ({}, FUSE), "ppo-o2-ft": ({}, FUSE + OV2),  # q/k/v and gate/up as one matmul each in training
    "ppo-o0-sp": ({}, SP), "grpo-o0-sp": ({}, GRPO + SP), "ppo-o2-sp": ({}, SP + OV2),
    "ppo-o0-sp-bf": ({}, SP + BF), "grpo-o0-sp-bf": ({}, GRPO + SP + BF), "ppo-o2-sp-bf": ({}, SP + BF + OV2),
    "grpo-o2-sp": ({}, GRPO + SP + OV2), "grpo-o2-sp-bf": ({}, GRPO + SP + BF + OV2),
    "grpo-o0-sp-bf-mb1": ({}, GRPO + SP + BF + MB1),
    "grpo-o0-sp-bf-mb1-scored": ({}, GRPO + SP + BF + MB1 + ["train.score_policy=always"]),
    "grpo-o2-sp-bf-mb1": ({}, GRPO + SP + BF + OV2 + MB1), "ppo-o2-sp-bf-mb1": ({}, SP + BF + OV2 + MB1),
}
SETS = {  # the lanes of the jobs that are iteration sets
    "precision": ["ppo-o2-sp", "ppo-o2-sp-bf", "grpo-o2-sp", "grpo-o2-sp-bf", "grpo-o0-sp-bf-mb1-scored",
                  "grpo-o0-sp-bf-mb1", "grpo-o2-sp-bf-mb1", "ppo-o2-sp-bf-mb1"],
    "share-prefix": ["ppo-o0", "ppo-o0-sp", "grpo-o0", "grpo-o0-sp", "ppo-o2", "ppo-o2-sp"],
    "3b": ["ppo-o0", "ppo-o1", "ppo-o2"],
}


def stamp_file(path: str, commit: str):
    """Add device, torch, commit and date to each object of a JSON file (an object, a list, or JSON lines) that
    lacks them: every result a job writes carries them."""
    s = stamp(commit)
    with open(path) as f:
        text = f.read()
    try:
        data, lines = json.loads(text), False
    except json.JSONDecodeError:
        data, lines = [json.loads(ln) for ln in text.splitlines() if ln.strip()], True
    for obj in data if isinstance(data, list) else [data]:
        if isinstance(obj, dict):
            for k, v in s.items():
                obj.setdefault(k, v)
    if lines:
        with open(path, "w") as f:
            f.writelines(json.dumps(o) + "\n" for o in data)
    else:
        write_json(path, data)


def iteration_lanes(a, j: Job, lanes: list, model: str, save: str):
    """The lanes' runs (skipped when done), then their result in RES/iteration.json (and --save)."""
    cfg = configs(*FIRST) + ["log.progress=false", "log.trajectories=false", "train.sft_steps=0",
                                                "eval.every=0", "train.checkpoint_every=100000", f"train.steps={a.steps}"]
    prof = {"R1_PROFILE": str(a.profile)} if a.profile else {}
    if a.sft_steps:
        sft = j.path("sft")
        if not j.phase("sft", [python(), "train.py", *configs(*FIRST), f"model.path={model}",
                               f"run.dir={sft}", "train.stage=sft", "train.sft_steps=0", f"train.steps={a.sft_steps}",
                               "train.lr=5e-5", "train.checkpoint_every=100000", "log.progress=false", *a.set],
                       keep=[os.path.join(sft, "hf")], fresh=[sft]):
            return j.finish()
        model = os.path.join(sft, "hf")
    for name in lanes:
        env, more = LANES[name]
        j.phase(name, [python(), "train.py", *cfg, f"model.path={model}", f"run.dir={j.path(name)}", *more, *a.set],
                env={**prof, **env}, fresh=[j.path(name)])
    runs = [j.path(n) for n in lanes if j.done(n)]
    if runs and not j.dry:
        out = j.path("iteration.json")
        if j.phase("result", [python(), "bench/iteration_result.py", "--runs", *runs, "--save", out]):
            stamp_file(out, a.commit)
            if save:
                with open(out) as f, open(save, "w") as g:
                    g.write(f.read())
    return j.finish()


def iteration_options(p, default_steps=12):
    p.add_argument("--model", default="", help="an SFT hf/ folder or the GGUF (with --sft-steps); --shape: none")
    p.add_argument("--steps", type=int, default=default_steps, help="iterations a lane")
    p.add_argument("--only", nargs="*", default=[], metavar="LANE", help="these lanes only (default: all of the job's)")
    p.add_argument("--sft-steps", type=int, default=0, help="first the SFT the lanes start from, N steps x 32 chats")
    p.add_argument("--profile", type=int, default=0, help="iteration N of every lane under R1_PROFILE")
    p.add_argument("--save", default="", help="copy RES/iteration.json here too")


def check_lanes(a, default):
    for n in a.only:
        if n not in LANES:
            fail(f"--only names {n}, not a lane ({' '.join(LANES)})")
    a.lanes = [n for n in default if not a.only or n in a.only]
    if not a.model and not getattr(a, "shape", ""):
        fail("--model is needed (an SFT hf/ folder, or the GGUF with --sft-steps)")


@job("iteration", "iteration time of PPO and GRPO lanes (overlap, precision, prefix sharing, ...), the GPU to each")
def iteration(a, j: Job) -> int:
    model = a.model
    if a.shape:  # a random model of that shape with SmolLM2's vocabulary: speed does not depend on the weights
        model = j.path(f"model-{a.shape}")
        if not j.phase("random-model", [python(), "bench/random_model.py", "--shape", a.shape, "--tokenizer",
                                        a.tokenizer, "--out", model], keep=[os.path.join(model, "config.json")]):
            return j.finish()
    return iteration_lanes(a, j, a.lanes, model, a.save)


def iteration_setup(p):
    iteration_options(p)
    p.add_argument("--shape", default="", help="e.g. 3b: a random model of that shape (lanes ppo-o0, -o1, -o2 by "
                   "default, rollout.prompts=32, run.save=false: its checkpoint would fill the disk)")
    p.add_argument("--tokenizer", default="", help="with --shape: an HF folder with SmolLM2's tokenizer")


def iteration_check(a):
    if a.shape:
        if not a.tokenizer or not os.path.isfile(os.path.join(a.tokenizer, "tokenizer.json")):
            fail(f"--shape needs --tokenizer, an HF folder with tokenizer.json (got {a.tokenizer!r})")
        a.set = ["rollout.prompts=32", "run.save=false"] + a.set
        if a.steps == 12:
            a.steps = 4  # an overlapped run's last iteration starts no rollout: 4 leave two steady ones
    check_lanes(a, SETS["3b"] if a.shape else list(LANES))


iteration.options, iteration.check = iteration_setup, iteration_check


@job("precision", "train.precision=bf16: its GPU test, then the iteration lanes with and without the bf16 copy")
def precision(a, j: Job) -> int:
    j.phase("gpu-test", [python(), "-m", "pytest", "-q", "-m", "gpu", "tests/test_precision.py"])
    return iteration_lanes(a, j, a.lanes, a.model, a.save)


@job("share-prefix", "train.share_prefix: its GPU test, bench/share_prefix_step.py at 135M and 3B, iteration lanes")
def share_prefix(a, j: Job) -> int:
    j.phase("gpu-test", [python(), "-m", "pytest", "-q", "-m", "gpu", "tests/test_share_prefix.py"])
    j.phase("bench-135m", [python(), "bench/share_prefix_step.py", "--model", "135m", "--save"])
    j.phase("bench-3b", [python(), "bench/share_prefix_step.py", "--model", "3b", "--prompts", "16",
                         "--micro-tokens", "16384", "--save"])
    return iteration_lanes(a, j, a.lanes, a.model, a.save)


def set_options(p):
    iteration_options(p)
    p.set_defaults(sft_steps=467)


precision.options = share_prefix.options = set_options
precision.check = lambda a: check_lanes(a, SETS["precision"])
share_prefix.check = lambda a: check_lanes(a, SETS["share-prefix"])


@job("lora", "peak memory and iteration time: full fine-tuning against rank-r adapters at Qwen2.5 shapes")
def lora(a, j: Job) -> int:
    if not os.path.isdir(a.tokenizer):
        j.phase("tokenizer", [python(), "-c", "from r1.tokenizer import load_tokenizer; load_tokenizer("
                              f"'smollm2-135m-instruct').hf.save_pretrained({a.tokenizer!r})"])
    if a.tests:
        j.phase("cpu-proofs", [python(), "-m", "pytest", "-q", "tests/test_lora.py"])
    out = j.path("lora.jsonl")
    for item in a.shapes_ranks:  # shape:ranks[:generators[:steps]]
        shape, ranks, gens, steps = (item.split(":") + ["", "", ""])[:4]
        if j.phase(f"lora-{shape}", [python(), "bench/lora.py", "--shapes", shape, "--ranks", ranks, "--gpus",
                                     str(a.gpus), "--steps", steps or str(a.steps), "--generators",
                                     gens or a.generators, "--tokenizer", a.tokenizer, "--out", out,
                                     "--timeout", str(a.timeout)]) and not j.dry:
            stamp_file(out, a.commit)
    return j.finish()


def lora_options(p):
    p.add_argument("--shapes-ranks", nargs="+", default=["3b:0,16", "7b:0,16", "14b:16"],
                   metavar="SHAPE:RANKS[:GENERATORS[:STEPS]]", help="rank 0 is full fine-tuning (the peer)")
    p.add_argument("--gpus", type=int, default=1, help="2 runs the same under torchrun")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--generators", default="adapters,merged", help="model.lora_generator values for ranks > 0")
    p.add_argument("--tokenizer", default=".stage/smol_tok", help="SmolLM2's tokenizer as an HF folder (made if absent)")
    p.add_argument("--timeout", type=int, default=3600, help="seconds a run may take")
    p.add_argument("--tests", type=int, default=1, help="0 skips the CPU proofs (tests/test_lora.py)")


lora.options, lora.check = lora_options, lambda a: None


@job("lora-pair", "LoRA against full fine-tuning from one SFT, equal RL seconds, both read once on test "
                  "(the ablate job with lane lora, on the synchronous recipe: --base-abl synchronous by default)")
def lora_pair(a, j: Job) -> int:
    from device import ablate
    a.arms, a.test = ["lora"], ["recipe", "lora"]
    return ablate(a, j)


def lora_pair_options(p):
    from device import ablate_options
    ablate_options(p)
    for act in p._actions:  # the pair's lane is fixed; its RL time and base (lora.yaml's own) are the pair's own
        if act.dest == "arms":
            act.required, act.default = False, ["lora"]
        if act.dest == "rl_seconds":
            act.default = 450.0
        if act.dest == "base_abl":
            act.default = ["synchronous"]


def lora_pair_check(a):
    from device import ablate_check
    a.arms, a.test = ["lora"], ["recipe", "lora"]
    ablate_check(a)


lora_pair.options, lora_pair.check = lora_pair_options, lora_pair_check


@job("scale", "weak scaling of one RL iteration under FSDP2: the same work a GPU on 1, 2, ... N GPUs (3B shape)")
def scale(a, j: Job) -> int:
    model = j.path("model-3b")
    if not j.phase("random-model", [python(), "bench/random_model.py", "--shape", "3b", "--tokenizer", a.tokenizer,
                                    "--out", model], keep=[os.path.join(model, "config.json")]):
        return j.finish()
    for n in a.gpu_counts:
        j.phase(f"n{n}", ["torchrun", "--standalone", f"--nproc_per_node={n}", "train.py",
                          *configs("configs/smoke.yaml"), f"model.path={model}", f"model.tokenizer={a.tokenizer}",
                          f"rollout.prompts={a.per_gpu * n}", "rollout.n=4", f"train.steps={a.steps}", "train.lr=1e-6",
                          "train.critic_lr=1e-6", "log.progress=false", "log.trajectories=false",
                          "train.checkpoint_every=1000", f"run.dir={j.path(f'n{n}')}", *a.set],
                fresh=[j.path(f"n{n}")])
    done = [str(n) for n in a.gpu_counts if j.done(f"n{n}")]
    if done and not j.dry:
        out = j.path("scale.jsonl")
        j.phase("report", [python(), "bench/scale_report.py", j.res, *done])
        with open(j.path("report.log")) as f:
            lines = [ln for ln in f.read().splitlines() if ln.startswith("{")]
        with open(out, "w") as f:
            f.writelines(ln + "\n" for ln in lines)
        stamp_file(out, a.commit)
    return j.finish()


def scale_options(p):
    p.add_argument("--gpu-counts", nargs="+", type=int, default=[1, 2, 8])
    p.add_argument("--tokenizer", default=".stage/smol_tok", help="SmolLM2's tokenizer as an HF folder")
    p.add_argument("--per-gpu", type=int, default=16, help="prompts a GPU an iteration (x 4 samples)")
    p.add_argument("--steps", type=int, default=4)


scale.options, scale.check = scale_options, lambda a: None
