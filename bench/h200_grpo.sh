#!/usr/bin/env bash
# Issue 21, a GRPO iteration with the overlapped schedule: SFT of SmolLM2-135M on GPU 0 (as bench/h200_micro.sh),
# then GRPO of configs/gsm8k_tool.yaml from it, ITERS iterations, the defaults on GPU 0 and R1_OVERLAP=0 (the old
# schedule) on GPU 1 at the same time, the same seed.
#   bench/h200_grpo.sh MODEL.gguf RESULTS_DIR      env: ITERS (default 20), SFT_STEPS (default 467), SOLO=1 (GPU 0 only)
set -u
M=$1; R=$2; mkdir -p "$R"
C="--config configs/gsm8k_tool.yaml log.progress=false"
. "$(dirname "$0")/phases.sh"  # log, phase
phase sft env CUDA_VISIBLE_DEVICES=0 python3 train.py $C model.path="$M" train.stage=sft train.sft_steps=0 \
  run.dir="$R/sft" train.steps=${SFT_STEPS:-467} train.lr=5e-5 train.warmup=20 train.schedule=cosine \
  train.checkpoint_every=100000 || { log "SFT failed"; exit 1; }
grpo() {  # gpu name env...
  local g=$1 n=$2; shift 2
  phase "$n" env CUDA_VISIBLE_DEVICES=$g "$@" python3 train.py $C model.path="$R/sft/hf" train.sft_steps=0 \
    run.dir="$R/$n" algo.advantage=grpo train.steps=${ITERS:-20} train.checkpoint_every=100000 eval.every=0
}
if [ "${SOLO:-0}" = 1 ]; then grpo 0 grpo-overlap; else grpo 0 grpo-overlap & grpo 1 grpo-sync R1_OVERLAP=0 & wait; fi
log "all done"
touch "$R/ALL.done"
