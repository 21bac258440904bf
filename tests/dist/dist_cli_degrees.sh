#!/usr/bin/env bash
# `exatrain train` on 2 ranks with [parallel] dp omitted: dp is the contract's default world /
# (tp * cp * pp), inferred without asking the planner; when it does not divide, or gpus is not the
# world size, the error prints the equation once (rank 0); so is an unwritable --trace path, before step 1. Usage: dist_cli_degrees.sh MPIEXEC EXATRAIN WORKDIR
set -u
MPIEXEC=$1 EXA=$2 WORK=$3
source "$(dirname "$0")/dist_cli_setup.sh"
write_job job.toml "" "steps = 2"
sed -i '/^dp = /d' job.toml
failures=0
# expect_once WHAT TEXT -- mpirun args: the run fails and TEXT appears exactly once in its output.
expect_once() {
  local what=$1 want=$2; shift 3
  local out n
  out=$("${MPIRUN[@]}" "$EXA" train job.toml --plain "$@" 2>&1) && { echo "FAIL: $what: exit 0"; failures=$((failures + 1)); return; }
  n=$(grep -cF -- "$want" <<< "$out")
  [ "$n" = 1 ] && echo "ok: $what: $want" || { echo "FAIL: $what: \"$want\" $n times in:"; echo "$out"; failures=$((failures + 1)); }
}
"${MPIRUN[@]}" "$EXA" train job.toml --plain > infer.log 2>&1 || { echo "FAIL: dp omitted"; cat infer.log; exit 1; }
if grep -q "\[parallel\] auto" infer.log; then echo "FAIL: dp omitted asked the planner"; failures=$((failures + 1)); fi
grep -q "training on 2 MPI ranks (tp 1 x pp 1 (vp 1, 1f1b) x dp 2" infer.log && echo "ok: dp omitted -> dp = 2 (world 2 / (tp 1 * cp 1 * pp 1))" \
  || { echo "FAIL: dp omitted did not give dp 2"; cat infer.log; failures=$((failures + 1)); }
grep -qx "dp = 2" run/job.toml && echo "ok: the run's job.toml records the inferred dp = 2" \
  || { echo "FAIL: run/job.toml lacks dp = 2"; cat run/job.toml; failures=$((failures + 1)); }
# gpus omitted too: the world size.
rm -rf run
sed '/^gpus = /d' job.toml > nogpus.toml
"${MPIRUN[@]}" "$EXA" train nogpus.toml --plain > nogpus.log 2>&1 && grep -q "training on 2 MPI ranks (tp 1 x pp 1 (vp 1, 1f1b) x dp 2" nogpus.log \
  && echo "ok: gpus and dp omitted -> gpus = world 2, dp = 2" || { echo "FAIL: gpus and dp omitted"; cat nogpus.log; failures=$((failures + 1)); }
rm -rf run
expect_once "dp does not divide" "cannot infer dp: world 2 is not divisible by tp 1 * cp 1 * pp 3 = 3" -- --set parallel.pp=3
expect_once "gpus, degrees set" "--set parallel.gpus=8: [parallel] gpus = 8 but the job runs on 2 MPI ranks" -- --set parallel.gpus=8
expect_once "gpus, auto" "--set parallel.gpus=8: [parallel] gpus = 8 but the job runs on 2 MPI ranks" -- \
  --set parallel.gpus=8 --set parallel.zero=auto
expect_once "stages" "micro_batches 1 < pp 2" -- --set parallel.pp=2 --set parallel.global_batch=1
# With an "auto" field the planner fills it; when the fields that are set cannot add up, the equation.
expect_once "auto, degrees" "the fields that are set cannot make a plan for 2 ranks (unset ones at their smallest values): gpus = tp * pp * dp * cp: 2 * 2 * 1 * 1 = 4, but gpus = 2" -- \
  --set parallel.vp=auto --set parallel.tp=2 --set parallel.pp=2 --set parallel.dp=1
expect_once "auto, stages" "micro-batches >= pp: global_batch / (dp * micro_batch) = 1 / (1 * 1) = 1 < pp = 2" -- \
  --set parallel.vp=auto --set parallel.pp=2 --set parallel.dp=1 --set parallel.global_batch=1
# A trace path that cannot be written is refused before step 1 (rank 0 checks it for all).
expect_once "bad --trace" "--trace /nonexistent/dir/t.json: cannot write the trace there" -- --trace /nonexistent/dir/t.json
[ ! -e run/metrics.jsonl ] && echo "ok: no step ran" || { echo "FAIL: steps ran before the trace path was refused"; failures=$((failures + 1)); }
exit $failures
