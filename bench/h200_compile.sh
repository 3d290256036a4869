#!/usr/bin/env bash
# Issue 21's missing proof, as one job on a 2-GPU machine: does the compiled path (R1_COMPILE=1 R1_FUSE=1)
# learn as the default path does, and how much faster is a GRPO iteration of configs/gsm8k_tool.yaml with it?
# The same SFT checkpoint, the same seed and the same wall time on each GPU: default on GPU 0, compiled on
# GPU 1; then both evaluated on the full test set (greedy) and compared pair by pair; then the single-turn
# and agent-loop benchmarks of both paths on GPU 0, and an FSDP run of the compiled path on both GPUs.
#
#   bench/h200_compile.sh MODEL.gguf RESULTS_DIR
#   env: RL_TIME (seconds of RL each, default 300), SFT_STEPS (default 467), SKIP (phase names not to run),
#        FAST (the environment of the compiled lane, default "R1_COMPILE=1 R1_FUSE=1"),
#        SFT_EXTRA / RL_EXTRA (overrides for train.py), EVAL_LIMIT (default 0 = all), BENCH (1 = run the
#        benchmarks, default 1)
#   bench/h200_collect.sh RESULTS_DIR . $OUT     # in later calls: progress, metrics, evals, logs
# Every phase writes $R/<phase>.done and is skipped when that exists (bench/phases.sh), so a restart continues.
set -u
M=$1; R=$2; mkdir -p "$R"
RL_TIME=${RL_TIME:-300}; SFT_STEPS=${SFT_STEPS:-467}; FAST=${FAST:-"R1_COMPILE=1 R1_FUSE=1"}
C="--config configs/gsm8k_tool.yaml log.progress=false"
. "$(dirname "$0")/phases.sh"  # log, phase

ev() {  # gpu model name: both policies are evaluated on the default path, so only the training differs
  local g=$1 m=$2 n=$3
  phase "eval-$n" env CUDA_VISIBLE_DEVICES=$g python3 eval.py $C model.path=$m eval.out="$R/eval-$n" \
    model.tokenizer="$R/sft/hf" eval.limit=${EVAL_LIMIT:-0}
}
rl() {  # gpu name [env...]: GRPO from the SFT checkpoint for RL_TIME seconds (env: its path), then its eval
  local g=$1 n=$2; shift 2
  phase "$n" env CUDA_VISIBLE_DEVICES=$g "$@" python3 train.py $C model.path="$R/sft/hf" train.sft_steps=0 \
    run.dir="$R/$n" algo.advantage=grpo train.time_limit=$RL_TIME train.steps=100000 \
    train.checkpoint_every=100000 eval.every=0 ${RL_EXTRA:-} && ev $g "$R/$n" "$n"
}

phase sft env CUDA_VISIBLE_DEVICES=0 python3 train.py $C model.path="$M" train.stage=sft train.sft_steps=0 \
  run.dir="$R/sft" train.steps=$SFT_STEPS train.lr=5e-5 train.warmup=20 train.schedule=cosine \
  train.checkpoint_every=100000 ${SFT_EXTRA:-} || { log "SFT failed"; exit 1; }
rl 0 rl-default & rl 1 rl-fast $FAST & wait
phase compare python3 -m r1.compare "$R/eval-rl-default" "$R/eval-rl-fast"
if [ "${BENCH:-1}" = 1 ]; then
  phase bench-default env CUDA_VISIBLE_DEVICES=0 python3 bench/agent_rollout.py --model 135m --gap
  phase bench-fast env CUDA_VISIBLE_DEVICES=0 $FAST python3 bench/agent_rollout.py --model 135m --gap
  phase bench-single env CUDA_VISIBLE_DEVICES=0 python3 bench/rollout.py --models 3b --batches 256
  phase bench-single-fast env CUDA_VISIBLE_DEVICES=0 $FAST python3 bench/rollout.py --models 3b --batches 256
  phase fsdp-fast env $FAST torchrun --standalone --nproc_per_node=2 train.py $C model.path="$R/sft/hf" \
    train.sft_steps=0 run.dir="$R/fsdp-fast" algo.advantage=grpo train.steps=3 train.checkpoint_every=100000 \
    eval.every=0 ${RL_EXTRA:-}
fi
log "all done"
touch "$R/ALL.done"
