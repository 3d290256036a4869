#!/usr/bin/env bash
# The rollout engine's GPU paths in one device call (issue 3): check them, then time each on the same shape.
#
#   bash bench/h200_rollout_paths.sh OUT_DIR        (from the repo root, one H200; ~4 minutes)
#
# 1. the GPU tests of the generator, the model and the Triton kernels (a failure is reported, the timing goes on)
# 2. bench/rollout.py, Qwen2.5-3B shape, batch 256, 256 + 256 tokens, once per path:
#    default (Triton decode + sampling), R1_FUSE=1, R1_COMPILE=1, both; the peer (HF generate) once, in the
#    first run, so every ratio in the log divides by the same-session peer number
# 3. the decode profile of the fastest combination (R1_FUSE=1 R1_COMPILE=1), kernel time by kind
# Each step's JSON goes to OUT_DIR (rollout-<path>.json, profile.json) and one line per step to OUT_DIR/progress.txt.
set -u
O=${1:?usage: bench/h200_rollout_paths.sh OUT_DIR}; mkdir -p "$O"
log() { echo "$(date +%H:%M:%S) $*" | tee -a "$O/progress.txt"; }
log "begin: $(python3 -c 'import torch; print(torch.__version__, torch.cuda.get_device_name())')"
if [ -z "${SKIP_TESTS:-}" ]; then  # SKIP_TESTS=1 where the caller has run the GPU tests (bench/h200_learn.sh)
  python3 -m pytest -q -m gpu tests/test_generate.py tests/test_model.py tests/test_decode_kernel.py \
    tests/test_sample_kernel.py -p no:cacheprovider > "$O/gpu-tests.log" 2>&1
  log "gpu tests rc=$?: $(tail -1 "$O/gpu-tests.log")"
fi
run() {  # name peer|no-peer env... : one rollout benchmark
  local name=$1 peer=$2; shift 2
  local flag=--no-peer; [ "$peer" = peer ] && flag=
  env "$@" python3 bench/rollout.py --models 3b --batches 256 --save "$O/rollout-$name.json" $flag \
    > "$O/rollout-$name.log" 2>&1
  log "rollout $name rc=$?: $(grep '"name": "rollout"' "$O/rollout-$name.log" | cut -c1-260)"
}
run default peer R1_FUSE=0
run fuse no-peer R1_FUSE=1
run compile no-peer R1_COMPILE=1
run fuse-compile no-peer R1_FUSE=1 R1_COMPILE=1
R1_FUSE=1 R1_COMPILE=1 python3 bench/profile_decode.py > "$O/profile.log" 2>&1
grep '^{' "$O/profile.log" > "$O/profile.json"
log "profile rc=$?: $(cut -c1-400 "$O/profile.json")"
finish; exit $?
