#!/usr/bin/env bash
# A format-1 checkpoint (AdamW moments as m.<name> / v.<name>, written at commit 01e1b29; see
# tests/fixtures/ckpt_format1/README.md) still loads: resuming from it reproduces the losses of steps
# 4-6 and the validation loss at step 6 of the uninterrupted run that wrote it, bit for bit; and so
# does the same resume on the guarded CPU backend chosen from the command line
# (--set train.backend=cpu-guarded: device memory PROT_NONE outside backend ops, the same numbers).
#   ckpt_format1.sh EXATRAIN WORKDIR
set -euo pipefail
EXA=$1
WORK=$2
FIX=$(cd "$(dirname "$0")/../fixtures/ckpt_format1" && pwd)
rm -rf "$WORK" && mkdir -p "$WORK" && cd "$WORK"
for i in $(seq 0 399); do echo "line $i: the quick brown fox jumps over the lazy dog $((i*7%13))"; done > text.txt
"$EXA" data prepare --input text.txt --out bytes --tokenizer byte > prepare.log
cp "$FIX/job.toml" job.toml
check() {  # check BACKEND: resume a copy of the fixture on BACKEND, compare with expected.json
  rm -rf run_full && mkdir run_full && cp -r "$FIX/step_00000003" run_full/
  "$EXA" train job.toml --plain --resume run_full/step_00000003 --set train.backend="$1" > "train_$1.log" 2>&1 ||
    { cat "train_$1.log"; exit 1; }
  grep -q "backend $1" "train_$1.log" || { echo "the run does not say it trained on backend $1:"; cat "train_$1.log"; exit 1; }
  python3 - "$FIX/expected.json" run_full/metrics.jsonl "$1" <<'PY'
import json, sys
want = json.load(open(sys.argv[1]))
recs = [json.loads(l) for l in open(sys.argv[2]) if l.strip()]
losses = {str(r["step"]): r["loss"] for r in recs if "loss" in r}
vals = {r["step"]: r["val_loss"] for r in recs if "val_loss" in r}
bad = []
for step, loss in want["losses_after_resume"].items():
    if losses.get(step) != loss:
        bad.append(f"step {step}: loss {losses.get(step)} != {loss} (the uninterrupted run)")
if vals.get(6) != want["val_loss_step_6"]:
    bad.append(f"val_loss at step 6: {vals.get(6)} != {want['val_loss_step_6']}")
if bad:
    sys.exit(f"resume from the format-1 checkpoint on backend {sys.argv[3]} differs:\n  " + "\n  ".join(bad))
print(f"OK ({sys.argv[3]}): resumed from a format-1 checkpoint; losses of steps 4-6 and val_loss at 6 equal the "
      "uninterrupted run's")
PY
}
check cpu
check cpu-guarded
