#!/usr/bin/env bash
# The learning proof (issue 8) and the trainer's GPU runs (issue 6), as one job on a 2-GPU machine.
#
# Two lanes run side by side, one per GPU, so PPO and GRPO get the same hardware and time:
#   first: the GPU tests of the Triton decode/sampling kernels (a failure turns that kernel off)
#   lane 0: base eval -> GPU tests + logprob-gap bench -> BENCH -> (after SFT) RL step-level PPO -> eval -> EXTRA
#   lane 1: SFT on GSM8K expert calculator chats -> eval -> RL GRPO -> eval
# then the 2-GPU FSDP run of configs/gsm8k_tool.yaml and the quickstart on one GPU.
# Every phase writes $R/<phase>.done when it succeeds and is skipped when that file exists, so the
# job can be started again after a fix and continues where it stopped. Each eval is the full split.
#
#   bench/h200_learn.sh MODEL.gguf GSM8K_DIR RESULTS_DIR
#   env: RL_TIME (seconds per RL run, default 600), SFT_STEPS (default 467 = 2 epochs of 7,473 at 32),
#        EVAL_LIMIT (0 = all 1,319 test problems), GPU_A/GPU_B (default 0/1), LANES (default "0 1"),
#        RL_LRS (learning rates, default "1e-5"; several run side by side on each GPU, named rl-ppo-lrX),
#        RL_EXTRA (overrides appended to every RL run, e.g. "algo.minibatches=4 env.max_steps=10"),
#        PPO_EXTRA / GRPO_EXTRA (overrides for one algorithm, e.g. GRPO_EXTRA="algo.drop_uniform_groups=true"),
#        SKIP (phase names not to run), PRE (a command run on GPU A before the lanes, on quiet GPUs),
#        BENCH (a command lane 0 runs on GPU A while SFT trains on GPU B), EXTRA (a command lane 0 runs last,
#        e.g. benchmarks once GPU A is free)
# Example: the second run (docs/results.md, "The first recipe"), from a copy of the repo, under setsid:
#   PYTHONPATH=/tmp/site:. RL_TIME=720 RL_LRS="1e-5 3e-5" SKIP="eval-base logprob-gap fsdp quickstart" \
#     BENCH="python3 bench/rollout_multiturn.py; python3 bench/profile_decode.py" \
#     EXTRA="python3 bench/rollout.py --save" \
#     setsid nohup bash bench/h200_learn.sh /root/stage/smollm2.gguf /root/stage/gsm8k /root/res &
# The third run (docs/results/run3): one RL run per GPU, GRPO with the uniform-group filter, the rollout
#   paths timed on GPU A during SFT:
#   RL_TIME=900 SKIP="eval-base logprob-gap fsdp quickstart" GRPO_EXTRA="algo.drop_uniform_groups=true" \
#     BENCH="SKIP_TESTS=1 timeout 330 bash bench/h200_rollout_paths.sh /root/res/paths" setsid nohup bash ...
#   bench/h200_collect.sh /root/res . $OUT     # in later calls: progress, metrics, evals, logs
set -u
M=$1; D=$2; R=$3; mkdir -p "$R"
RL_TIME=${RL_TIME:-600}; SFT_STEPS=${SFT_STEPS:-467}; EVAL_LIMIT=${EVAL_LIMIT:-0}
GA=${GPU_A:-0}; GB=${GPU_B:-1}
C="--config configs/gsm8k_tool.yaml data.path=$D log.progress=false"
# RL recipe shared by PPO and GRPO (configs/gsm8k_tool.yaml): 64 prompts x 8 samples, 512 slots, 4 optimizer
# steps per iteration, lr from RL_LRS, held-out accuracy on the first 256 test problems every 5 iterations.
RLARGS="rollout.prompts=64 rollout.n=8 rollout.slots=512 algo.minibatches=4 train.critic_lr=1e-5 train.steps=1000
  train.time_limit=$RL_TIME train.checkpoint_every=1000 eval.every=5 eval.limit=256 ${RL_EXTRA:-}"
LRS=${RL_LRS:-1e-5}

