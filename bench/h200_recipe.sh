#!/usr/bin/env bash
# The 30-minute recipe (issue 29) on one H200, alone on the GPU, as the README gives it: one train.py command
# (SFT, then PPO until train.time_limit), its wall time measured around the command, then the test split read
# once: the SFT policy and the final policy, greedy, all 1,319 problems; then bench/results/learning_h200.json.
#   setsid nohup bash bench/h200_recipe.sh MODEL.gguf RESULTS_DIR [CONFIG] &    (EXTRA / EVAL_EXTRA: overrides
#   appended to the train.py / eval.py commands, for a CPU dry run only, with SAVE='': the result is printed, and
#   bench/results/learning_h200.json, where it is saved by default, stays as it is)    (over 10 minutes: follow it with
#   calls of `bench/h200_wait.sh RESULTS_DIR . $OUT`, which end when the job ends, and pack the results)
#   BASE_ABL: ablation files layered on CONFIG in every command (e.g. "score_sampler critic_half_share": a candidate
#   recipe made of measured lanes, run as the recipe is before it becomes one). The test reads and the result come
#   first; the final policy's read on the whole validation split (val-final) comes last: it picks nothing (the rule,
#   bench/recipe_rule.py, reads the in-run validation reads), so a run cut short by its device time loses only it.
set -u
[ $# -ge 2 ] || { echo "usage: bench/h200_recipe.sh MODEL RESULTS_DIR [CONFIG] (see the comment at its top)"; exit 2; }
[ -d configs/ablations ] || { echo "bench/h200_recipe.sh: run it from the repository root (no configs/ablations here)"; exit 2; }
. "$(dirname "$0")/base_abl.sh"; base_abl bench/h200_recipe.sh ${BASE_ABL:-} || exit 2  # the array `base`
M=$1; R=$2; CFG=${3:-configs/gsm8k_tool.yaml}; mkdir -p "$R"
. "$(dirname "$0")/phases.sh"  # log, phase
TV=$(python3 -c 'import torch; print(torch.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu")')
DEV=${TV#* }  # the GPU's name (it has spaces), for bench/learning_result.py; one torch import for both
log "begin: $TV $CFG${BASE_ABL:+ with $BASE_ABL}"
t0=$(date +%s.%N)
phase recipe python3 train.py --config "$CFG" "${base[@]}" model.path="$M" run.dir="$R/recipe" log.progress=false ${EXTRA:-} || exit 1
[ -e "$R/wall_s" ] || python3 -c "print(round($(date +%s.%N) - $t0, 1))" > "$R/wall_s"
for m in sft final; do
  p="$R/recipe/hf"; [ $m = sft ] && p="$R/recipe/sft/hf"
  phase "test-$m" python3 eval.py --config "$CFG" "${base[@]}" model.path="$p" eval.split=test eval.limit=0 eval.out="$R/test-$m" ${EVAL_EXTRA:-} \
    && tail -1 "$R/test-$m.log" > "$R/test-$m.json"
done
SAVE=${SAVE-bench/results/learning_h200.json}  # '' = print only (a CPU dry run must not overwrite the result)
label=$CFG; for n in ${BASE_ABL:-}; do label="$label + configs/ablations/$n.yaml"; done
phase result python3 bench/learning_result.py --run "$R/recipe" --sft-eval "$R/test-sft.json" \
  --test-eval "$R/test-final.json" --wall "$(cat "$R/wall_s")" --config "$label" --device "$DEV" ${SAVE:+--save "$SAVE"}
[ -n "$SAVE" ] && cp "$SAVE" "$R/" 2>/dev/null
phase val-final python3 eval.py --config "$CFG" "${base[@]}" model.path="$R/recipe/hf" eval.split=val eval.limit=0 \
  eval.out="$R/val-final" ${EVAL_EXTRA:-} && tail -1 "$R/val-final.log" > "$R/val-final.json"
finish; exit $?
