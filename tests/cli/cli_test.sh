#!/usr/bin/env bash
# The exatrain binary as a user meets it: bad input ends with exit status 1 and one clear
# message naming the file, key or value; a tiny train -> sample -> export -> report round trip.
set -u
EXA=$1
WORK=$2
rm -rf "$WORK" && mkdir -p "$WORK" && cd "$WORK"
failures=0
# expect_error WHAT EXPECTED_SUBSTRING -- command...
expect_error() {
  local what=$1 want=$2; shift 3
  local out rc
  out=$("$@" 2>&1); rc=$?
  if [ $rc -ne 1 ] || [[ "$out" != *"$want"* ]]; then
    echo "FAIL: $what: exit $rc, wanted 1 and \"$want\" in:"; echo "$out"; failures=$((failures + 1))
  else
    echo "ok: $what"
  fi
}

printf '[model]\nhiden = 3\n' > typo.toml
expect_error "mistyped key" 'typo.toml: [model] unknown key "hiden" (did you mean "hidden"?)' -- "$EXA" check typo.toml
printf '[model]\nhidden = 770\nheads = 12\n' > shape.toml
expect_error "impossible shape" 'hidden = 770 is not divisible by heads = 12' -- "$EXA" train shape.toml
expect_error "missing job" "cannot open job file 'nope.toml'" -- "$EXA" train nope.toml
expect_error "bad --set" '--set: [train] lr = "fast": expected a number' -- "$EXA" check typo.toml --set train.lr=fast
expect_error "missing checkpoint" 'no-such-ckpt' -- "$EXA" sample no-such-ckpt --prompt hi
# `check` validates a fully set [parallel] as `predict` does, printing the failing equation.
printf '[model]\nlayers = 4\nhidden = 64\nheads = 4\n[parallel]\ngpus = 4\ntp = 2\npp = 2\nzero = 0\nmicro_batch = 1\nrecompute = "none"\nglobal_batch = 8\n' > par.toml
"$EXA" check par.toml > /dev/null && echo "ok: check accepts a valid plan" || { echo "FAIL: check of a valid plan"; failures=$((failures + 1)); }
expect_error "check: gpus" 'par.toml: invalid plan: gpus = tp * pp * dp * cp: 2 * 2 * 1 * 1 = 4, but gpus = 8' -- "$EXA" check par.toml --set parallel.gpus=8 --set parallel.dp=1
expect_error "check: stages" 'micro-batches >= pp: global_batch / (dp * micro_batch) = 1 / (1 * 1) = 1 < pp = 2' -- "$EXA" check par.toml --set parallel.global_batch=1
expect_error "missing run dir" 'cannot open metrics file' -- "$EXA" report no-such-run

# A tiny real run: byte tokenizer on a few lines.
for i in $(seq 1 300); do echo "line $i of a small test text, with some words to learn."; done > text.txt
"$EXA" data prepare --input text.txt --out data --tokenizer byte > prep.log 2>&1 || { echo "FAIL: prepare"; cat prep.log; exit 1; }
cat > tiny.toml <<TOML
[model]
layers = 1
hidden = 16
heads = 2
seq_len = 16
[parallel]
global_batch = 2
[train]
steps = 4
threads = 1
checkpoint_every = 2
data = "data"
run_dir = "run"
TOML
out=$("$EXA" train tiny.toml 2>&1) || { echo "FAIL: train"; echo "$out"; exit 1; }
# Not a terminal: plain lines, no carriage returns.
if [[ "$out" == *$'\r'* ]] || [[ "$out" != *"step      4/4"* ]]; then echo "FAIL: plain progress lines"; echo "$out"; failures=$((failures + 1)); else echo "ok: plain progress lines"; fi
[ -f run/report.svg ] && [ -f run/checkpoints/step_00000004/COMPLETE ] && echo "ok: report and checkpoint" || { echo "FAIL: outputs"; failures=$((failures + 1)); }
expect_error "fresh run into an old run_dir" 'already holds a run' -- "$EXA" train tiny.toml
"$EXA" train tiny.toml --resume auto --set train.steps=6 > resume.log 2>&1 && grep -q "resumed from" resume.log \
  && echo "ok: resume auto" || { echo "FAIL: resume"; cat resume.log; failures=$((failures + 1)); }
"$EXA" sample run/checkpoints/step_00000006 --prompt "line" --tokens 8 > sample.log 2>&1 && grep -q "^line" sample.log \
  && echo "ok: sample" || { echo "FAIL: sample"; cat sample.log; failures=$((failures + 1)); }
