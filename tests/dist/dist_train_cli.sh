#!/usr/bin/env bash
# `exatrain train` itself on 2 MPI ranks (dp 2, ZeRO 1):
#   1. evaluation and MFU: eval_every = 2 writes val_loss records at steps 2 and 4 equal (1e-5
#      relative) to those of a single-rank run of the same job (the same weights: equivalence), and
#      the step records carry an MFU above 0; PyTorch reads the 2-rank checkpoint and finds the
#      single-rank run's tensors;
#   2. the watchdog: rank 1 frozen with SIGSTOP leaves rank 0 inside a dp collective; with
#      [parallel] watchdog_timeout_s = 3 the job ends within 30 s with "rank 0 waits in op K of
#      group dp" (or "group world", for the loss sum) from `exatrain train` itself;
#   3. nan_policy through the same session (NAN_SESSION = dist_nan_session): "stop" ends every
#      rank with the single-rank message, "skip" skips the step on every rank;
#   1c. breakdown_s_per_rank of both ranks under the planner's names (and each rank's resident and
#      peak resident bytes), 1d. bytes_sent (rank 0's ledger) = the planner's count, `exatrain report` measured
#      vs predicted; 4. resume (another model refused; one metrics record per step), 4b. resume at
#      another topology (1 rank; tp 2) and on the guarded backend, on the uninterrupted run's losses; 5. "auto" plans, 6. errors
#      printed once when every rank has them, naming the rank otherwise.
# Usage: dist_train_cli.sh MPIEXEC EXATRAIN WORKDIR NAN_SESSION
set -u
MPIEXEC=$1 EXA=$2 WORK=$3 NAN_SESSION=$4
source "$(dirname "$0")/dist_cli_setup.sh"
write_job job.toml "watchdog_timeout_s = 3" "steps = 4
eval_every = 2
eval_batches = 3"
failures=0
"${MPIRUN[@]}" "$EXA" train job.toml --plain > dist.log 2>&1 || { echo "FAIL: 2-rank run"; cat dist.log; exit 1; }
"$EXA" train job.toml --plain --set train.run_dir=single --set parallel.gpus=1 --set parallel.dp=1 \
  --set parallel.zero=0 > single.log 2>&1 || { echo "FAIL: single-rank run"; cat single.log; exit 1; }
/usr/bin/python3 - <<'PY' || failures=$((failures + 1))
import json
def records(path):
    return [json.loads(l) for l in open(path) if l.strip()]
dist, single = records("run/metrics.jsonl"), records("single/metrics.jsonl")
dv = {r["step"]: r["val_loss"] for r in dist if "val_loss" in r}
sv = {r["step"]: r["val_loss"] for r in single if "val_loss" in r}
assert sorted(dv) == [2, 4] and sorted(sv) == [2, 4], (dv, sv)
for s in dv:
    rel = abs(dv[s] - sv[s]) / abs(sv[s])
    print(f"step {s}: val_loss 2 ranks {dv[s]:.7f}, 1 rank {sv[s]:.7f}, rel diff {rel:.1e}")
    assert rel <= 1e-5, "val_loss differs"
mfu = [r["mfu"] for r in dist if "loss" in r]
assert len(mfu) == 4 and all(0 < m < 1 for m in mfu), mfu
print(f"ok: val_loss equals the single-rank run's; MFU per step {', '.join(f'{m:.2%}' for m in mfu)}")
PY
# 1c. Observability: every step record holds the time breakdown of both ranks under the planner's
#     names (plan::Breakdown), and `exatrain report` puts it next to the prediction.
/usr/bin/python3 - <<'PY' || failures=$((failures + 1))
import json
planner = {"compute", "tp_comm", "cp_comm", "pp_comm", "pp_bubble", "dp_comm", "optimizer", "other"}
steps = [json.loads(l) for l in open("run/metrics.jsonl") if '"loss"' in l]
assert len(steps) == 4, steps
for r in steps:
    per = r["breakdown_s_per_rank"]
    assert r["ranks"] == 2 and len(per) == 2, r
    for b in per:
        assert set(b) <= planner and {"compute", "dp_comm", "optimizer"} <= set(b), sorted(b)
        assert all(v >= 0 for v in b.values()) and b["compute"] > 0 and b["dp_comm"] > 0, b
    # Each rank's resident and peak resident bytes (the process is at least its 2 MiB of state).
    # The peak (getrusage) and the resident size (/proc/self/statm) come from counters the kernel
    # updates separately, so the peak may trail by a few pages (measured: 92 KiB of 41 MiB).
    rss, peak = r["rss_bytes_per_rank"], r["peak_rss_bytes_per_rank"]
    assert len(rss) == 2 and len(peak) == 2 and all(2**21 < a <= 1.05 * b for a, b in zip(rss, peak)), (rss, peak)
