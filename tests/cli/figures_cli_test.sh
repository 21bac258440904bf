#!/usr/bin/env bash
# The figure-making commands through the binary: `sweep` (one row per value, an invalid value
# reported in its row, bad --vary refused, --json, --svg), `plan --svg`, `pipeline --svg` and
# `report RUN_A RUN_B --out` (the runs compared); every SVG is parsed as XML.
set -u
EXA=$1
WORK=$2
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$WORK" && mkdir -p "$WORK" && cd "$WORK"
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
ok() { echo "ok: $*"; }
is_svg() { /usr/bin/python3 -c "import sys, xml.etree.ElementTree as E; sys.exit(0 if E.parse(sys.argv[1]).getroot().tag.endswith('svg') else 1)" "$1"; }

cat > job.toml <<'TOML'
[model]
preset = "gpt2"
[machine]
preset = "selene"
[parallel]
gpus = 8
tp = 1
pp = 1
zero = 0
micro_batch = 1
global_batch = 64
recompute = "none"
[train]
precision = "bf16"
TOML

# sweep: ZeRO 0..3 at dp 8 shard the state: optimizer memory / 8 from ZeRO 1 on; tp 8 does not divide 12 heads
out=$("$EXA" sweep job.toml --vary parallel.zero=0,1,2,3 --svg figs/zero.svg 2>&1) || fail "sweep exit status: $out"
/usr/bin/python3 - "$out" <<'PY' || failures=$((failures + 1))
import re, sys
out = sys.argv[1]
mem = out.split("memory per GPU")[1]
rows = {int(m.group(1)): [float(x) for x in m.group(2).split()[:5]] for m in re.finditer(r"^  ([0-3]) +((?:\S+ +){5})", mem, re.M)}
assert sorted(rows) == [0, 1, 2, 3], out
params, grads, opt = ([rows[z][i] for z in range(4)] for i in range(3))
assert abs(opt[1] * 8 - opt[0]) < 1e-3 * opt[0] and opt[1] == opt[2], opt   # ZeRO 1+: optimizer / dp
assert abs(grads[2] * 8 - grads[0]) < 1e-3 * grads[0] and grads[1] == grads[0], grads  # ZeRO 2+: gradients / dp
# ZeRO 3 (FSDP): the weights' fp32 shard is the master, so the weights are 4 B/param / dp (twice bf16's 2 B)
# and the optimizer keeps only Adam's 8 B of the 12 B (fp32 master + m + v): 16 B/param in all, where
# ZeRO 0-2 keep 18 (2 + 4 + 12)
assert abs(params[3] * 8 - 2 * params[0]) < 1e-3 * params[0] and params[2] == params[0], params
assert abs(opt[3] * 12 - opt[0]) < 2e-3 * opt[0], opt  # 8 of 12 B, sharded by 8: 12 x opt[3] = opt[0]
print("ok: sweep of ZeRO 0..3 shards optimizer, gradients, weights by 8 in turn")
PY
is_svg figs/zero.svg && ok "sweep --svg (directory created)" || fail "sweep --svg"
out=$("$EXA" sweep job.toml --vary parallel.tp=1,8 2>&1)
[[ "$out" == *"8 "*"not a valid plan: job.toml: invalid plan: tp must divide heads: heads % tp = 12 % 8 = 4"* ]] \
  && ok "an invalid value gets its row with the reason" || fail "invalid row: $out"
out=$("$EXA" sweep job.toml --vary parallel.zero 2>&1); rc=$?
[ $rc -eq 1 ] && [[ "$out" == *"expected section.key=V1,V2"* ]] && ok "--vary without values refused" || fail "bad --vary: $rc $out"
out=$("$EXA" sweep job.toml --vary parallel.zero=0,,1 2>&1); rc=$?
[ $rc -eq 1 ] && [[ "$out" == *"an empty value"* ]] && ok "empty value refused" || fail "empty value: $rc $out"
out=$("$EXA" sweep job.toml --vary parallel.zero=7 2>&1); rc=$?
[ $rc -eq 1 ] && [[ "$out" == *"zero = 7"* ]] && ok "a value the job file refuses ends the sweep" || fail "zero 7: $rc $out"
"$EXA" sweep job.toml --vary parallel.micro_batch=1,2 --json > sweep.json 2>&1 || fail "sweep --json"
/usr/bin/python3 - <<'PY' || failures=$((failures + 1))
import json
j = json.load(open("sweep.json"))
assert [r["value"] for r in j] == ["1", "2"], j
a, b = (r["prediction"]["memory_gib_per_gpu"]["activations"] for r in j)
assert abs(b / a - 2) < 1e-6, (a, b)
print("ok: sweep --json, activations double with the micro-batch")
PY
out=$("$EXA" sweep job.toml --set parallel.gpus=2 --set parallel.pp=2 --set parallel.dp=1 --vary 'parallel.layers_per_stage=[6,6],[9,3]' 2>&1)
[[ "$out" == *"[6,6]"* && "$out" == *"[9,3]"* && "$out" != *"not a valid plan"* ]] && ok "list values" || fail "list values: $out"

# plan --svg: one bar per listed plan in both panels
"$EXA" plan job.toml --set parallel.tp=auto --set parallel.zero=auto --top 3 --svg plan.svg > plan.log 2>&1 || fail "plan --svg: $(cat plan.log)"
is_svg plan.svg && [ "$(grep -c '>#[123] tp=' plan.svg)" = 6 ] && ok "plan --svg: 3 plans x 2 panels" || fail "plan --svg content"

# pipeline --svg: one box per forward and backward: 2 x pp x m x vp
"$EXA" pipeline --pp 2 --vp 2 -m 4 --svg pipe.svg > pipe.log 2>&1 || fail "pipeline --svg"
boxes=$(grep -c '<rect [^>]*stroke="white"><title>' pipe.svg)
is_svg pipe.svg && [ "$boxes" = 32 ] && ok "pipeline --svg: 32 boxes" || fail "pipeline --svg: $boxes boxes"

# report with several runs: two small runs that differ only in the micro-batch split
for i in $(seq 1 200); do echo "line $i of a small test text, with some words to learn."; done > text.txt
"$EXA" data prepare --input text.txt --out data --tokenizer byte > prep.log 2>&1 || { fail "prepare"; cat prep.log; }
for mb in 4 2; do
  cat > tiny$mb.toml <<TOML
[model]
layers = 1
hidden = 32
heads = 2
seq_len = 16
[parallel]
global_batch = 4
micro_batch = $mb
[train]
steps = 3
data = "data"
run_dir = "run$mb"
threads = 1
TOML
  "$EXA" train tiny$mb.toml --plain > train$mb.log 2>&1 || { fail "train $mb"; cat train$mb.log; }
done
out=$("$EXA" report run4 run2 --out cmp/runs.svg 2>&1) || fail "report compare: $out"
/usr/bin/python3 - "$out" <<'PY' || failures=$((failures + 1))
import re, sys
out = sys.argv[1]
m = re.search(r"^run2 .* (\S+) over 3 common steps$", out, re.M)
assert m and float(m.group(1)) < 1e-5, out  # gradient accumulation 1 x 4 or 2 x 2: the same loss
print("ok: report compares two runs:", m.group(0).split()[-5:])
PY
is_svg cmp/runs.svg && ok "report --out writes the comparison" || fail "comparison svg"
out=$("$EXA" report run4 run2 2>&1); rc=$?
[ $rc -eq 1 ] && [[ "$out" == *"name the comparison plot with --out FILE.svg"* ]] && ok "several runs need --out" || fail "no --out: $rc $out"

echo "$failures failure(s)"
exit $failures
