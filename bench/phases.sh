# Resumable phases for the device jobs (bench/h200_learn.sh, bench/peer_trl.sh), sourced after $R is set:
# a device machine can go away between calls, so each phase marks $R/<name>.done and a restart skips it.
. "$(dirname "${BASH_SOURCE[0]}")/this_run.sh"  # this_run FILE
log() { echo "$(date +%H:%M:%S) $*" | tee -a "$R/progress.txt"; }
# bench/h200_wait.sh: the job's pid, and a "begin:" line that starts this run's part of progress.txt (a job whose
# process is gone without "ALL DONE" after it has died)
echo $$ > "$R/job.pid"; log "begin: job pid $$"
phase() {  # name command...: run once, mark done on success
  local name=$1; shift
  [ -e "$R/$name.done" ] && { log "skip $name (done)"; return 0; }
  case " ${SKIP:-} " in *" $name "*) log "skip $name (SKIP)"; return 0 ;; esac
  log "start $name"
  local t0=$SECONDS
  if "$@" > "$R/$name.log" 2>&1; then touch "$R/$name.done"; log "done $name $((SECONDS - t0))s"
  else log "FAIL $name rc=$? $((SECONDS - t0))s: $(tail -2 "$R/$name.log" | tr '\n' ' ' | cut -c1-300)"; return 1; fi
}
finish() {  # the job's last line: the phases of this run that failed, if any, then ALL DONE (what
  # h200_wait.sh looks for); returns 1 when some phase failed, so that `finish; exit $?` tells a shell or a user
  # that the job did not all go through (it said ALL DONE with rc 0 when every lane had failed)
  local failed
  failed=$(this_run "$R/progress.txt" | awk '$2 == "FAIL" { print $3 }' | sort -u | tr '\n' ' ')
  [ -n "$failed" ] && log "failed phases: ${failed% }"
  log "ALL DONE"
  [ -z "$failed" ]
}
