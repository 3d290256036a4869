#!/usr/bin/env bash
# One wait-and-collect device call for a background job (bench/h200_recipe.sh, h200_ablate.sh, h200_iteration.sh, ...):
# wait until the job's progress.txt says "ALL DONE" or a phase "FAIL"s, or LIMIT seconds pass, then print the
# progress, the tail of the newest log, and pack the results (bench/h200_collect.sh). A failed phase ends the
# wait at once: a loop that waited on "ALL DONE" alone spent 540 s of device time on a job that had died
# (docs/LOG.md, 2026-12-02). Exit status: 0 done, 1 a phase failed, 2 still running (call it again within 30 s).
#   bench/h200_wait.sh RESULTS_DIR REPO_DIR OUT_DIR [LIMIT]     (LIMIT: seconds, default 540)
R=$1; REPO=$2; O=$3; LIMIT=${4:-540}
P="$R/progress.txt"
state() { grep -q "FAIL" "$P" 2>/dev/null && echo fail && return; grep -q "ALL DONE" "$P" 2>/dev/null && echo done && return
  echo running; }
while [ "$(state)" = running ] && [ $SECONDS -lt "$LIMIT" ]; do sleep 2; done
s=$(state)
cat "$P" 2>/dev/null || echo "no $P yet"
last=$(ls -t "$R"/*.log 2>/dev/null | head -1)
[ -n "$last" ] && { echo "== $last (last lines)"; tail -5 "$last"; }
bash "$(dirname "$0")/h200_collect.sh" "$R" "$REPO" "$O" > /dev/null || echo "h200_collect.sh failed"
echo "wait: $s after ${SECONDS}s"
case $s in done) exit 0 ;; fail) exit 1 ;; *) exit 2 ;; esac
