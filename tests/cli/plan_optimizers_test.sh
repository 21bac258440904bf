#!/usr/bin/env bash
# `exatrain plan --optimizers` / `--compare-optimizers`: one row per optimizer with its best plan,
# step time, optimizer term, state and memory and whether it fits; the JSON keys; a bad name in
# --optimizers is refused naming the value and the choices; predict shows the matrix part.
set -u
EXA=$1
WORK=$2
rm -rf "$WORK" && mkdir -p "$WORK" && cd "$WORK"
failures=0
ok() { echo "ok: $1"; }
fail() { echo "FAIL: $1"; failures=$((failures + 1)); }

# GPT-2 small on 8 A100s of one node, the layout fixed, ZeRO and the micro-batch searched.
cat > job.toml <<'TOML'
[model]
preset = "gpt2"
[machine]
device = "a100-80g"
gpus_per_node = 8
intra_node_bw_gbs = 300
[parallel]
gpus = 8
tp = 1
pp = 1
cp = 1
zero = "auto"
micro_batch = "auto"
recompute = "none"
global_batch = 64
[train]
precision = "bf16"
TOML

out=$("$EXA" plan job.toml --optimizers adamw,muon,shampoo,soap 2>&1) || fail "plan --optimizers: $out"
rows=$(printf '%s\n' "$out" | grep -cE '^(adamw|muon|shampoo|soap) +tp=1 pp=1 dp=8 .* yes$')
[ "$rows" = 4 ] && ok "one row per optimizer" || fail "rows: $rows in: $out"
[[ "$out" == *"optimizer s"*"state GiB"*"fits"* ]] && ok "columns" || fail "columns: $out"
[[ "$out" == *"does not predict how many steps"* ]] && ok "says it is per step" || fail "note: $out"
# Shampoo under ZeRO 0 repeats its factor and root work on every replica: ZeRO 1 is its best.
printf '%s\n' "$out" | grep -qE '^shampoo +tp=1 pp=1 dp=8 cp=1 vp=1 zero=1 ' && ok "shampoo plans ZeRO 1" \
  || fail "shampoo's plan: $out"
# Every optimizer of [train] optimizer, in their documented order.
out=$("$EXA" plan job.toml --compare-optimizers 2>&1) || fail "plan --compare-optimizers: $out"
names=$(printf '%s\n' "$out" | awk 'NR > 1 && NF > 3 && $2 ~ /^tp=/ {print $1}' | tr '\n' ' ')
[ "$names" = "adamw sgd lamb lion adafactor muon shampoo soap kfac " ] && ok "--compare-optimizers lists all" \
  || fail "--compare-optimizers rows: '$names' in: $out"

# JSON: one object per optimizer with its best plan (the contract's object) and the columns.
"$EXA" plan job.toml --optimizers adamw,muon --json > cmp.json 2>&1 || fail "--json: $(cat cmp.json)"
python3 - cmp.json <<'PY' && ok "json keys" || fail "json: $(cat cmp.json)"
import json, sys
j = json.load(open(sys.argv[1]))
assert "per-step" in j["note"], j["note"]
rows = j["optimizers"]
assert [r["optimizer"] for r in rows] == ["adamw", "muon"], rows
for r in rows:
    for k in ("searched", "feasible", "fits", "best", "step_time_s", "optimizer_s", "optimizer_state_gib", "memory_gib"):
        assert k in r, (r["optimizer"], k)
    assert r["fits"] and r["best"]["optimizer_step"]["optimizer"] == r["optimizer"], r
    assert abs(r["best"]["breakdown_s"]["optimizer"] - r["optimizer_s"]) < 1e-12
assert rows[1]["best"]["optimizer_step"]["matrix_s"] > 0 and rows[0]["best"]["optimizer_step"]["matrix_s"] == 0
assert rows[1]["optimizer_s"] > rows[0]["optimizer_s"]
PY

# A bad name: the value, and the choices.
out=$("$EXA" plan job.toml --optimizers adamw,adam 2>&1); rc=$?
[ $rc = 1 ] && [[ "$out" == *'--optimizers adamw,adam: "adam" is not an optimizer; expected a comma-separated list of adamw, sgd, lamb, lion, adafactor, muon, shampoo, soap, kfac'* ]] \
  && ok "bad --optimizers" || fail "bad --optimizers: exit $rc: $out"

# No plan fits: the row says so.
out=$("$EXA" plan job.toml --optimizers adamw --set machine.device=v100 --set train.attention=unfused --set model.preset=gpt3-175b 2>&1) \
  || fail "no fit: $out"
printf '%s\n' "$out" | grep -qE '^adamw +no plan fits \([0-9]+ valid plans searched\) .* no$' && ok "a row that does not fit" \
  || fail "no-fit row: $out"

# predict: the optimizer row and its split for a matrix optimizer; none for AdamW.
cat > fixed.toml <<'TOML'
[model]
preset = "gpt2"
[machine]
device = "a100-80g"
[parallel]
gpus = 1
tp = 1
pp = 1
zero = 0
micro_batch = 8
recompute = "none"
global_batch = 8
[train]
precision = "bf16"
TOML
out=$("$EXA" predict fixed.toml --set train.optimizer=muon 2>&1) || fail "predict muon: $out"
[[ "$out" == *"(muon: elementwise "*" s + matrix "*" TFLOP per GPU)"* ]] && ok "predict shows the matrix part" \
  || fail "predict muon: $out"
out=$("$EXA" predict fixed.toml 2>&1) || fail "predict adamw: $out"
[[ "$out" != *"matrix"* ]] && ok "adamw has no matrix part" || fail "predict adamw: $out"

[ $failures = 0 ] && echo "all passed" || { echo "$failures failed"; exit 1; }