print("ok: breakdown_s_per_rank of 2 ranks per step, planner names:", sorted(steps[-1]["breakdown_s_per_rank"][0]))
print("ok: rss_bytes_per_rank", steps[-1]["rss_bytes_per_rank"], "peak", steps[-1]["peak_rss_bytes_per_rank"])
PY
# 1d. The step records' bytes_sent (rank 0's byte ledger) equal the planner's count for rank 0
#     (`predict --rank-bytes 0` of the run's resolved job.toml), kind by kind, at every step.
"$EXA" predict run/job.toml --rank-bytes 0 > rank_bytes.json 2> rank_bytes.log || { echo "FAIL: predict --rank-bytes"; cat rank_bytes.log; failures=$((failures + 1)); }
/usr/bin/python3 - <<'PY' || failures=$((failures + 1))
import json
predicted = {k: v for k, v in json.load(open("rank_bytes.json")).items() if v}
steps = [json.loads(l) for l in open("run/metrics.jsonl") if '"loss"' in l]
assert predicted and all(r["bytes_sent"] == predicted for r in steps), (predicted, [r["bytes_sent"] for r in steps])
print("ok: bytes_sent of every step equals predict --rank-bytes 0:", predicted)
PY
"$EXA" report run > report.log 2>&1 || { echo "FAIL: exatrain report"; cat report.log; failures=$((failures + 1)); }
/usr/bin/python3 - <<'PY' || { cat report.log; failures=$((failures + 1)); }
import re
text = open("report.log").read()
assert "measured vs predicted" in text, "no measured vs predicted table"
rows = {m.group(1): (m.group(2), m.group(3)) for m in re.finditer(r"^ +(\w+) +([0-9.]+) +(\S+)$", text, re.M)}
for part in ("compute", "dp_comm", "optimizer", "step"):
    assert part in rows and float(rows[part][0]) >= 0, (part, rows)
assert float(rows["step"][0]) > 0 and float(rows["compute"][0]) > 0, rows
# A job without [machine] runs on, and is predicted for, the local machine (catalog/clusters/local.toml).
assert "(no prediction" not in text, text
for part in ("compute", "step"):  # (dp_comm's prediction prints as 0.0000 at this size)
    assert re.fullmatch(r"[0-9.]+", rows[part][1]) and float(rows[part][1]) > 0, ("predicted", part, rows)
predicted = rows["step"][1]
print("ok: exatrain report: measured vs predicted, step measured", rows["step"][0], "predicted", predicted)
PY
# 1b. The 2-rank checkpoint (every rank wrote its slices) is the single-rank trainer's format: PyTorch
#     reads both and finds the same tensors, shapes, metadata and values (|a - b| / (1 + |b|) <= 1e-5).
/usr/bin/python3 - "$TEST_DIR/checkpoint" <<'PY' || failures=$((failures + 1))
import sys
sys.path.insert(0, sys.argv[1])
import torch
from safetensors_torch import read
for f in ("model.safetensors", "optimizer.safetensors"):
    dist, dmeta = read("run/checkpoints/step_00000004/" + f)
    single, smeta = read("single/checkpoints/step_00000004/" + f)
    assert dmeta == smeta, (f, dmeta, smeta)
    assert sorted(dist) == sorted(single) and len(dist) > 10, (f, sorted(dist), sorted(single))
    for name, t in single.items():
        assert dist[name].shape == t.shape, (name, dist[name].shape, t.shape)
        diff = ((dist[name] - t).abs() / (1 + t.abs())).max().item()  # as max_weight_diff in tests/dist
        assert diff <= 1e-5, (name, diff)
print("ok: PyTorch reads the 2-rank checkpoint: the single-rank run's tensors, shapes and values")
PY
# 4. Resume on 2 ranks: a checkpoint of another model is refused by name; resuming an earlier
#    checkpoint keeps one metrics record per step.
"${MPIRUN[@]}" "$EXA" train job.toml --plain --resume auto --set model.hidden=64 > other.log 2>&1 \
  && { echo "FAIL: another model's checkpoint was accepted"; failures=$((failures + 1)); }
[ "$(grep -c "\[model\] hidden: the checkpoint has 32, this job has 64" other.log)" = 1 ] \
  && echo "ok: another model's checkpoint refused (once)" || { echo "FAIL: other-model message"; cat other.log; failures=$((failures + 1)); }
