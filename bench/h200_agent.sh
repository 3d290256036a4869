#!/usr/bin/env bash
# Issue 21 on a 2-GPU machine, the part that needs no model file: the GPU tests then the agent-loop benchmark
# of the Qwen2.5-3B shape on GPU 0 and, at the same time, the agent-loop benchmark of the SmolLM2-135M shape
# on GPU 1, on these paths of the same code:
#   default   compiled ops, fused projections, prefill chunks in CUDA graphs (the defaults on CUDA)
#   nochunk   the same without chunk graphs (--no-chunk-graphs): what the graphs alone bring (135M only)
#   eager     --eager-paths (kernels.compile=false, fuse=false, chunk_graphs=false): the defaults before this change
# Each benchmark prints one JSON line (bench/agent_rollout.py), with the sampler-trainer gap (--gap).
#   bench/h200_agent.sh RESULTS_DIR [TOKENIZER]   (TOKENIZER: an HF tokenizer folder where the GGUF package is absent)
set -u
R=$1; mkdir -p "$R"
TOKARG=${2:+--tokenizer $2}
. "$(dirname "$0")/phases.sh"  # log, phase
agent() {  # gpu model name flags...
  local g=$1 m=$2 n=$3; shift 3
  phase "agent-$m-$n" env CUDA_VISIBLE_DEVICES=$g python3 bench/agent_rollout.py --model $m --gap $TOKARG "$@"
}
EAGER="--eager-paths"
{ phase gpu-tests env CUDA_VISIBLE_DEVICES=0 python3 -m pytest -q -m gpu tests
  agent 0 3b default; agent 0 3b eager $EAGER; } &
{ agent 1 135m default; agent 1 135m nochunk --no-chunk-graphs; agent 1 135m eager $EAGER; } &
wait
log "all done"
touch "$R/ALL.done"