"$EXA" export run/checkpoints/step_00000006 --format hf --dtype bf16 --out hf > export.log 2>&1 && grep -q '"model_type": "gpt2"' hf/config.json \
  && echo "ok: export hf" || { echo "FAIL: export"; cat export.log; failures=$((failures + 1)); }
# The planner commands see the model `train` builds: a job that leaves vocab to its data takes its
# prepared dataset's tokenizer's (the byte tokenizer's 256 here), and without [train] data the
# bundled corpus's 4096, whether or not that corpus is prepared yet.
"$EXA" plan tiny.toml > plan_vocab.log 2>&1 && grep -q '^note: \[model\] vocab = 256: the tokenizer.s of \[train\] data = "data"' plan_vocab.log \
  && echo "ok: plan takes the data's vocabulary" || { echo "FAIL: plan's vocabulary"; cat plan_vocab.log; failures=$((failures + 1)); }
printf '[model]\nlayers = 1\nhidden = 16\nheads = 2\nseq_len = 16\n' > nodata.toml
EXATRAIN_CACHE=$PWD/no-cache "$EXA" check nodata.toml > nodata.log 2>&1 && grep -q '^vocab = 4096$' nodata.log \
  && grep -q '^# note: \[model\] vocab = 4096: the bundled corpus.s tokenizer' nodata.log \
  && [ ! -e no-cache ] && echo "ok: check takes the bundled corpus's vocabulary, preparing nothing" \
  || { echo "FAIL: check's vocabulary"; cat nodata.log; failures=$((failures + 1)); }
"$EXA" check tiny.toml --set train.data=nowhere > unprepared.log 2>&1 \
  && grep -q '^# note: \[model\] vocab = 50257 (the default): .*\[train\] data = "nowhere" is not prepared yet' unprepared.log \
  && echo "ok: check says the default stands for unprepared data" || { echo "FAIL: unprepared data's vocabulary"; cat unprepared.log; failures=$((failures + 1)); }
# `calibrate` takes run directories; `report --calibration` predicts the run's step with the fitted
# constants; a calibration of another device is refused.
"$EXA" calibrate run --out cal.toml > cal.log 2>&1 && "$EXA" report run --calibration cal.toml > report_cal.log 2>&1 \
  && grep -q 'prediction: `exatrain predict --calibration cal.toml` of this run' report_cal.log \
  && echo "ok: calibrate a run, report with it" || { echo "FAIL: calibrate, report --calibration"; cat cal.log report_cal.log; failures=$((failures + 1)); }
# A framework behaviour the job plans and this trainer does not run: `train` says so, and `report`
# predicts the run as it ran (ZeRO 1 here reduce-scatters after the backward, not under it).
if command -v mpirun > /dev/null; then
  mpirun --allow-run-as-root --oversubscribe -np 2 "$EXA" train tiny.toml --set parallel.dp=2 --set parallel.zero=1 \
    --set parallel.overlap_grad_reduce=true --set train.run_dir=run_zero1 --set train.steps=2 > zero1.log 2>&1 \
    && grep -q "^note: \[parallel\] overlap_grad_reduce = true: this trainer's ZeRO 1 reduce-scatters the gradients once" zero1.log \
    && "$EXA" report run_zero1 > report_zero1.log 2>&1 \
    && grep -q "(predicted as this trainer ran it, not as planned: overlap_grad_reduce = true" report_zero1.log \
    && echo "ok: train and report say what this trainer does not overlap" \
    || { echo "FAIL: planned, not run"; cat zero1.log report_zero1.log; failures=$((failures + 1)); }
else
  echo "skipped: train on 2 ranks (no mpirun)"
fi
printf '[device.h100-sxm]\nsustained = 0.7\n' > h100.toml
expect_error "report: another device's calibration" 'h100.toml calibrates h100-sxm, but this job runs on' -- \
  "$EXA" report run --calibration h100.toml
expect_error "export bad format" 'expected safetensors or hf' -- "$EXA" export run/checkpoints/step_00000006 --format onnx --out x
# The checkpoint's model has linear-layer biases: a job without them is a different model.
expect_error "resume without biases" '[model] bias: the checkpoint has true, this job has false' -- \
  "$EXA" train tiny.toml --resume auto --set model.bias=false --set train.steps=8
# A truncated checkpoint file is named on load.
truncate -s 100 run/checkpoints/step_00000006/model.safetensors
expect_error "truncated checkpoint" 'model.safetensors' -- "$EXA" sample run/checkpoints/step_00000006 --prompt hi

echo "$failures failed"
[ $failures -eq 0 ]
