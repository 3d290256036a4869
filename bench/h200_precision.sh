#!/usr/bin/env bash
# Issue 31 items 3-4 on one H200, train.precision=bf16 (a bf16 copy of the weights runs the forward and backward,
# float32 master weights learn: r1/precision.py) as one device job: its GPU test, then the iteration lanes of
# bench/h200_iteration.sh with each group's prompt shared (train.share_prefix) and the rollout in a process, PPO
# and GRPO, with and without the copy, then one mini-batch an iteration, where scoring leaves the old logprobs to
# the update (GRPO synchronous with and without that; GRPO and PPO with the process), from one SFT. Phases are
# resumable; one bench/h200_wait.sh follows the whole job (the iteration script runs last).
#   setsid nohup bash bench/h200_precision.sh MODEL.gguf RESULTS_DIR &
#   env: SFT_STEPS (default 467), ONLY (iteration lanes, default "ppo-o2-sp ppo-o2-sp-bf grpo-o2-sp grpo-o2-sp-bf
#        grpo-o0-sp-bf-mb1-scored grpo-o0-sp-bf-mb1 grpo-o2-sp-bf-mb1 ppo-o2-sp-bf-mb1"), SKIP (phases not to
#        run), STEPS (iterations a lane)
#   Results: bench/results/iteration_precision_h200.json.
set -u
me=${R1_SCRIPT_NAME:-bench/h200_precision.sh}
[ $# -ge 2 ] || { echo "usage: $me MODEL RESULTS_DIR (see the comment at its top)"; exit 2; }
[ -d configs/ablations ] || { echo "$me: run it from the repository root (no configs/ablations here)"; exit 2; }
M=$1; R=$2; mkdir -p "$R"
. "$(dirname "$0")/phases.sh"  # log, phase
log "begin: precision, $(python3 -c 'import torch; print(torch.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu")')"
phase gpu-test python3 -m pytest -q -m gpu tests/test_precision.py
lanes="ppo-o2-sp ppo-o2-sp-bf grpo-o2-sp grpo-o2-sp-bf grpo-o0-sp-bf-mb1-scored grpo-o0-sp-bf-mb1 grpo-o2-sp-bf-mb1"
SFT_STEPS="${SFT_STEPS:-467}" \
  ONLY="${ONLY:-$lanes ppo-o2-sp-bf-mb1}" \
  SAVE=bench/results/iteration_precision_h200.json bash "$(dirname "$0")/h200_iteration.sh" "$M" "$R"
