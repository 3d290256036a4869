#!/usr/bin/env bash
# Issue 21, the overlapped schedule (r1/generate.py `overlap`), on a 2-GPU machine, no model file needed:
# GPU 0: the agent-loop benchmark of the Qwen2.5-3B shape; GPU 1 at the same time: the GPU tests, then the
# agent-loop benchmark of the SmolLM2-135M shape, then (BENCH=1) the single-turn 3B benchmark against HF generate.
# Each agent benchmark runs the defaults (instrumented and --gap), then the schedules listed, on the same
# generator: 16-sync is the old one (no chunk in flight), N an overlapped one with N-step chunks; a schedule
# listed twice shows the run-to-run spread.
#   bench/h200_overlap.sh RESULTS_DIR [TOKENIZER]   (TOKENIZER: an HF tokenizer folder where the GGUF package is absent)
#   env: S3B, S135 (schedules), BENCH
set -u
R=$1; mkdir -p "$R"
TOKARG=${2:+--tokenizer $2}
. "$(dirname "$0")/phases.sh"  # log, phase
export TORCHINDUCTOR_COMPILE_THREADS=${TORCHINDUCTOR_COMPILE_THREADS:-4}  # two jobs share the host's cores
{ phase agent-3b env CUDA_VISIBLE_DEVICES=0 python3 bench/agent_rollout.py --model 3b --gap \
    --schedules ${S3B:-16-sync,8,4,2,16,8,4} $TOKARG; } &
{ phase gpu-tests env CUDA_VISIBLE_DEVICES=1 python3 -m pytest -q -m gpu tests
  phase agent-135m env CUDA_VISIBLE_DEVICES=1 python3 bench/agent_rollout.py --model 135m --gap \
    --schedules ${S135:-16-sync,8,4,2,16,8,4,2,16-sync} $TOKARG
  [ "${BENCH:-0}" = 1 ] && phase rollout-3b env CUDA_VISIBLE_DEVICES=1 python3 bench/rollout.py --models 3b --batches 256; } &
wait
log "all done"
touch "$R/ALL.done"
