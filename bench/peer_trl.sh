#!/usr/bin/env bash
# The peer, end to end (issue 18), as one job on a 2-GPU machine: ours and TRL's GRPOTrainer from the same
# SFT checkpoint, at the same time, one GPU each, for the same wall time; then both evaluated by eval.py on
# the full GSM8K test set (greedy) and compared (bench/peer_trl.py report -> peer_trl_h200.json).
#
#   bench/peer_trl.sh MODEL.gguf RESULTS_DIR
#   env: PEER_SECONDS (training wall time each, default 300), SFT_STEPS (default 467 = the config's recipe),
#        CLI_TIME (seconds of RL for the command-line assistant lane, run during the SFT phase on the other
#        GPU; 0 = no cli lane; default 0), SKIP (phase names not to run), EVAL_LIMIT (default 0 = all),
#        SFT_EXTRA / OURS_EXTRA (overrides for train.py), TRL_EXTRA (flags for peer_trl.py train); the three
#        are for a small dry run on the CPU, e.g. OURS_EXTRA="rollout.prompts=2 rollout.n=2"
#
# Phases (each writes $R/<phase>.done and is skipped when that exists, so a restart continues):
#   GPU 0: sft (configs/gsm8k_tool.yaml's SFT warm-up) -> eval-sft         GPU 1: cli lane (if CLI_TIME > 0)
#   then, both GPUs at once: ours (train.py, GRPO, GPU 0) and trl (bench/peer_trl.py train, GPU 1), GPU
#   memory sampled by nvidia-smi every 0.5 s; then eval-ours and eval-trl side by side; then the report.
# Our side runs GRPO (TRL's algorithm family; no critic, no reference, as TRL's beta 0) with
# env.rewards.malformed=0 so both optimise the plain score; the rest is configs/gsm8k_tool.yaml.
set -u
M=$1; R=$2; mkdir -p "$R"
W=${PEER_SECONDS:-300}; SFT_STEPS=${SFT_STEPS:-467}; CLI_TIME=${CLI_TIME:-0}
C="--config configs/gsm8k_tool.yaml log.progress=false"

. "$(dirname "$0")/phases.sh"  # log, phase
ev() {  # gpu model name
  phase "eval-$3" env CUDA_VISIBLE_DEVICES=$1 python3 eval.py $C model.path=$2 \
    eval.out="$R/eval-$3" model.tokenizer="$R/sft/hf" eval.limit=${EVAL_LIMIT:-0}
}

lane_sft() {
  phase sft env CUDA_VISIBLE_DEVICES=0 python3 train.py $C model.path="$M" train.stage=sft train.sft_steps=0 run.dir="$R/sft" \
    train.steps=$SFT_STEPS train.lr=5e-5 train.warmup=20 train.schedule=cosine train.checkpoint_every=100000 ${SFT_EXTRA:-} \
    && ev 0 "$R/sft/hf" sft
}
lane_cli() {  # issue 16: SFT then RL on the command-line assistant, held-out success before and after RL
  local CLI_ARGS="--config configs/cli.yaml log.progress=false"  # not CC: an exported CC is the C compiler triton calls
  phase cli env CUDA_VISIBLE_DEVICES=1 python3 train.py $CLI_ARGS model.path="$M" run.dir="$R/cli" \
    train.time_limit=$CLI_TIME train.steps=1000 eval.every=0 train.checkpoint_every=100000 || return 1
  phase eval-cli-base env CUDA_VISIBLE_DEVICES=1 python3 eval.py $CLI_ARGS model.path="$M" eval.limit=0 eval.out="$R/eval-cli-base"
  phase eval-cli-sft env CUDA_VISIBLE_DEVICES=1 python3 eval.py $CLI_ARGS model.path="$R/cli/sft/hf" eval.limit=0 eval.out="$R/eval-cli-sft"
  phase eval-cli-rl env CUDA_VISIBLE_DEVICES=1 python3 eval.py $CLI_ARGS model.path="$R/cli" eval.limit=0 eval.out="$R/eval-cli-rl"
}

lane_sft & A=$!
[ "$CLI_TIME" != 0 ] && { lane_cli & }
wait $A || { log "SFT failed: no peer run"; wait; exit 1; }
wait

nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits -lms 500 > "$R/smi.csv" 2>/dev/null & S=$!
phase ours env CUDA_VISIBLE_DEVICES=0 python3 train.py $C model.path="$R/sft/hf" train.sft_steps=0 run.dir="$R/ours" \
  algo.advantage=grpo env.rewards.malformed=0 train.time_limit=$W train.steps=100000 train.checkpoint_every=100000 \
  eval.every=0 ${OURS_EXTRA:-} & P1=$!
phase trl env CUDA_VISIBLE_DEVICES=1 python3 bench/peer_trl.py train --model "$R/sft/hf" --tokenizer "$R/sft/hf" \
  --out "$R/trl" --seconds $W ${TRL_EXTRA:-} & P2=$!
wait $P1 $P2
kill $S 2>/dev/null

ev 0 "$R/ours" ours & ev 1 "$R/trl/hf" trl & wait
phase report python3 bench/peer_trl.py report --ours "$R/ours" --trl "$R/trl" --sft-eval "$R/eval-sft" \
  --ours-eval "$R/eval-ours" --trl-eval "$R/eval-trl" --smi "$R/smi.csv" --seconds $W \
  --hardware "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), one per trainer; $(python3 -c \
  'import torch, transformers, trl; print(f"torch {torch.__version__}, transformers {transformers.__version__}, trl {trl.__version__}")')" \
  --json "$R/peer_trl_h200.json"
log "all done"
touch "$R/ALL.done"
