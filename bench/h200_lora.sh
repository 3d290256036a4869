#!/usr/bin/env bash
# LoRA (issue 30) on one H200 host: peak memory and iteration time of PPO with critic and reference at
# configs/gsm8k_tool.yaml's batch, full fine-tuning (rank 0, the peer) against rank-16 adapters over one
# frozen base, on random weights of Qwen2.5 shapes (bench/lora.py says what each run is).
#
#   bench/h200_lora.sh                       # 3B: rank 0 and 16; 7B: rank 0 (expected: refused by the
#                                            # memory plan, recorded as completed false) and 16; 14B: rank 16
#   env: GPUS (default 1; 2 runs the same under torchrun), STEPS (default 3),
#        SHAPES_RANKS (shape:ranks[:generators[:steps]] items; generators and steps default to GENERATORS, STEPS),
#        TOK (a SmolLM2 tokenizer folder: python -c "from r1.tokenizer import load_tokenizer;
#        load_tokenizer('smollm2-135m-instruct').hf.save_pretrained('.stage/smol_tok')"),
#        OUT (default bench/results/lora_h200.json; one JSON line per run is appended),
#        GENERATORS (default adapters,merged: model.lora_generator values for each rank > 0),
#        TIMEOUT (seconds a run may take, default 3600), TESTS (default 1; 0 skips the CPU proofs)
set -euo pipefail
cd "$(dirname "$0")/.."
GPUS=${GPUS:-1}; STEPS=${STEPS:-3}; TOK=${TOK:-.stage/smol_tok}
OUT=${OUT:-bench/results/lora_h200.json}
SHAPES_RANKS=${SHAPES_RANKS:-"3b:0,16 7b:0,16 14b:16"}; GENERATORS=${GENERATORS:-adapters,merged}
[ -d "$TOK" ] || python3 -c "from r1.tokenizer import load_tokenizer; load_tokenizer('smollm2-135m-instruct').hf.save_pretrained('$TOK')"
[ "${TESTS:-1}" = 0 ] || python3 -m pytest -q tests/test_lora.py  # the CPU proofs first, on this machine's torch
for item in $SHAPES_RANKS; do
  IFS=: read -r shape ranks gens steps <<< "$item"
  python3 bench/lora.py --shapes "$shape" --ranks "$ranks" --gpus "$GPUS" --steps "${steps:-$STEPS}" \
    --generators "${gens:-$GENERATORS}" --tokenizer "$TOK" --out "$OUT" --timeout "${TIMEOUT:-3600}"
done
echo "LORA ALL DONE"
