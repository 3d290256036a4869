#!/usr/bin/env bash
# Issue 30, "does it learn?": LoRA against full fine-tuning on GSM8K-tool, from ONE SFT checkpoint, for the same
# RL seconds each, alone on the GPU one after the other, then each read once on the whole test split and paired
# (python -m r1.compare: gained / lost / McNemar p): bench/h200_ablate_set.sh with configs/ablations/lora.yaml as
# its one lane and both lanes read on test. Nothing here chooses a setting: the rank, alpha and learning rate
# are the ablation file's, chosen before the run (its comment says why).
#   setsid nohup bash bench/h200_lora_pair.sh MODEL.gguf RESULTS_DIR [CONFIG] &     env: ABL_TIME (RL seconds a
#     lane, default 450), SFT_STEPS (default 872, the recipe's), EXTRA (overrides for every command: a CPU dry run)
#   Run it from the repository root. Started again on the same folder it skips the phases marked done; a phase cut
#   short left its run folder behind, which train.py refuses to overwrite: remove that folder first.
[ $# -ge 2 ] || { echo "usage: bench/h200_lora_pair.sh MODEL RESULTS_DIR [CONFIG] (see the comment at its top)"; exit 2; }
[ -e configs/ablations/lora.yaml ] || { echo "bench/h200_lora_pair.sh: run it from the repository root (no configs/ablations/lora.yaml here)"; exit 2; }
ONLY=lora TEST="recipe lora" ABL_TIME="${ABL_TIME:-450}" R1_SCRIPT_NAME=bench/h200_lora_pair.sh \
  exec bash "$(dirname "$0")/h200_ablate_set.sh" "$@"
