#!/usr/bin/env bash
# Issue 31, the last line of deliverable 4: the 3B shape's iteration time with and without overlap, one H200.
# A Qwen2.5-3B-shaped model with random weights and SmolLM2's vocabulary (bench/random_model.py: speed and memory
# do not depend on the weights' values), configs/gsm8k_tool.yaml (PPO, critic, step GAE) at 32 prompts x 8:
# bench/h200_iteration.sh's ppo-o0, ppo-o1 and ppo-o2 (the rollout in a process), STEPS iterations each, the GPU
# to itself (an overlapped run's last iteration starts no rollout: STEPS 4 leaves two steady ones). A random policy
# rarely makes a tool call, so most episodes end after one turn of up to rollout.max_new_tokens (measured: 1.05
# turns, 200 response tokens an episode; docs/results/iteration_3b), about a trained agent's 169 (recipe1), in fewer turns.
# run.save=false: a 3B checkpoint with its critic and AdamW state is about 64 GiB, the device's whole disk.
#   bench/h200_iteration_3b.sh TOKENIZER_DIR RESULTS_DIR   (TOKENIZER_DIR: an HF folder holding SmolLM2's
#     tokenizer, e.g. an SFT run's hf/; results to bench/results/iteration_3b_h200.json unless SAVE is set)
#   env: STEPS (default 4), MODEL (an existing model folder, or `tiny` for a CPU dry run, instead of the random
#     3B one), EXTRA (more overrides for both runs), SAVE ('' = print only)
#   (in the background, then calls of `bench/h200_wait.sh RESULTS_DIR . $OUT`)
set -u
[ $# -eq 2 ] || { echo "usage: bench/h200_iteration_3b.sh TOKENIZER_DIR RESULTS_DIR (see the comment at its top)"; exit 2; }
T=$1; R=$2
[ -n "${MODEL:-}" ] || [ -f "$T/tokenizer.json" ] || { echo "error: $T has no tokenizer.json (an HF folder, e.g. an SFT run's hf/)"; exit 2; }
mkdir -p "$R"
M=${MODEL:-$R/model-3b}
if [ -z "${MODEL:-}" ] && [ ! -f "$M/config.json" ]; then
  python3 "$(dirname "$0")/random_model.py" --shape 3b --tokenizer "$T" --out "$M" || exit 1
fi
STEPS=${STEPS:-4} SAVE=${SAVE-bench/results/iteration_3b_h200.json} \
  ONLY="ppo-o0 ppo-o1 ppo-o2" \
  EXTRA="rollout.prompts=32 run.save=false ${EXTRA:-}" bash "$(dirname "$0")/h200_iteration.sh" "$M" "$R"
