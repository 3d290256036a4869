#!/usr/bin/env bash
# Issue 31 item 3 on one H200, train.share_prefix (each group's prompt packed once per micro-batch, r1/packing.py)
# as one device job: its GPU test (the CUDA attention backends with shared rows against the math path), then
# bench/share_prefix_step.py at the 135M and 3B shapes (scoring and one update step, whole vs shared vs
# transformers, same run), then the iteration lanes of bench/h200_iteration.sh with and without the key, from one
# SFT. Phases are resumable; one bench/h200_wait.sh follows the whole job (the iteration script runs last).
#   setsid nohup bash bench/h200_share_prefix.sh MODEL.gguf RESULTS_DIR &
#   env: SFT_STEPS (default 467), ONLY (iteration lanes, default "ppo-o0 ppo-o0-sp grpo-o0 grpo-o0-sp ppo-o2
#        ppo-o2-sp"), SKIP (phases not to run), STEPS (iterations a lane, h200_iteration.sh's default 12)
#   Results: bench/results/share_prefix_135m.json, share_prefix_3b.json, iteration_share_prefix_h200.json.
set -u
me=${R1_SCRIPT_NAME:-bench/h200_share_prefix.sh}
[ $# -ge 2 ] || { echo "usage: $me MODEL RESULTS_DIR (see the comment at its top)"; exit 2; }
[ -d configs/ablations ] || { echo "$me: run it from the repository root (no configs/ablations here)"; exit 2; }
M=$1; R=$2; mkdir -p "$R"
. "$(dirname "$0")/phases.sh"  # log, phase
log "begin: share_prefix, $(python3 -c 'import torch; print(torch.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu")')"
phase gpu-test python3 -m pytest -q -m gpu tests/test_share_prefix.py
phase bench-135m python3 bench/share_prefix_step.py --model 135m --save
phase bench-3b python3 bench/share_prefix_step.py --model 3b --prompts 16 --micro-tokens 16384 --save
SFT_STEPS="${SFT_STEPS:-467}" ONLY="${ONLY:-ppo-o0 ppo-o0-sp grpo-o0 grpo-o0-sp ppo-o2 ppo-o2-sp}" \
  SAVE=bench/results/iteration_share_prefix_h200.json bash "$(dirname "$0")/h200_iteration.sh" "$M" "$R"