"${MPIRUN[@]}" "$EXA" train job.toml --plain --resume run/checkpoints/step_00000004 --set train.steps=6 > more.log 2>&1 \
  || { echo "FAIL: resume"; cat more.log; failures=$((failures + 1)); }
steps=$(/usr/bin/python3 -c "import json; print(' '.join(str(json.loads(l)['step']) for l in open('run/metrics.jsonl') if '\"loss\"' in l))")
[ "$steps" = "1 2 3 4 5 6" ] && echo "ok: one record per step after resume" || { echo "FAIL: steps $steps"; failures=$((failures + 1)); }
# 4b. Resume at ANOTHER topology: the checkpoint of a 2-rank dp 2 ZeRO 1 run at step 3 of 6,
#     continued on one rank (no mpirun) and on 2 ranks at tp 2, gives the uninterrupted 2-rank
#     run's losses at steps 4-6 (1e-5 relative).
"${MPIRUN[@]}" "$EXA" train job.toml --plain --set train.run_dir=long --set train.steps=6 \
  --set train.checkpoint_every=3 > long.log 2>&1 || { echo "FAIL: 6-step 2-rank run"; cat long.log; failures=$((failures + 1)); }
"$EXA" train job.toml --plain --resume long/checkpoints/step_00000003 --set train.run_dir=long_1rank \
  --set train.steps=6 --set parallel.gpus=1 --set parallel.dp=1 --set parallel.zero=0 > long_1rank.log 2>&1 \
  || { echo "FAIL: single-rank resume of the dp2 checkpoint"; cat long_1rank.log; failures=$((failures + 1)); }
"${MPIRUN[@]}" "$EXA" train job.toml --plain --resume long/checkpoints/step_00000003 --set train.run_dir=long_tp2 \
  --set train.steps=6 --set parallel.tp=2 --set parallel.dp=1 --set parallel.zero=0 > long_tp2.log 2>&1 \
  || { echo "FAIL: tp2 resume of the dp2 checkpoint"; cat long_tp2.log; failures=$((failures + 1)); }
# ... and on the guarded backend (device memory PROT_NONE outside backend ops) through the whole
#     session: the load, steps, evaluation and the sharded save of step 6 on 2 ranks.
"${MPIRUN[@]}" "$EXA" train job.toml --plain --resume long/checkpoints/step_00000003 --set train.run_dir=long_guarded \
  --set train.steps=6 --set train.checkpoint_every=3 --set train.backend=cpu-guarded > long_guarded.log 2>&1 \
  || { echo "FAIL: guarded resume of the dp2 checkpoint"; cat long_guarded.log; failures=$((failures + 1)); }
[ -f long_guarded/checkpoints/step_00000006/optimizer.safetensors ] && echo "ok: the guarded session saved step 6" \
  || { echo "FAIL: no step-6 checkpoint of the guarded session"; failures=$((failures + 1)); }
/usr/bin/python3 - <<'PY' || failures=$((failures + 1))
import json
def losses(path):
    return {r["step"]: r["loss"] for r in map(json.loads, filter(str.strip, open(path))) if "loss" in r}
ref = losses("long/metrics.jsonl")
assert sorted(ref) == [1, 2, 3, 4, 5, 6], ref
for run in ("long_1rank", "long_tp2", "long_guarded"):
    got = losses(run + "/metrics.jsonl")
    assert sorted(got) == [4, 5, 6], (run, got)
    rel = max(abs(got[s] - ref[s]) / abs(ref[s]) for s in got)
    assert rel <= 1e-5, (run, got, ref)
    print(f"ok: {run} resumed the dp2 checkpoint of step 3: steps 4-6 losses",
          ", ".join(f"{got[s]:.6f}" for s in sorted(got)), f"(uninterrupted: rel diff {rel:.1e})")
PY
# 5. "auto" picks a plan this runtime can run: with one kv head, tp must stay 1.
sed -e 's/^tp = 1/tp = "auto"/' -e 's/^dp = 2/dp = "auto"/' -e 's/^zero = 1/zero = "auto"/' -e 's/^heads = 2/heads = 2\nkv_heads = 1/' job.toml > auto.toml
"${MPIRUN[@]}" "$EXA" train auto.toml --plain --set train.run_dir=auto --set train.steps=1 > auto.log 2>&1 \
  && grep -q "auto: the planner's best plan" auto.log && echo "ok: auto plan runs" \
  || { echo "FAIL: auto"; cat auto.log; failures=$((failures + 1)); }
