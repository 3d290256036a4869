"""The rollout engine's jobs of bench/device.py: decode paths, the agent loop, FlashAttention-4, the fast path.

rollout: the GPU tests of the generator and kernels, then bench/rollout.py (3B shape, batch 256) once a path
(default with the HF peer, kernels.fuse=false, kernels.compile=false, both) and the decode profile.
agent: the agent-loop benchmark (bench/agent_rollout.py --gap) of each shape on each path (default, nochunk,
eager) and chunk schedules, a shape a GPU. fa4: FlashAttention-4 against kernels.fa4=false in every pair
(bench/stage_fa4.sh installs it first). compile: does the fast path learn as the eager one does, GRPO from
one SFT on two GPUs. Each measurement's JSON goes to RESULTS_DIR. Paths are set by flags of the bench scripts
(--kernels KEY=VALUE: bench/kernels_flag.py) and by kernels.KEY=VALUE overrides of train.py.
"""
import os

from device import FIRST, configs, job, read
from device_jobs import stamp_file
from phases import Job, python

EAGER = ["kernels.compile=false", "kernels.fuse=false", "kernels.chunk_graphs=false"]  # train.py overrides
PATHS = {"default": [], "nochunk": ["--no-chunk-graphs"], "eager": ["--eager-paths"]}  # bench/agent_rollout.py flags


def gpu_tests(j: Job, name="gpu-tests", files=("tests",), gpu=None, env=None):
    return j.phase(name, [python(), "-m", "pytest", "-q", "-m", "gpu", *files, "-p", "no:cacheprovider"],
                   gpu=gpu, env=env)


@job("rollout", "the decode paths timed on one shape (bench/rollout.py, 3B, batch 256) and the fastest's profile")
def rollout(a, j: Job) -> int:
    if a.tests:
        gpu_tests(j, files=("tests/test_generate.py", "tests/test_model.py", "tests/test_decode_kernel.py",
                            "tests/test_sample_kernel.py"))
    for name, kernels, peer in (("default", [], True), ("unfused", ["fuse=false"], False),
                                ("eager", ["compile=false"], False),
                                ("unfused-eager", ["fuse=false", "compile=false"], False)):
        out = j.path(f"rollout-{name}.json")
        if j.phase(f"rollout-{name}", [python(), "bench/rollout.py", "--models", a.models, "--batches", a.batches,
                                       "--save", out] + ([] if peer else ["--no-peer"])
                   + (["--kernels", *kernels] if kernels else [])) and not j.dry:
            stamp_file(out, a.commit)
    j.phase("profile", [python(), "bench/profile_decode.py"])
    return j.finish()


def rollout_options(p):
    p.add_argument("--models", default="3b")
    p.add_argument("--batches", default="256")
    p.add_argument("--tests", type=int, default=1, help="0: no GPU tests first")


rollout.options, rollout.check = rollout_options, lambda a: None


@job("agent", "the agent-loop benchmark (bench/agent_rollout.py --gap) of each shape on each path and schedule")
def agent(a, j: Job) -> int:
    gpus = a.gpus or [None]
    tok = ["--tokenizer", a.tokenizer] if a.tokenizer else []

    def shape(i, model):
        g = gpus[i % len(gpus)]
        if a.tests and i == 0:
            gpu_tests(j, gpu=g)
        for path in a.paths:
            sched = a.schedules.get(model) if path == "default" else None
            out = j.path(f"agent-{model}-{path}.json")
            if j.phase(f"agent-{model}-{path}", [python(), "bench/agent_rollout.py", "--model", model, "--gap", *tok,
                                                 "--save", out, *PATHS[path]]
                       + (["--schedules", sched] if sched else []), gpu=g) and not j.dry:
                stamp_file(out, a.commit)
        if a.bench and model == "3b":
            out = j.path("rollout-3b.json")
            j.phase("rollout-3b", [python(), "bench/rollout.py", "--models", "3b", "--batches", "256", "--save", out],
                    gpu=g)

    Job.parallel(*[(lambda i=i, m=m: shape(i, m)) for i, m in enumerate(a.models)])
    return j.finish()


def agent_options(p):
    p.add_argument("--models", nargs="+", default=["3b", "135m"], help="shapes; with --gpus, one a GPU")
    p.add_argument("--paths", nargs="+", default=["default", "eager"], choices=list(PATHS),
                   help="default: compiled ops, fused projections, chunk graphs; nochunk: kernels.chunk_graphs=false; "
                        "eager: none of them")
    p.add_argument("--schedules", nargs="*", default=[], metavar="SHAPE=LIST",
                   help="chunk schedules timed on the default path, e.g. 3b=16-sync,8,4 135m=4-nomix,4")
    p.add_argument("--gpus", nargs="*", default=[])
    p.add_argument("--tokenizer", default="", help="an HF tokenizer folder where the GGUF package is absent")
    p.add_argument("--tests", type=int, default=1, help="0: no GPU tests first")
    p.add_argument("--bench", type=int, default=0, help="1: then the single-turn 3B benchmark against HF generate")


def agent_check(a):
    a.schedules = dict(s.split("=", 1) for s in a.schedules if "=" in s)


agent.options, agent.check = agent_options, agent_check


