#!/usr/bin/env bash
# `exatrain train` under mpirun (2 ranks, dp 2, ZeRO 1): kill -9 of rank 1 ends the job promptly
# with a message naming the rank (no hang), and `--resume auto` continues from the last complete
# checkpoint to the end (writing a Perfetto trace of its first steps).
# Usage: dist_fault_resume.sh MPIEXEC EXATRAIN WORKDIR   (MPIEXEC = srun: the same under Slurm,
# where srun names the task: "srun: error: HOST: task 1: Killed")
set -u
MPIEXEC=$1 EXA=$2 WORK=$3
source "$(dirname "$0")/dist_cli_setup.sh"
write_job job.toml "" "steps = 100000
checkpoint_every = 5"
"${MPIRUN[@]}" "$EXA" train job.toml --plain > run1.log 2>&1 &
mpirun_pid=$!
# Wait for a complete checkpoint (at most 60 s). Not `ls step_*/COMPLETE`: the run keeps only the
# newest checkpoints, so one the glob listed may be gone when ls looks at it (a false failure).
have_checkpoint() {
  for f in run/checkpoints/step_*/COMPLETE; do [ -e "$f" ] && return 0; done
  return 1
}
for _ in $(seq 1 600); do
  have_checkpoint && break
  sleep 0.1
done
have_checkpoint || { echo "FAIL: no checkpoint within 60 s"; cat run1.log; kill -9 $mpirun_pid; exit 1; }
sleep 0.5
victim=$(rank_pid $mpirun_pid 1)
[ -n "$victim" ] || { echo "FAIL: rank 1 of $LAUNCHER $mpirun_pid not found"; kill -9 $mpirun_pid; exit 1; }
start=$(date +%s.%N)
kill -9 "$victim"
wait $mpirun_pid
rc=$?
elapsed=$(echo "$(date +%s.%N) - $start" | bc)
echo "$LAUNCHER exited with status $rc, $elapsed s after kill -9 of rank 1 (pid $victim)"
failures=0
[ $rc -ne 0 ] || { echo "FAIL: $LAUNCHER exit status 0 after a rank was killed"; failures=$((failures + 1)); }
(( $(echo "$elapsed < 20" | bc) )) || { echo "FAIL: took $elapsed s to end"; failures=$((failures + 1)); }
grep -Eq "rank 1|task 1" run1.log && echo "ok: the message names rank 1: $(grep -E -m1 'rank 1|task 1' run1.log)" \
  || { echo "FAIL: no message naming rank 1"; cat run1.log; failures=$((failures + 1)); }
last=$(ls -d run/checkpoints/step_*/COMPLETE | sort | tail -1 | sed 's|.*step_0*\([0-9]*\)/COMPLETE|\1|')
target=$((last + 3))
"${MPIRUN[@]}" "$EXA" train job.toml --plain --resume auto --set train.steps=$target --trace trace.json > run2.log 2>&1 \
  || { echo "FAIL: resumed run"; cat run2.log; failures=$((failures + 1)); }
grep -q "resumed from .*step_0*$last (step $last)" run2.log && grep -q "step *$target/$target" run2.log \
  && echo "ok: --resume auto continued from step $last to step $target" \
  || { echo "FAIL: resume from step $last"; cat run2.log; failures=$((failures + 1)); }
# The resumed run also wrote a Chrome/Perfetto trace of its 3 steps: forward and backward events of both ranks.
/usr/bin/python3 - <<'PY' && echo "ok: trace.json" || { echo "FAIL: trace.json"; failures=$((failures + 1)); }
import json
events = json.load(open("trace.json"))
events = events["traceEvents"] if isinstance(events, dict) else events
for rank in (0, 1):
    names = [e["name"] for e in events if e.get("pid") == rank and e.get("ph") == "X"]
    assert any(n.startswith("F ") for n in names) and any(n.startswith("B ") for n in names), (rank, names[:5])
PY
exit $failures
