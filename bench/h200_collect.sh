#!/usr/bin/env bash
# Pack what the learning job (bench/h200_learn.sh) has written so far into one small archive:
# logs, metrics, eval results and eval trajectories, tensorboard events, bench results; no
# checkpoints, no hf/ weights, no per-iteration RL trajectories.
#   bench/h200_collect.sh RESULTS_DIR REPO_DIR OUT_DIR
R=$1; REPO=$2; O=$3
tar czf "$O/results.tgz" --exclude='*/checkpoints' --exclude='*/hf' --exclude='*/trajectories' \
  -C "$(dirname "$R")" "$(basename "$R")" -C "$REPO" bench/results 2>/dev/null
cp "$R/progress.txt" "$O/" 2>/dev/null
ls -la "$O"
