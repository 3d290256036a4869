#!/usr/bin/env bash
# Issue 21, the update's micro-batch size: a GRPO iteration of configs/gsm8k_tool.yaml (SmolLM2-135M after SFT,
# 512 episodes) with 16,384-token micro-batches (the old cap of train.micro_tokens=auto) on GPU 0 and with auto
# (65,536 where it fits with every slot and no checkpointing: r1/memory.py BIG_MICRO_TOKENS) on GPU 1, the same
# seed and ITERS iterations each, from one SFT checkpoint.
#   bench/h200_micro.sh MODEL.gguf RESULTS_DIR      env: ITERS (default 8), SFT_STEPS (default 467)
set -u
M=$1; R=$2; mkdir -p "$R"
C="--config configs/gsm8k_tool.yaml log.progress=false"
. "$(dirname "$0")/phases.sh"  # log, phase
phase sft env CUDA_VISIBLE_DEVICES=0 python3 train.py $C model.path="$M" train.stage=sft train.sft_steps=0 \
  run.dir="$R/sft" train.steps=${SFT_STEPS:-467} train.lr=5e-5 train.warmup=20 train.schedule=cosine \
  train.checkpoint_every=100000 || { log "SFT failed"; exit 1; }
grpo() {  # gpu name overrides...
  local g=$1 n=$2; shift 2
  phase "$n" env CUDA_VISIBLE_DEVICES=$g python3 train.py $C model.path="$R/sft/hf" train.sft_steps=0 \
    run.dir="$R/$n" algo.advantage=grpo train.steps=${ITERS:-8} train.checkpoint_every=100000 eval.every=0 "$@"
}
grpo 0 micro-16k train.micro_tokens=16384 & grpo 1 micro-auto & wait
log "all done"
touch "$R/ALL.done"
