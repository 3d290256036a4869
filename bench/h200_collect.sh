#!/usr/bin/env bash
# Pack what a device job (bench/h200_learn.sh, h200_ablate.sh, h200_recipe.sh) has written so far into one small
# archive: logs, metrics, eval results, tensorboard events, bench results. Weights and checkpoints stay behind
# (checkpoints/, hf/, adapter/, trajectories/, and any file of 4 MiB or more, counted in bytes: an export still being written
# sits in a temporary folder those names miss, and 15 ablation lanes' exports once made the archive too big
# for the device's return limit, 16 MiB a file).
#   bench/h200_collect.sh RESULTS_DIR REPO_DIR OUT_DIR
R=$(cd "$1" && pwd) || exit 1; REPO=$(cd "$2" && pwd) || exit 1; O=$3  # absolute: tar's -C is relative to the last
list=$(mktemp)
( cd "$(dirname "$R")" && find "$(basename "$R")" -type f -size -4194304c -not -path '*/checkpoints/*' -not -path '*/hf/*' \
    -not -path '*/adapter/*' -not -path '*/trajectories/*' ) > "$list"
tar czf "$O/results.tgz" -C "$REPO" bench/results -C "$(dirname "$R")" -T "$list" 2>/dev/null
rm -f "$list"
cp "$R/progress.txt" "$O/" 2>/dev/null
ls -la "$O"