. "$(dirname "$0")/phases.sh"  # log, phase
ev() {  # gpu model name
  phase "eval-$3" env CUDA_VISIBLE_DEVICES=$1 python3 eval.py $C model.path=$2 eval.limit=$EVAL_LIMIT \
    eval.out="$R/eval-$3" && tail -1 "$R/eval-$3.log" > "$R/eval-$3.json"
}
wait_for() { while [ ! -e "$R/$1.done" ]; do [ -e "$R/$1.failed" ] && return 1; sleep 5; done; }
rl() {  # gpu name advantage [overrides]: one run per learning rate in RL_LRS, side by side on that GPU, then evals
  local g=$1 name=$2 adv=$3 more=${4:-} lr tag
  for lr in $LRS; do
    tag=$name; [ "$(echo $LRS | wc -w)" -gt 1 ] && tag=$name-lr$lr
    ( phase $tag env CUDA_VISIBLE_DEVICES=$g python3 train.py $C model.path="$R/sft/hf" run.dir="$R/$tag" \
        algo.advantage=$adv train.lr=$lr $RLARGS $more && ev $g "$R/$tag/hf" $tag ) &
  done
  wait
}

lane0() {
  ev $GA "$M" base
  phase gpu-tests env CUDA_VISIBLE_DEVICES=$GA python3 -m pytest -q -m gpu tests -p no:cacheprovider
  phase logprob-gap env CUDA_VISIBLE_DEVICES=$GA python3 bench/logprob_gap.py --save
  [ -n "${BENCH:-}" ] && phase bench env CUDA_VISIBLE_DEVICES=$GA bash -c "$BENCH"
  wait_for sft || { log "lane0: SFT failed, no PPO"; return 1; }
  rl $GA rl-ppo step_gae "${PPO_EXTRA:-}"
  [ -n "${EXTRA:-}" ] && phase extra env CUDA_VISIBLE_DEVICES=$GA bash -c "$EXTRA"
}
lane1() {
  phase sft env CUDA_VISIBLE_DEVICES=$GB python3 train.py $C model.path="$M" train.stage=sft run.dir="$R/sft" \
    train.steps=$SFT_STEPS train.lr=5e-5 train.warmup=20 train.schedule=cosine train.checkpoint_every=100000 \
    || { touch "$R/sft.failed"; return 1; }
  ev $GB "$R/sft/hf" sft
  rl $GB rl-grpo grpo "${GRPO_EXTRA:-}"
}

rm -f "$R/sft.failed"
log "begin: $(python3 -c 'import torch; print(torch.__version__, torch.cuda.device_count(), "GPUs")')"
# The Triton decode and sampling kernels must pass their GPU tests before anything relies on them;
# a failure switches that kernel off (kernels.decode=sdpa / kernels.sample=torch) for every run of the job.
phase check-decode env CUDA_VISIBLE_DEVICES=$GA python3 -m pytest -q -x -m gpu tests/test_decode_kernel.py \
  -p no:cacheprovider &
phase check-sample env CUDA_VISIBLE_DEVICES=$GB python3 -m pytest -q -x -m gpu tests/test_sample_kernel.py \
  -p no:cacheprovider &
wait
K=""
[ -e "$R/check-decode.done" ] || K="$K kernels.decode=sdpa"
[ -e "$R/check-sample.done" ] || K="$K kernels.sample=torch"
C="$C$K"
log "kernels:${K:- the defaults}"
[ -n "${PRE:-}" ] && phase pre env CUDA_VISIBLE_DEVICES=$GA bash -c "$PRE"
case "${LANES:-0 1}" in *0*) lane0 & ;; esac
case "${LANES:-0 1}" in *1*) lane1 & ;; esac
wait
# issue 6: the main config over 2 GPUs with FSDP2 (from the GGUF, a few iterations), and the quickstart on one GPU
phase fsdp torchrun --standalone --nproc_per_node=2 train.py $C model.path="$M" run.dir="$R/fsdp" train.steps=3 \
  eval.every=0 train.checkpoint_every=3
phase quickstart env CUDA_VISIBLE_DEVICES=$GA python3 train.py --config configs/quickstart.yaml run.dir="$R/quickstart" $K \
  log.progress=false
finish; exit $?
