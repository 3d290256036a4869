#!/usr/bin/env bash
# Weak scaling of one RL iteration under FSDP2 on one host: the same work per GPU on 1, 2, ... N GPUs.
#
#   bench/scale.sh "1 2 8" [key=value ...]     # GPU counts, then extra train.py overrides
#
# Model: Qwen2.5-3B shape, random weights, SmolLM2's vocabulary (bench/random_model.py), with critic
# (step-level GAE) and reference (KL); the synthetic task; PER_GPU prompts x 4 samples per GPU per
# iteration; everything else is configs/smoke.yaml and the defaults (memory plan included). Prints one
# JSON line per GPU count (bench/scale_report.py) and writes them to $OUT_JSON. Needs a SmolLM2
# tokenizer folder in $TOK (python -c "from r1.tokenizer import load_tokenizer;
# load_tokenizer('smollm2-135m-instruct').hf.save_pretrained('.stage/smol_tok')").
set -euo pipefail
cd "$(dirname "$0")/.."
NS=${1:-"1 2 8"}; shift || true
TOK=${TOK:-.stage/smol_tok}
PER_GPU=${PER_GPU:-16}
STEPS=${STEPS:-4}
MODEL=${MODEL:-/tmp/r1-3b}
OUT_JSON=${OUT_JSON:-bench/results/scale.json}
RUNS=${RUNS:-/tmp/r1-scale}
[ -f "$MODEL/config.json" ] || python bench/random_model.py --shape 3b --tokenizer "$TOK" --out "$MODEL"
mkdir -p "$RUNS"
for N in $NS; do
  rm -rf "$RUNS/n$N"
  torchrun --standalone --nproc_per_node="$N" train.py --config configs/smoke.yaml \
    model.path="$MODEL" model.tokenizer="$TOK" rollout.prompts=$((PER_GPU * N)) rollout.n=4 \
    train.steps="$STEPS" train.lr=1e-6 train.critic_lr=1e-6 log.progress=false log.trajectories=false \
    train.checkpoint_every=1000 run.dir="$RUNS/n$N" "$@" > "$RUNS/n$N.log" 2>&1 \
    || { echo "{\"gpus\": $N, \"error\": \"exit $?, see $RUNS/n$N.log\"}"; tail -20 "$RUNS/n$N.log"; continue; }
done
python bench/scale_report.py "$RUNS" $NS | tee "$OUT_JSON"
