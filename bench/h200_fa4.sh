#!/usr/bin/env bash
# Issue 34 on one H200: FlashAttention-4 (`fa4`) against today's path (R1_FA4=0: torch's varlen_attn with K/V
# repeated, Triton cache kernels), every pair in the same run on the same machine. After bench/stage_fa4.sh
# (calls 1 and 2) has installed the wheels in /tmp/fa4:
#   setsid nohup bash bench/h200_fa4.sh RESULTS_DIR [TOKENIZER_DIR] > /dev/null 2>&1 &
# then calls that wait on RESULTS_DIR/ALL.done (docs/GPU.md), each ending with
#   python3 bench/attention.py --collect RESULTS_DIR --out RESULTS_DIR/attention_h200.json; bash bench/h200_collect.sh RESULTS_DIR . $OUT
# Phases (resumable, bench/phases.sh; each under `timeout`), most wanted first, ~21 min if all run to their
# typical times (the limits add to more; SKIP="name ..." leaves phases out):
#   check         flash_attn.cute imports, kernels.attention picks fa4 on this GPU (stops the job if not)
#   kernels       bench/attention.py: attention alone, fwd and fwd+bwd, 3 head shapes; decode fa4 vs Triton
#   tests-fa4     pytest -m gpu tests/test_attention.py: fa4 against float64, every shape family, the cache path
#   train-*       bench/train_step.py --no-peer at the 3B shape: R1_FA4=0 vs R1_ATTN=fa4
#   agent-*       bench/agent_rollout.py --model 3b --gap (single-turn engine, agent loop, the loop's logprob
#                 gap): R1_FA4=0 vs the default (fa4 picked) vs R1_FA4_CACHE=1 (fa4 reads the cache too)
#   gap-*         bench/logprob_gap.py --model 3b: R1_FA4=0 vs the default
#   tests-gpu     the rest of pytest -m gpu (fa4 installed: the generator's first prompts go through it);
#                 tests/test_overlap.py's CUDA case gets the SmolLM2 tokenizer from TOKENIZER_DIR (R1_TEST_TOKENIZER)
#   collect       RESULTS_DIR/attention_h200.json from all of the above (copied to bench/results/ on a GPU)
# CPU dry run (ran): SKIP="check tests-fa4 tests-gpu train-base train-fa4 gap-base gap-fa4 agent-fa4cache"
#   bash bench/h200_fa4.sh /tmp/fa4dry .stage/fa4/c2/tok   (kernels: "no CUDA"; agent-*: the CPU's tiny model)
set -u
R=$1; TOK=${2:-/root/stage/fa4/tok}; mkdir -p "$R"
. "$(dirname "$0")/phases.sh"  # log, phase
log "begin: $(python3 -c 'import torch; print(torch.__version__, torch.cuda.get_device_name())' 2>&1 | tail -1)"
phase check timeout 300 python3 -c "
import torch; from kernels import attention as A
q = torch.empty(1, 16, 128, device='cuda', dtype=torch.bfloat16)
print(A.fa4_version(), A.pick_backend(q)); assert A.pick_backend(q) == 'fa4', A.fa4_refusal(q)" || exit 1
phase kernels timeout 420 python3 bench/attention.py --out "$R/kernels.json"
phase tests-fa4 timeout 540 python3 -m pytest -q -m gpu tests/test_attention.py
phase train-base env R1_FA4=0 timeout 300 python3 bench/train_step.py --no-peer
phase train-fa4 env R1_ATTN=fa4 timeout 300 python3 bench/train_step.py --no-peer
phase agent-base env R1_FA4=0 timeout 360 python3 bench/agent_rollout.py --model 3b --gap --tokenizer "$TOK"
phase agent-fa4 timeout 360 python3 bench/agent_rollout.py --model 3b --gap --tokenizer "$TOK"
phase gap-base env R1_FA4=0 timeout 240 python3 bench/logprob_gap.py --model 3b
phase gap-fa4 timeout 240 python3 bench/logprob_gap.py --model 3b
phase agent-fa4cache env R1_FA4_CACHE=1 timeout 360 python3 bench/agent_rollout.py --model 3b --gap --tokenizer "$TOK"
# tests/test_weights.py imports gguf (requirements.txt), which the H200 lacks unless its wheel is carried: without
# it that module is left out (its tests are CPU tests; -m gpu would deselect them anyway), not a collection error
NOGGUF=$(python3 -c 'import gguf' 2>/dev/null || echo --ignore=tests/test_weights.py)
phase tests-gpu env R1_TEST_TOKENIZER="$TOK" timeout 480 python3 -m pytest -q -m gpu tests --ignore=tests/test_attention.py $NOGGUF
phase collect python3 bench/attention.py --collect "$R" --out "$R/attention_h200.json"
# into the repo's bench/results only from a GPU run (a CPU dry run of this script must not leave numbers there)
python3 -c 'import torch, sys; sys.exit(not torch.cuda.is_available())' && cp "$R/attention_h200.json" bench/results/
finish; exit $?
touch "$R/ALL.done"
