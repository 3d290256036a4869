#!/usr/bin/env bash
# The ablation table (issue 29): the recipe and every file in configs/ablations/ layered on it, RL from the
# same SFT policy and seed, the same GPU time each, one lane at a time by default (LANES=1). Lanes side by side
# on one GPU (LANES=N, each with its own memory plan, run.memory_fraction=0.88/N, micro-batches on auto: forcing
# them small slowed PPO's update eight-fold, docs/decisions.md "Micro-batch size") buy nothing for this recipe: measured
# 2026-12-02 on one H200, five RL lanes in a wave ran at 0.18 of their speed alone each (33.5 s an iteration
# against 5.97 s for the recipe's own run, which also had the whole GPU's memory plan), 0.89 of one run's
# throughput all together, and a lane's share then depends on what its wave-mates run (the critic-free lanes
# got more iterations): not the same GPU time. One at a time, all the lanes (17) do not fit one device session:
# run them in sets (ONLY="..."), the recipe's lane in every set, and compare within a set. Every run
# is then evaluated on the whole validation split (data.val_size problems carved from train, never trained on:
# 500 in the recipe) and compared pair by pair with the recipe's lane (python -m r1.compare: gained / lost /
# McNemar p). Not on the test split: this table is what the next recipe is chosen from, and the test split is
# read once per final recipe, never to pick one (issue 29 asked for test here; its own rule 2 and the brief
# say otherwise).
#   bench/h200_ablate.sh SFT_HF RESULTS_DIR [RECIPE]      env: ABL_TIME (RL seconds a lane, default 300), LANES,
#     ONLY (names of ablations to run, default all), EXTRA (overrides for every run, e.g. for a CPU dry run),
#     GPUS (device ids on a host of several GPUs, e.g. "0 1 2 3": LANES defaults to their count, and lane k of a
#     wave runs on GPU k mod their count, so each lane has a GPU to itself: the way to make the table fast),
#     SOLO (when lanes share a GPU, default 1: after the waves, the recipe's lane once more ALONE on the GPU, same
#     time and memory fraction: what sharing the GPU costs a lane; ablation_table.py reports it; 0 = skip)
#     TEST (lanes that are final recipes, e.g. "recipe lora" for issue 30's LoRA against full fine-tuning at equal
#     time: each read ONCE on the whole test split after everything else, the first named the pair's baseline;
#     never used to choose, which the validation table does)
#     BASE_ABL (ablation files layered under every lane, the recipe's included, e.g. "grpo": issue 31's GRPO pair
#     as the recipe's lane against overlap_process, two lanes rather than three), SKIP (phases not to run, e.g.
#     "val-recipe val-overlap_process": a pair read on the test split alone, when a session's device time is short;
#     bench/phases.sh)
#   python bench/ablation_table.py RESULTS_DIR            # the README table and the PNG curves, afterwards
set -u
[ $# -ge 2 ] || { echo "usage: bench/h200_ablate.sh SFT_HF RESULTS_DIR [RECIPE] (see the comment at its top)"; exit 2; }
[ -d configs/ablations ] || { echo "bench/h200_ablate.sh: run it from the repository root (no configs/ablations here)"; exit 2; }
for n in ${ONLY:-}; do [ -e "configs/ablations/$n.yaml" ] || { echo "bench/h200_ablate.sh: ONLY names $n, not in configs/ablations/"; exit 2; }; done
. "$(dirname "$0")/base_abl.sh"; base_abl bench/h200_ablate.sh ${BASE_ABL:-} || exit 2  # the array `base`
S=$1; R=$2; REC=${3:-configs/gsm8k_tool.yaml}; mkdir -p "$R"
T=${ABL_TIME:-300}; X=${EXTRA:-}
read -r -a gpus <<< "${GPUS:-}"; G=${#gpus[@]}  # GPUS="0 1": lane k of a wave on GPU gpus[k % G]
L=${LANES:-$((G > 0 ? G : 1))}; F=$(python3 -c "import math; print(round(0.88 / math.ceil($L / max($G, 1)), 3))")
. "$(dirname "$0")/phases.sh"  # log, phase
names=(recipe); for f in configs/ablations/*.yaml; do n=$(basename "$f" .yaml)
  case " ${ONLY:-$n} " in *" $n "*) names+=("$n") ;; esac; done
lane() {  # name [gpu]: RL from the SFT policy for T seconds, in-run curve on 200 validation problems, then all
  local n=$1 more=(); [ "$n" != recipe ] && more=(--config "configs/ablations/$n.yaml")
  [ -n "${2:-}" ] && export CUDA_VISIBLE_DEVICES=$2  # in the lane's own subshell (it runs with &)
  phase "rl-$n" python3 train.py --config "$REC" "${base[@]}" "${more[@]}" model.path="$S" run.dir="$R/$n" train.sft_steps=0 \
    train.time_limit=$T eval.every=10 eval.limit=200 run.memory_fraction=$F log.progress=false $X &&
  phase "val-$n" python3 eval.py --config "$REC" "${base[@]}" "${more[@]}" model.path="$R/$n" eval.split=val eval.limit=0 \
    run.memory_fraction=$F eval.out="$R/val-$n" $X && { [ ! -e "$R/val-$n.log" ] || tail -1 "$R/val-$n.log" > "$R/val-$n.json"; }
}
log "begin: ${names[*]} (ABL_TIME=$T, $L lanes a wave, memory_fraction $F${GPUS:+, GPUs $GPUS}${BASE_ABL:+, every lane on $BASE_ABL})"
for ((i = 0; i < ${#names[@]}; i += L)); do
  k=0; for n in "${names[@]:i:L}"; do lane "$n" "${gpus[$((k % (G > 0 ? G : 1)))]:-}" & k=$((k + 1)); done
  wait
done
[ "$G" -gt 0 ] && export CUDA_VISIBLE_DEVICES=${gpus[0]}  # what follows runs on the first GPU named, not on one
# GPUS left out (another job's, on a host the jobs share: bench/h200_wait_all.sh)
# what a lane pays for sharing: the recipe's lane alone, same seconds, same memory fraction, no evaluation after
[ "$L" -gt "$((G > 0 ? G : 1))" ] && [ "${SOLO:-1}" = 1 ] && phase "rl-solo" python3 train.py --config "$REC" "${base[@]}" model.path="$S" run.dir="$R/solo/recipe" \
  train.sft_steps=0 train.time_limit=$T eval.every=10 eval.limit=200 run.memory_fraction=$F log.progress=false $X
# a lane whose file changes the environment (env.max_steps, the context policy) is read under it, so the recipe's
# lane is read under it too: the lane against that read is what its training changed, apart from the budget
for n in "${names[@]:1}"; do
  grep -q '^env:' "configs/ablations/$n.yaml" || continue
  phase "val-recipe-as-$n" python3 eval.py --config "$REC" "${base[@]}" --config "configs/ablations/$n.yaml" model.path="$R/recipe" \
    eval.split=val eval.limit=0 run.memory_fraction=$F eval.out="$R/val-recipe-as-$n" $X \
    && tail -1 "$R/val-recipe-as-$n.log" > "$R/val-recipe-as-$n.json"
done
for n in "${names[@]:1}"; do
  [ -e "$R/val-$n.json" ] && python3 -m r1.compare "$R/val-recipe" "$R/val-$n" 2>/dev/null | tail -1 \
    | sed "s/^/{\"ablation\": \"$n\", \"vs_recipe\": /; s/\$/}/"
  [ -e "$R/val-$n.json" ] && [ -e "$R/val-recipe-as-$n.json" ] && python3 -m r1.compare "$R/val-recipe-as-$n" \
    "$R/val-$n" 2>/dev/null | tail -1 | sed "s/^/{\"ablation\": \"$n\", \"vs_recipe_same_env\": /; s/\$/}/"
done > "$R/compare.jsonl"
first=""; : > "$R/test-compare.jsonl"
for n in ${TEST:-}; do
  more=(); [ "$n" != recipe ] && more=(--config "configs/ablations/$n.yaml")
  phase "test-$n" python3 eval.py --config "$REC" "${base[@]}" "${more[@]}" model.path="$R/$n" eval.split=test eval.limit=0 \
    eval.out="$R/test-$n" $X && tail -1 "$R/test-$n.log" > "$R/test-$n.json"
  if [ -z "$first" ]; then first=$n
  elif [ -e "$R/test-$n.json" ] && [ -e "$R/test-$first.json" ]; then
    python3 -m r1.compare "$R/test-$first" "$R/test-$n" 2>/dev/null | tail -1 \
      | sed "s/^/{\"test\": \"$n\", \"baseline\": \"$first\", \"result\": /; s/\$/}/" >> "$R/test-compare.jsonl"
  fi
done
finish; exit $?
