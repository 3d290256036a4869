#!/usr/bin/env bash
# Issue 30, "does it learn?": LoRA against full fine-tuning on GSM8K-tool, from ONE SFT checkpoint, for the same
# RL seconds each, alone on the GPU one after the other, then each read once on the whole test split and paired
# (python -m r1.compare: gained / lost / McNemar p). One script because a device machine holds one session's
# budget: the recipe's SFT (the same settings as its warm-up, r1/sft.py warmup_config), then bench/h200_ablate.sh
# with the recipe's lane and configs/ablations/lora.yaml, in the same results folder so that one
# bench/h200_wait.sh follows the whole job. Nothing here chooses a setting: the rank, alpha and learning rate
# are the ablation file's, chosen before the run (its comment says why).
#   setsid nohup bash bench/h200_lora_pair.sh MODEL.gguf RESULTS_DIR [CONFIG] &     env: ABL_TIME (RL seconds a
#     lane, default 450), SFT_STEPS (default 872, the recipe's), EXTRA (overrides for every command: a CPU dry run)
#   Run it from the repository root. Started again on the same folder it skips the phases marked done; a phase cut
#   short left its run folder behind, which train.py refuses to overwrite: remove that folder first.
set -u
[ $# -ge 2 ] || { echo "usage: bench/h200_lora_pair.sh MODEL RESULTS_DIR [CONFIG] (see the comment at its top)"; exit 2; }
[ -e configs/ablations/lora.yaml ] || { echo "bench/h200_lora_pair.sh: run it from the repository root (no configs/ablations/lora.yaml here)"; exit 2; }
M=$1; R=$2; CFG=${3:-configs/gsm8k_tool_30min.yaml}; mkdir -p "$R"
. "$(dirname "$0")/phases.sh"  # log, phase
log "begin: lora pair, $(python3 -c 'import torch; print(torch.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu")') $CFG"
phase sft python3 train.py --config "$CFG" model.path="$M" run.dir="$R/sft" train.stage=sft train.sft_steps=0 \
  train.steps="${SFT_STEPS:-872}" train.lr=5e-5 train.warmup=20 train.schedule=cosine train.checkpoint_every=100000 \
  log.progress=false ${EXTRA:-} || exit 1
ONLY=lora TEST="recipe lora" SOLO=0 LANES=1 ABL_TIME="${ABL_TIME:-450}" bash "$(dirname "$0")/h200_ablate.sh" \
  "$R/sft/hf" "$R" "$CFG"
