#!/usr/bin/env bash
# One set of the ablation table (issue 29) in one device job: the recipe's SFT (the same settings as its warm-up,
# r1/sft.py warmup_config), then bench/h200_ablate.sh with the recipe's lane and the lanes named in ONLY, from that
# one SFT policy, alone on the GPU one after another, in the same results folder, so that one bench/h200_wait.sh
# follows the whole job. A device machine holds one session's budget and its files go with it, so the SFT cannot
# be shared across sessions: each set carries its own recipe lane, and bench/ablation_table.py compares every lane
# with the recipe lane of its own set (two SFT runs of the same settings are not bitwise equal on a GPU).
#   setsid nohup bash bench/h200_ablate_set.sh MODEL.gguf RESULTS_DIR [CONFIG] &    env: ONLY (ablation names,
#     required), ABL_TIME (RL seconds a lane, default 300), TEST (lanes read once on the test split: final recipes
#     only, default none), SFT_STEPS (default 872, the recipe's), EXTRA (overrides for every command: a CPU dry run),
#     BASE_ABL (ablation files under every lane, the recipe's included: h200_ablate.sh), GPUS (device ids on a host
#     of several GPUs, e.g. "1 2": the SFT on the first, then the lanes side by side, one GPU each, as h200_ablate.sh
#     runs them; unset, everything on the default GPU, one lane at a time). A lane with a GPU to itself is alone
#     on its GPU, so a pair at equal time stays fair and takes one lane's time; the other GPUs stay free for
#     another job (bench/h200_wait_all.sh follows several)
#   Run it from the repository root. Started again on the same folder it skips the phases marked done; a phase cut
#   short left its run folder behind, which train.py refuses to overwrite: remove that folder first.
set -u
me=${R1_SCRIPT_NAME:-bench/h200_ablate_set.sh}
[ $# -ge 2 ] || { echo "usage: $me MODEL RESULTS_DIR [CONFIG] (see the comment at its top)"; exit 2; }
[ -d configs/ablations ] || { echo "$me: run it from the repository root (no configs/ablations here)"; exit 2; }
[ -n "${ONLY:-}" ] || { echo "$me: ONLY names no lane (e.g. ONLY=\"max_steps no_clip_higher\")"; exit 2; }
for n in $ONLY; do [ -e "configs/ablations/$n.yaml" ] || { echo "$me: ONLY names $n, not in configs/ablations/"; exit 2; }; done
. "$(dirname "$0")/base_abl.sh"; base_abl "$me" ${BASE_ABL:-} || exit 2
M=$1; R=$2; CFG=${3:-configs/gsm8k_tool.yaml}; mkdir -p "$R"
. "$(dirname "$0")/phases.sh"  # log, phase
log "begin: ablation set ($ONLY), $(python3 -c 'import torch; print(torch.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu")') $CFG"
read -r -a gpus <<< "${GPUS:-}"
( [ ${#gpus[@]} -gt 0 ] && export CUDA_VISIBLE_DEVICES=${gpus[0]}  # the SFT's GPU; h200_ablate.sh pins the rest
phase sft python3 train.py --config "$CFG" model.path="$M" run.dir="$R/sft" train.stage=sft train.sft_steps=0 \
  train.steps="${SFT_STEPS:-872}" train.lr=5e-5 train.warmup=20 train.schedule=cosine train.checkpoint_every=100000 \
  log.progress=false ${EXTRA:-} ) || exit 1
ONLY="$ONLY" TEST="${TEST:-}" SOLO=0 LANES=$((${#gpus[@]} > 0 ? ${#gpus[@]} : 1)) ABL_TIME="${ABL_TIME:-300}" bash "$(dirname "$0")/h200_ablate.sh" \
  "$R/sft/hf" "$R" "$CFG"
