#!/usr/bin/env bash
# One wait-and-collect device call for a background job that sources bench/phases.sh (h200_recipe.sh,
# h200_ablate.sh, h200_iteration.sh, ...): wait until the job ends or LIMIT seconds pass, then print its
# progress, the log of a failed phase (else the newest log), and pack the results (bench/h200_collect.sh).
# The job runs while its process (RESULTS_DIR/job.pid, written by phases.sh with a "begin:" line) lives; once
# it is gone, the job is done if this run's part of progress.txt (from its last "begin:") says "all done" (any
# case), else it died. A loop that waited on "ALL DONE" alone spent 540 s of device time on a job that had died.
# A failed phase alone does not end the wait: most jobs go on to their next phase.
#   bench/h200_wait.sh RESULTS_DIR REPO_DIR OUT_DIR [LIMIT]     (LIMIT: seconds, default 540)
# Exit status: 0 done, every phase passed; 3 done, some phase failed; 1 the job died (its process is gone
# without "all done"); 2 still running, or not started (call it again within 30 s); 4 no RESULTS_DIR.
R=$1; REPO=$2; O=$3; LIMIT=${4:-540}
[ -d "$R" ] || { echo "h200_wait.sh: no folder $R (the job's RESULTS_DIR?)"; exit 4; }
P="$R/progress.txt"
. "$(dirname "$0")/this_run.sh"  # this_run FILE
state() {
  local pid; pid=$(cat "$R/job.pid" 2>/dev/null)
  [ -z "$pid" ] && { echo running; return; }  # not started yet
  kill -0 "$pid" 2>/dev/null && { echo running; return; }
  this_run "$P" | grep -qi " all done$" && { echo done; return; }
  echo died
}
while [ "$(state)" = running ] && [ $SECONDS -lt "$LIMIT" ]; do sleep 2; done
s=$(state)
cat "$P" 2>/dev/null || echo "no $P yet"
failed=$(this_run "$P" | grep -E '^[0-9:]{8} FAIL ' | awk '{ print $3 }')
for f in $failed; do echo "== $R/$f.log (failed phase, last lines)"; tail -5 "$R/$f.log" 2>/dev/null; done
last=$(ls -t "$R"/*.log 2>/dev/null | head -1)
[ -z "$failed" ] && [ -n "$last" ] && { echo "== $last (newest log, last lines)"; tail -5 "$last"; }
bash "$(dirname "$0")/h200_collect.sh" "$R" "$REPO" "$O" | grep results.tgz || echo "h200_collect.sh: no archive"
[ "$s" = done ] && [ -n "$failed" ] && s="done, with failed phases: $(echo $failed)"
echo "wait: $s after ${SECONDS}s"
case $s in done) exit 0 ;; done*) exit 3 ;; died) exit 1 ;; *) exit 2 ;; esac
