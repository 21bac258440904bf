#!/usr/bin/env bash
# `exatrain calibrate` end to end: three published runs of one cluster in, a calibration file out
# that `predict --calibration` and `validate --calibration` read; bad inputs refused with a clear
# message. Checks the structure, never a fitted value.
set -euo pipefail
EXE=$1
WORK=$2
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$WORK" && mkdir -p "$WORK" && cd "$WORK"
CSV=$ROOT/bench/validation/published_runs.csv
# The header and three MosaicML A100-80GB rows.
# (awk, not `grep | head`: under pipefail a writer cut off by its reader's exit fails the script.)
rows() { awk -v n="$1" -v pat="$2" 'NR == 1 || ($0 ~ pat && /amp_bf16/ && k++ < n)' "$CSV"; }
rows 3 'A100-80GB \\(1600 Gbps' > three.csv
"$EXE" calibrate three.csv --out cal.toml > out.txt
grep -q '^\[device.a100-80g\]' cal.toml
grep -q '^sustained = ' cal.toml
grep -q '^leave_one_out_mape_pct = ' cal.toml
grep -q 'MAPE over 3 runs: shipped' out.txt
# The prior: on an A100 narrow for sustained, wide for the rest; recorded in the file; off on request;
# a bad one refused.
grep -q '^prior: sustained=0.06,bw_efficiency=1,network=1,attention=1,noise=0.037$' out.txt
grep -q '^prior = "sustained=0.06,bw_efficiency=1,network=1,attention=1,noise=0.037"$' cal.toml
"$EXE" calibrate three.csv --prior off --out off.toml > off.txt
grep -q '^prior = "off"$' off.toml
# A prior of one's own is recorded, and the file's prior reproduces the calibration.
"$EXE" calibrate three.csv --prior sustained=0.1,noise=0.02 --out own.toml > own.txt
grep -q '^prior = "sustained=0.1,bw_efficiency=1,network=1,attention=1,noise=0.02"$' own.toml
"$EXE" calibrate three.csv --prior "$(sed -n 's/^prior = "\(.*\)"$/\1/p' own.toml)" --out again.toml > again.txt
diff <(grep -v '^#' own.toml) <(grep -v '^#' again.toml)
if "$EXE" calibrate three.csv --prior sustained=wide --out x.toml 2> err.txt; then echo "bad prior accepted"; exit 1; fi
grep -q -e "--prior sustained=wide: item 'sustained=wide': 'wide' is not a number > 0" err.txt
# The catalog key the prior reads (sustained_fitted) must be true or false.
cp -r "$ROOT/catalog" cat2
sed -i '0,/^sustained_fitted = true/s//sustained_fitted = "yes"/' cat2/devices.toml
if EXATRAIN_CATALOG=$PWD/cat2 "$EXE" calibrate three.csv --out x.toml 2> err.txt; then echo "bad catalog key accepted"; exit 1; fi
grep -q 'devices.toml: \[a100-40g\] sustained_fitted = "yes" must be true or false' err.txt
# predict and validate take it; a job on another device refuses it.
cat > a100.toml <<'JOB'
[model]
preset = "gpt3-1.3b"
[machine]
preset = "selene"
[parallel]
gpus = 8
tp = 1
pp = 1
zero = 1
micro_batch = 4
global_batch = 64
recompute = "none"
[train]
precision = "bf16"
JOB
"$EXE" predict a100.toml --calibration cal.toml > predict.txt
grep -q '^step ' predict.txt
"$EXE" validate --in-sample --calibration cal.toml > validate.txt
grep -q '^held_out_mape_pct=- ' validate.txt
# With the default CSV the never-fitted sources follow, predicted with the same constants; 'none' skips them.
grep -q '^never_fitted_mape_pct=[0-9.]* never_fitted_worst_source_pct=[0-9.]* rows=7$' validate.txt
# ... however the default CSV is named (`make validate` names it relative to the source), once each
# contract line; --rows adds the never-fitted rows' table (no held-out column: "-"), --json their report.
SRC=$(cd "$(dirname "$0")/../.." && pwd)
(cd "$SRC" && "$EXE" validate --in-sample --rows bench/validation/published_runs.csv) > rows.txt
[ "$(grep -c '^held_out_mape_pct=' rows.txt)" = 1 ] && [ "$(grep -c '^never_fitted_mape_pct=' rows.txt)" = 1 ]
grep -q '^ *1 NVIDIA-NeMo/Megatron-Bridge .* -$' rows.txt
"$EXE" validate --in-sample --json | python3 -c '
import json, sys
j = json.load(sys.stdin)
assert j["never_fitted"]["path"].endswith("bench/validation/never_fitted_runs.csv"), j["never_fitted"]["path"]
assert len(j["never_fitted"]["report"]["rows"]) == 7'
"$EXE" validate --in-sample --never-fitted none > validate.txt
if grep -q 'never_fitted' validate.txt; then echo "--never-fitted none still reported them"; exit 1; fi
if "$EXE" validate --in-sample --never-fitted no-such.csv > /dev/null 2> err.txt; then echo "missing never-fitted file accepted"; exit 1; fi
grep -q 'cannot open validation file no-such.csv' err.txt
sed 's/selene/eos/' a100.toml > h100.toml
if "$EXE" predict h100.toml --calibration cal.toml 2> err.txt; then echo "another device's calibration accepted"; exit 1; fi
grep -q 'calibrates a100-80g, but this job runs on h100-sxm' err.txt
# Runs of two devices, and an input that is neither a run nor a CSV.
{ rows 2 'A100-80GB \\(1600 Gbps'; awk '/H100-80GB/ && k++ < 1' "$CSV"; } > mixed.csv
if "$EXE" calibrate mixed.csv --out x.toml 2> err.txt; then echo "mixed devices accepted"; exit 1; fi
grep -q 'ran on 2 devices' err.txt
if "$EXE" calibrate no-such-run --out x.toml 2> err.txt; then echo "missing input accepted"; exit 1; fi
grep -q 'no-such-run: neither a run directory' err.txt
# An explicit --fit the runs cannot determine.
rows 1 'A100-80GB \\(1600 Gbps' > one.csv
if "$EXE" calibrate one.csv --fit sustained,network,bw_efficiency --out x.toml 2> err.txt; then echo "undetermined fit accepted"; exit 1; fi
grep -q '1 run cannot determine 3 constants' err.txt
echo "calibrate end to end: OK"
