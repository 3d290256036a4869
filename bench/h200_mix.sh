#!/usr/bin/env bash
# Issue 21, mixed steps (r1/generate.py `mix`: observations prefilled in the first decode step of their chunk),
# on one GPU, no model file needed: the GPU tests, then the agent-loop benchmark of the Qwen2.5-3B shape and of
# the SmolLM2-135M shape. Each runs the defaults (instrumented, --gap), then the schedules listed on the same
# generator: N-nomix prefills observations in forwards of their own (kernels.mixed_steps=false), N mixes them; each listed twice
# shows the run-to-run spread. BENCH=1 then runs the single-turn 3B benchmark against HF generate.
#   bench/h200_mix.sh RESULTS_DIR [TOKENIZER]   (TOKENIZER: an HF tokenizer folder where the GGUF package is absent)
#   env: S3B, S135 (schedules), TESTS=0 (skip the GPU tests), BENCH
set -u
R=$1; mkdir -p "$R"
TOKARG=${2:+--tokenizer $2}
. "$(dirname "$0")/phases.sh"  # log, phase
[ "${TESTS:-1}" = 1 ] && phase gpu-tests python3 -m pytest -q -m gpu tests
phase agent-3b python3 bench/agent_rollout.py --model 3b --gap --schedules ${S3B:-4-nomix,4,4-nomix,4} $TOKARG
phase agent-135m python3 bench/agent_rollout.py --model 135m --gap --schedules ${S135:-4-nomix,4,4-nomix,4,8,8-nomix} $TOKARG
[ "${BENCH:-0}" = 1 ] && phase rollout-3b python3 bench/rollout.py --models 3b --batches 256
log "all done"
touch "$R/ALL.done"
