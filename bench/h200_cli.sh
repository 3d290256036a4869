#!/usr/bin/env bash
# The command-line task at level 3 (issue 29, item 4): what RL adds to SFT. Two lanes side by side on ONE GPU
# (run.memory_fraction=0.45 each): `sft2` is configs/cli.yaml as it stands (SFT on level-2 expert chats, RL on
# level 3); `sft3` SFTs on level 3 itself (data.sft_level=0), to show whether SFT alone saturates level 3 as it
# did level 2. Each lane: SFT + PPO for CLI_TIME seconds in one command, then the held-out level-3 split
# (256 requests, greedy) on the SFT policy and the final one, compared pair by pair (python -m r1.compare).
#   bench/h200_cli.sh MODEL.gguf RESULTS_DIR       env: CLI_TIME (RL seconds, default 300), EXTRA / EVAL_EXTRA
#     (overrides appended to every train.py / eval.py command, for a CPU dry run)
set -u
M=$1; R=$2; T=${CLI_TIME:-300}; mkdir -p "$R"
. "$(dirname "$0")/phases.sh"  # log, phase
lane() {  # name, overrides...
  local n=$1; shift
  phase "train-$n" python3 train.py --config configs/cli.yaml model.path="$M" run.dir="$R/$n" "$@" \
    train.steps=100000 train.time_limit=$T run.memory_fraction=0.45 log.progress=false ${EXTRA:-} || return 1
  for m in sft final; do
    local p="$R/$n/hf"; [ $m = sft ] && p="$R/$n/sft/hf"
    phase "test-$n-$m" python3 eval.py --config configs/cli.yaml "$@" model.path="$p" eval.limit=0 \
      run.memory_fraction=0.45 eval.out="$R/test-$n-$m" ${EVAL_EXTRA:-} && tail -1 "$R/test-$n-$m.log" > "$R/test-$n-$m.json"
  done
  python3 -m r1.compare "$R/test-$n-sft" "$R/test-$n-final" > "$R/compare-$n.txt" 2>&1
}
log "begin: $(python3 -c 'import torch; print(torch.__version__)') CLI_TIME=$T"
lane sft2 &
lane sft3 data.sft_level=0 &
wait
cat "$R"/compare-*.txt | tee -a "$R/progress.txt"
finish; exit $?
