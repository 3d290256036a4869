#!/usr/bin/env bash
# Issue 21, a GRPO iteration with the overlapped schedule: SFT of SmolLM2-135M on GPU 0 (as bench/h200_micro.sh),
# then GRPO of configs/gsm8k_tool.yaml from it, ITERS iterations, lane A on GPU 0 and lane B on GPU 1 at the same
# time, the same seed. While SFT trains, GPU 1 runs (BENCH=1) the agent-loop benchmarks of both shapes.
#   bench/h200_grpo.sh MODEL.gguf RESULTS_DIR [TOKENIZER]
#   env: ITERS (default 20), SFT_STEPS (default 467), SOLO=1 (lane A only), SEQ=1 (lane B after lane A, both on
#        GPU 0: a one-GPU machine), BENCH=1,
#        A / B: lane overrides (default: A the defaults, B kernels.launch_ahead=false: the old schedule), e.g. B="rollout.sync_every=16"
set -u
M=$1; R=$2; mkdir -p "$R"
TOKARG=${3:+--tokenizer $3}
C="--config configs/gsm8k_tool.yaml log.progress=false"
. "$(dirname "$0")/phases.sh"  # log, phase
if [ "${BENCH:-0}" = 1 ]; then
  { phase agent-3b env CUDA_VISIBLE_DEVICES=1 python3 bench/agent_rollout.py --model 3b $TOKARG
    phase agent-135m env CUDA_VISIBLE_DEVICES=1 python3 bench/agent_rollout.py --model 135m $TOKARG; } &
fi
phase sft env CUDA_VISIBLE_DEVICES=0 python3 train.py $C model.path="$M" train.stage=sft train.sft_steps=0 \
  run.dir="$R/sft" train.steps=${SFT_STEPS:-467} train.lr=5e-5 train.warmup=20 train.schedule=cosine \
  train.checkpoint_every=100000 || { log "SFT failed"; exit 1; }
wait
grpo() {  # gpu name overrides...
  local g=$1 n=$2; shift 2
  local envs=(); while [ $# -gt 0 ] && [[ $1 == R1_* ]]; do envs+=("$1"); shift; done
  phase "$n" env CUDA_VISIBLE_DEVICES=$g "${envs[@]}" python3 train.py $C model.path="$R/sft/hf" train.sft_steps=0 \
    run.dir="$R/$n" algo.advantage=grpo train.steps=${ITERS:-20} train.checkpoint_every=100000 eval.every=0 "$@"
}
if [ "${SOLO:-0}" = 1 ]; then grpo 0 grpo-a ${A:-}
elif [ "${SEQ:-0}" = 1 ]; then grpo 0 grpo-a ${A:-}; grpo 0 grpo-b ${B:-kernels.launch_ahead=false}
else grpo 0 grpo-a ${A:-} & grpo 1 grpo-b ${B:-kernels.launch_ahead=false} & wait; fi
log "all done"
touch "$R/ALL.done"
