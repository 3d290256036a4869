#!/usr/bin/env bash
# Pack what a device job (bench/h200_learn.sh, h200_ablate.sh, h200_recipe.sh) has written so far into one small
# archive: logs, metrics, eval results, tensorboard events, bench results. Weights and checkpoints stay behind
# (checkpoints/, hf/, adapter/, trajectories/, and any file of 4 MiB or more: an export still being written
# sits in a temporary folder those names miss, and 15 ablation lanes' exports once made the archive too big
# for the device's return limit, 16 MiB a file).
#   bench/h200_collect.sh RESULTS_DIR REPO_DIR OUT_DIR
R=$1; REPO=$2; O=$3
list=$(mktemp)
( cd "$(dirname "$R")" && find "$(basename "$R")" -type f -size -4M -not -path '*/checkpoints/*' -not -path '*/hf/*' \
    -not -path '*/adapter/*' -not -path '*/trajectories/*' ) > "$list"
tar czf "$O/results.tgz" -C "$REPO" bench/results -C "$(dirname "$R")" -T "$list" 2>/dev/null
rm -f "$list"
cp "$R/progress.txt" "$O/" 2>/dev/null
ls -la "$O"
