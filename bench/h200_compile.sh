#!/usr/bin/env bash
# Issue 21's proof, as one job on a 2-GPU machine: does the fast path, now the default on CUDA (compiled ops,
# fused projections, prefill chunks in CUDA graphs), learn as the eager path does, and how much faster is a GRPO
# iteration of configs/gsm8k_tool.yaml with it? The same SFT checkpoint, the same seed and the same wall time on
# each GPU: eager (kernels.compile=false kernels.fuse=false kernels.chunk_graphs=false) on GPU 0, the defaults on GPU 1; then both evaluated
# on the full test set (greedy, default path) and compared pair by pair; then an FSDP run of the default path on
# both GPUs. While SFT trains on GPU 0, GPU 1 runs (BENCH=1) the single-turn 3B benchmark with its peer (HF
# generate) and the GPU tests; at the end, the agent-loop benchmark (bench/agent_rollout.py) of both paths, the
# 135M shape on GPU 0 and the 3B shape on GPU 1. PROFILE=N: iteration N of each RL lane runs under
# torch.profiler (R1_PROFILE, r1/profiler.py; unset: none. The 2026-11-30 run profiled iteration 5 of both lanes,
# and the reports' minutes came out of the lanes' equal wall time, before the trainer left them out of its clock).
#
#   bench/h200_compile.sh MODEL.gguf RESULTS_DIR
#   env: RL_TIME (seconds of RL each, default 300), SFT_STEPS (default 467), SKIP (phase names not to run),
#        SLOW (the overrides of the eager lane, default "kernels.compile=false kernels.fuse=false
#        kernels.chunk_graphs=false"; its agent-loop benchmark runs with --eager-paths),
#        SFT_EXTRA / RL_EXTRA (overrides for train.py), EVAL_LIMIT (default 0 = all), BENCH (1 = run the
#        benchmarks, default 1), FSDP (1 = the 2-GPU run, default 1), PROFILE (unset: no profile)
#   bench/h200_collect.sh RESULTS_DIR . $OUT     # in later calls: progress, metrics, evals, logs
# Every phase writes $R/<phase>.done and is skipped when that exists (bench/phases.sh), so a restart continues.
set -u
M=$1; R=$2; mkdir -p "$R"
RL_TIME=${RL_TIME:-300}; SFT_STEPS=${SFT_STEPS:-467}; SLOW=${SLOW:-"kernels.compile=false kernels.fuse=false kernels.chunk_graphs=false"}
C="--config configs/gsm8k_tool.yaml log.progress=false"
. "$(dirname "$0")/phases.sh"  # log, phase

ev() {  # gpu model name: both policies are evaluated on the default path, so only the training differs
  local g=$1 m=$2 n=$3
  phase "eval-$n" env CUDA_VISIBLE_DEVICES=$g python3 eval.py $C model.path=$m eval.out="$R/eval-$n" \
    model.tokenizer="$R/sft/hf" eval.limit=${EVAL_LIMIT:-0}
}
rl() {  # gpu name [overrides...]: GRPO from the SFT checkpoint for RL_TIME seconds (kernels.*: its path), then its eval
  local g=$1 n=$2; shift 2
  phase "$n" env CUDA_VISIBLE_DEVICES=$g R1_PROFILE=${PROFILE:-} python3 train.py $C model.path="$R/sft/hf" \
    train.sft_steps=0 run.dir="$R/$n" algo.advantage=grpo train.time_limit=$RL_TIME train.steps=100000 \
    train.checkpoint_every=100000 eval.every=0 ${RL_EXTRA:-} "$@" && ev $g "$R/$n" "$n"
}

bench() {  # on GPU 1 while SFT trains on GPU 0: the single-turn benchmark with its peer, the GPU tests
  phase bench-single env CUDA_VISIBLE_DEVICES=1 python3 bench/rollout.py --models 3b --batches 256
  phase gpu-tests env CUDA_VISIBLE_DEVICES=1 python3 -m pytest -q -m gpu tests
}
agents() {  # the agent-loop benchmark (bench/agent_rollout.py), default and eager: 135M on GPU 0, 3B on GPU 1
  local tok="--tokenizer $R/sft/hf" m g
  for m in 135m 3b; do
    g=$([ $m = 135m ] && echo 0 || echo 1)
    { phase agent-$m-default env CUDA_VISIBLE_DEVICES=$g python3 bench/agent_rollout.py --model $m --gap $tok
      phase agent-$m-eager env CUDA_VISIBLE_DEVICES=$g python3 bench/agent_rollout.py --model $m --gap $tok \
        --eager-paths; } &
  done
  wait
}
phase sft env CUDA_VISIBLE_DEVICES=0 python3 train.py $C model.path="$M" train.stage=sft train.sft_steps=0 \
  run.dir="$R/sft" train.steps=$SFT_STEPS train.lr=5e-5 train.warmup=20 train.schedule=cosine \
  train.checkpoint_every=100000 ${SFT_EXTRA:-} &
[ "${BENCH:-1}" = 1 ] && bench &
wait
[ -e "$R/sft.done" ] || { log "SFT failed"; exit 1; }
rl 0 rl-eager $SLOW & rl 1 rl-default & wait
phase compare python3 -m r1.compare "$R/eval-rl-eager" "$R/eval-rl-default"
if [ "${FSDP:-1}" = 1 ]; then
  phase fsdp-default torchrun --standalone --nproc_per_node=2 train.py $C model.path="$R/sft/hf" \
    train.sft_steps=0 run.dir="$R/fsdp-default" algo.advantage=grpo train.steps=3 train.checkpoint_every=100000 \
    eval.every=0 ${RL_EXTRA:-}
fi
[ "${BENCH:-1}" = 1 ] && agents
log "all done"
touch "$R/ALL.done"
