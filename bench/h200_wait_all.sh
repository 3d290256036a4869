#!/usr/bin/env bash
# One wait-and-collect device call for several background jobs on one host of several GPUs (e.g. issue 29's
# recipe on GPU 0 beside an ablation set on GPUs 1 and 2): a device session's budget is counted by the machine's
# held time, so jobs that each fit one GPU finish together in the time of the longest. bench/h200_wait.sh on each
# folder in turn, each with what is left of LIMIT (so the call waits LIMIT seconds at most, and a job that ended
# while another was waited on costs no more), each job's archive in OUT_DIR/<the folder's name>/.
#   bench/h200_wait_all.sh OUT_DIR LIMIT RESULTS_DIR...      (from the repository root)
# Exit status: 2 while any job runs (call it again within 30 s), else the highest of the jobs' h200_wait.sh
# statuses (0 every job done and every phase passed; 1 died, 3 some phase failed, 4 no such folder).
[ $# -ge 3 ] || { echo "usage: bench/h200_wait_all.sh OUT_DIR LIMIT RESULTS_DIR... (see the comment at its top)"; exit 2; }
O=$1; LIMIT=$2; shift 2
[[ $LIMIT =~ ^[0-9]+$ ]] || { echo "bench/h200_wait_all.sh: LIMIT is seconds, got '$LIMIT' (usage: OUT_DIR LIMIT RESULTS_DIR...)"; exit 2; }
names=$(for R in "$@"; do basename "$R"; done | sort | uniq -d)
[ -z "$names" ] || { echo "bench/h200_wait_all.sh: two folders named $(echo $names): their archives would meet in $O"; exit 4; }
running=0; worst=0
for R in "$@"; do
  mkdir -p "$O/$(basename "$R")"
  left=$((LIMIT - SECONDS)); [ $left -lt 0 ] && left=0
  echo "=== $R"
  bash "$(dirname "$0")/h200_wait.sh" "$R" . "$O/$(basename "$R")" $left; rc=$?
  if [ $rc = 2 ]; then running=1; elif [ $rc -gt $worst ]; then worst=$rc; fi
done
[ $running = 1 ] && { echo "wait_all: some job still running after ${SECONDS}s"; exit 2; }
echo "wait_all: none running (status $worst: 0 all done, 1 one died, 3 phases failed, 4 no folder) after ${SECONDS}s"
exit $worst
