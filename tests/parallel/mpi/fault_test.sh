#!/bin/bash
# A dead or stalled rank must end the job promptly with a message naming a rank, not hang.
#   fault_test.sh kill|stall MPIEXEC PROBE
# kill:  rank 1 of 3 dies by SIGKILL; Open MPI must end the job naming "rank 1" within 30 s.
# stall: rank 1 of 3 sleeps; the watchdog of rank 0 must report
#        "rank 0 waits in op 21 of group world" (its 21st all-reduce) and the job end within 30 s.
set -u
mode=$1 mpiexec=$2 probe=$3
log=$(mktemp)
start=$(date +%s%N)
timeout -s KILL 90 "$mpiexec" --allow-run-as-root --oversubscribe -np 3 "$probe" "$mode" 1 >"$log" 2>&1
rc=$?
elapsed_ms=$(( ($(date +%s%N) - start) / 1000000 ))
cat "$log"
echo "fault_test: mode=$mode exit=$rc elapsed=${elapsed_ms} ms"
fail() { echo "FAIL: $*"; rm -f "$log"; exit 1; }
[ "$rc" -ne 0 ] || fail "job exited 0 although a rank failed"
(( elapsed_ms < 30000 )) || fail "job took ${elapsed_ms} ms to end (limit 30 s; 90 s means it hung)"
if [ "$mode" = kill ]; then
  grep -Eq "rank 1 .*(exited on signal 9|Killed)" "$log" || fail "no message naming rank 1 as killed"
else
  grep -q "rank 0 waits in op 21 of group world" "$log" || fail "no watchdog report from rank 0"
fi
rm -f "$log"
echo "PASS"