@job("fa4", "FlashAttention-4 against torch's varlen path: kernels, its tests, train step, agent loop, gap")
def fa4(a, j: Job) -> int:
    tok = a.tokenizer
    check = ("import torch; from kernels import attention as A; "
             "q = torch.empty(1, 16, 128, device='cuda', dtype=torch.bfloat16); "
             "print(A.fa4_version(), A.pick_backend(q)); assert A.pick_backend(q) == 'fa4', A.fa4_refusal(q)")
    if not j.phase("check", [python(), "-c", check], timeout=300):
        return j.finish()
    j.phase("kernels", [python(), "bench/attention.py", "--out", j.path("kernels.json")], timeout=420)
    j.phase("tests-fa4", [python(), "-m", "pytest", "-q", "-m", "gpu", "tests/test_attention.py"], timeout=540)
    off = ["--kernels", "fa4=false"]
    j.phase("train-base", [python(), "bench/train_step.py", "--no-peer", *off], timeout=300)
    j.phase("train-fa4", [python(), "bench/train_step.py", "--no-peer", "--kernels", "attention=fa4"], timeout=300)
    agent_cmd = [python(), "bench/agent_rollout.py", "--model", "3b", "--gap", "--tokenizer", tok]
    j.phase("agent-base", agent_cmd + off, timeout=360)
    j.phase("agent-fa4", agent_cmd, timeout=360)
    j.phase("gap-base", [python(), "bench/logprob_gap.py", "--model", "3b", *off], timeout=240)
    j.phase("gap-fa4", [python(), "bench/logprob_gap.py", "--model", "3b"], timeout=240)
    j.phase("agent-fa4cache", agent_cmd + ["--kernels", "fa4_cache=true"], timeout=360)
    j.phase("tests-gpu", [python(), "-m", "pytest", "-q", "-m", "gpu", "tests", "--ignore=tests/test_attention.py"],
            env={"R1_TEST_TOKENIZER": tok}, timeout=480)
    out = j.path("attention.json")
    if j.phase("collect", [python(), "bench/attention.py", "--collect", j.res, "--out", out]) and not j.dry:
        stamp_file(out, a.commit)
    return j.finish()


def fa4_options(p):
    p.add_argument("--tokenizer", default="/root/stage/fa4/tok", help="SmolLM2's tokenizer (bench/stage_fa4.sh)")


fa4.options, fa4.check = fa4_options, lambda a: None


@job("compile", "the fast path against eager: GRPO from one SFT, equal time, a GPU each, test reads compared; "
                "FSDP run; agent-loop benchmarks of both paths (2 GPUs)")
def compile_job(a, j: Job) -> int:
    cfg = configs(*FIRST) + ["log.progress=false"]
    sft = j.path("sft")

    def bench():
        j.phase("bench-single", [python(), "bench/rollout.py", "--models", "3b", "--batches", "256",
                                 "--save", j.path("rollout-3b.json")], gpu=1)
        gpu_tests(j, gpu=1)

    def sft_phase():
        return j.phase("sft", [python(), "train.py", *cfg, f"model.path={a.model}", "train.stage=sft",
                               "train.sft_steps=0", f"run.dir={sft}", f"train.steps={a.sft_steps}", "train.lr=5e-5",
                               "train.warmup=20", "train.schedule=cosine", "train.checkpoint_every=100000", *a.set],
                       gpu=0, keep=[os.path.join(sft, "hf")], fresh=[sft])

    ok = Job.parallel(sft_phase, *([bench] if a.bench else []))[0]
    if not ok:
        return j.finish()

    def rl(gpu, name, kernels):
        if j.phase(name, [python(), "train.py", *cfg, f"model.path={sft}/hf", "train.sft_steps=0",
                          f"run.dir={j.path(name)}", "algo.advantage=grpo", f"train.time_limit={a.rl_seconds}",
                          "train.steps=100000", "train.checkpoint_every=100000", "eval.every=0", *kernels, *a.set],
                   gpu=gpu, env={"R1_PROFILE": str(a.profile)} if a.profile else {},
                   fresh=[j.path(name)]):
            read(j, f"eval-{name}", cfg + [f"model.tokenizer={sft}/hf"], j.path(name), "test", gpu=gpu)

    Job.parallel(lambda: rl(0, "rl-eager", a.slow), lambda: rl(1, "rl-default", []))
    j.phase("compare", [python(), "-m", "r1.compare", j.path("eval-rl-eager"), j.path("eval-rl-default")])
    if a.fsdp:
        j.phase("fsdp-default", ["torchrun", "--standalone", "--nproc_per_node=2", "train.py", *cfg,
                                 f"model.path={sft}/hf", "train.sft_steps=0", f"run.dir={j.path('fsdp-default')}",
                                 "algo.advantage=grpo", "train.steps=3", "train.checkpoint_every=100000",
                                 "eval.every=0", *a.set], fresh=[j.path("fsdp-default")])
    if a.bench:
        def agents(gpu, model):
            for path in ("default", "eager"):
                j.phase(f"agent-{model}-{path}", [python(), "bench/agent_rollout.py", "--model", model, "--gap",
                                                  "--tokenizer", f"{sft}/hf", "--save",
                                                  j.path(f"agent-{model}-{path}.json"), *PATHS[path]], gpu=gpu)
        Job.parallel(lambda: agents(0, "135m"), lambda: agents(1, "3b"))
    return j.finish()


def compile_options(p):
    p.add_argument("--model", required=True, help="the GGUF the SFT starts from")
    p.add_argument("--rl-seconds", type=float, default=300.0)
    p.add_argument("--sft-steps", type=int, default=467)
    p.add_argument("--slow", nargs="*", default=EAGER, metavar="KEY=VALUE",
                   help="the eager lane's train.py overrides (its agent benchmarks: --eager-paths)")
    p.add_argument("--bench", type=int, default=1, help="1: the benchmarks beside the SFT and at the end")
    p.add_argument("--fsdp", type=int, default=1, help="1: the 2-GPU FSDP run")
    p.add_argument("--profile", type=int, default=0, help="iteration N of each RL lane under R1_PROFILE")


compile_job.options, compile_job.check = compile_options, lambda a: None