# 6. Errors once: a problem of the job file, which every rank finds, is printed by rank 0 alone; a
#    problem one rank alone hits (its data directory missing, as on a node without the shard) names
#    that rank.
sed 's/^heads = 2/heads = 3/' job.toml > bad.toml
"${MPIRUN[@]}" "$EXA" train bad.toml --plain > bad.log 2>&1 && { echo "FAIL: a bad job ran"; failures=$((failures + 1)); }
n=$(grep -c "bad.toml: \[model\] hidden = 32 is not divisible by heads = 3" bad.log)
[ "$n" = 1 ] && echo "ok: the job file's problem printed once by 2 ranks" \
  || { echo "FAIL: the job file's problem printed $n times"; cat bad.log; failures=$((failures + 1)); }
"${MPIRUN[@]}" "$EXA" train job.toml --plain --set parallel.gpus=4 --set train.run_dir=gpus4 > gpus.log 2>&1 \
  && { echo "FAIL: gpus = 4 ran on 2 ranks"; failures=$((failures + 1)); }
n=$(grep -c "exatrain: error: --set parallel.gpus=4: \[parallel\] gpus = 4 but the job runs on 2 MPI ranks" gpus.log)
[ "$n" = 1 ] && echo "ok: the plan's problem (after MPI_Init, every rank) printed once, naming the --set" \
  || { echo "FAIL: the plan's problem printed $n times"; cat gpus.log; failures=$((failures + 1)); }
"${MPIRUN[@]}" "$EXA" train job.toml --plain > again.log 2>&1 && { echo "FAIL: a second run into run/"; failures=$((failures + 1)); }
n=$(grep -c "exatrain: error: job.toml: \[train\] run_dir = \"run\" already holds a run" again.log)
[ "$n" = 1 ] && echo "ok: rank 0's verdict on run_dir printed once" \
  || { echo "FAIL: run_dir verdict printed $n times"; cat again.log; failures=$((failures + 1)); }
"$MPIEXEC" --allow-run-as-root --oversubscribe -np 1 "$EXA" train job.toml --plain --set train.run_dir=local \
  : -np 1 "$EXA" train job.toml --plain --set train.run_dir=local --set train.data=nodata > local.log 2>&1 \
  && { echo "FAIL: a rank without its data ran"; failures=$((failures + 1)); }
n=$(grep -c "exatrain: error: rank 1 of 2: --set train.data=nodata: \\[train\\] data = \"nodata\"" local.log)
[ "$n" = 1 ] && echo "ok: a rank-local problem names the rank: $(grep -m1 'rank 1 of 2' local.log)" \
  || { echo "FAIL: rank-local error printed $n times"; cat local.log; failures=$((failures + 1)); }
# 3. nan_policy (before the stall test, which leaves nothing behind to clean up).
for policy in stop skip; do
  "${MPIRUN[@]}" "$NAN_SESSION" job.toml $policy > nan_$policy.log 2>&1 && grep "^OK" nan_$policy.log | head -1 \
    || { echo "FAIL: nan_policy $policy"; cat nan_$policy.log; failures=$((failures + 1)); }
done
# 2. The watchdog of `exatrain train`.
"${MPIRUN[@]}" "$EXA" train job.toml --plain --set train.steps=100000 --set train.run_dir=stall \
  --set train.eval_every=0 > stall.log 2>&1 &
mpirun_pid=$!
for _ in $(seq 1 600); do grep -q "step *[0-9]" stall.log && break; sleep 0.1; done
victim=$(rank_pid $mpirun_pid 1)
[ -n "$victim" ] || { echo "FAIL: rank 1 not found"; cat stall.log; kill -9 $mpirun_pid; exit 1; }
start=$(date +%s)
kill -STOP "$victim"
for _ in $(seq 1 300); do kill -0 $mpirun_pid 2>/dev/null || break; sleep 0.1; done
elapsed=$(( $(date +%s) - start ))
if kill -0 $mpirun_pid 2>/dev/null; then
  echo "FAIL: the job still runs $elapsed s after rank 1 stalled"; failures=$((failures + 1))
  kill -9 "$victim" $mpirun_pid 2>/dev/null
fi
kill -9 "$victim" 2>/dev/null  # Open MPI's SIGTERM does not reach a stopped process
wait $mpirun_pid 2>/dev/null
grep -Eq "rank 0 waits in op [0-9]+ of group (dp|world)" stall.log \
  && echo "ok: ended ${elapsed} s after the stall: $(grep -m1 -E 'rank 0 waits in op' stall.log)" \
  || { echo "FAIL: no watchdog report"; cat stall.log; failures=$((failures + 1)); }
exit $failures
