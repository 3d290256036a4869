# Sourced by bench/phases.sh and bench/h200_wait.sh: `this_run FILE` prints this run's part of a progress.txt,
# from its last "begin:" line (a job started again in the same folder begins a new part), so that a phase that
# failed in an earlier run, or an earlier run's ALL DONE, is not taken for this one's.
this_run() { [ -e "$1" ] && awk '/ begin:/ { n = NR } { line[NR] = $0 } END { for (i = (n ? n : 1); i <= NR; i++) print line[i] }' "$1"; }
