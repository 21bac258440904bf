#!/usr/bin/env bash
# The bad inputs of ../shared/bad-inputs/README.md through the binary, as a user meets them: each
# ends with exit status 1 and a message naming the file, key or tensor, the value and what was
# expected (never a signal, a hang or a silent acceptance); the environment cases too (FIFOs,
# unwritable directories, incomplete checkpoints, leftovers of interrupted saves, one huge line).
# Crafted checkpoints keep valid checksums (recheck below), as an attacker's would.
set -u
EXA=$1
WORK=$2
SRC=$(cd "$(dirname "$0")/../.." && pwd)
CORPUS=$SRC/fuzz/corpus
rm -rf "$WORK" && mkdir -p "$WORK" && cd "$WORK"
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
# expect_error WHAT EXPECTED_SUBSTRING -- command...: exit status 1 (no signal, no hang) and the text.
expect_error() {
  local what=$1 want=$2; shift 3
  local out rc
  out=$(timeout 120 "$@" 2>&1); rc=$?
  if [ $rc -ne 1 ] || [[ "$out" != *"$want"* ]]; then
    fail "$what: exit $rc, wanted 1 and \"$want\" in:"; echo "$out" | head -c 3000; echo
  else
    echo "ok: $what"
  fi
}
# expect_ok WHAT EXPECTED_SUBSTRING -- command...: exit status 0 and the text.
expect_ok() {
  local what=$1 want=$2; shift 3
  local out rc
  out=$(timeout 120 "$@" 2>&1); rc=$?
  if [ $rc -ne 0 ] || [[ "$out" != *"$want"* ]]; then
    fail "$what: exit $rc, wanted 0 and \"$want\" in:"; echo "$out" | head -c 3000; echo
  else
    echo "ok: $what"
  fi
}
# recheck CKPT: the manifest's sizes and sha256 of every file, then COMPLETE, recomputed.
recheck() {
  python3 - "$1" <<'PY'
import hashlib, json, os, sys
d = sys.argv[1]
m = json.load(open(os.path.join(d, "manifest.json")))
for name, e in m["files"].items():
    b = open(os.path.join(d, name), "rb").read()
    e["bytes"], e["sha256"] = len(b), hashlib.sha256(b).hexdigest()
text = json.dumps(m, indent=2) + "\n"
open(os.path.join(d, "manifest.json"), "w").write(text)
c = json.load(open(os.path.join(d, "COMPLETE")))
c["manifest_sha256"] = hashlib.sha256(text.encode()).hexdigest()
open(os.path.join(d, "COMPLETE"), "w").write(json.dumps(c) + "\n")
PY
}

# ---- job files: check, predict, train ----
for f in job_deep_arrays job_deep_inline_tables; do
  expect_error "check $f" "$f.toml:2:" -- "$EXA" check "$CORPUS/job/$f.toml"
  expect_error "predict $f" "not valid TOML: arrays and inline tables nested deeper than 32 levels" -- "$EXA" predict "$CORPUS/job/$f.toml"
  expect_error "plan $f" "not valid TOML: arrays and inline tables nested deeper than 32 levels" -- "$EXA" plan "$CORPUS/job/$f.toml"
done
expect_error "check literal string" "job_literal_string_oob.toml:2:11: not valid TOML: invalid UTF-8 (byte 0xea)" -- "$EXA" check "$CORPUS/job/job_literal_string_oob.toml"
expect_error "check seed 2^64-1" "the integer 18446744073709551615 is outside the 64-bit range of TOML integers" -- "$EXA" check "$CORPUS/job/job_seed_clamp.toml"
expect_error "predict huge model" "the model has 1.45e+30 parameters, more than the 7.21e+16 (2^56)" -- "$EXA" predict "$CORPUS/job/job_param_overflow.toml"
expect_error "check preset ../" '[model] preset = "../jobs/default": expected the name of a preset in models/' -- "$EXA" check "$CORPUS/job/job_preset_traversal.toml"
expect_error "--set preset ../" '--set: [model] preset = "../jobs/default": expected the name of a preset' -- "$EXA" check "$SRC/jobs/default.toml" --set model.preset=../jobs/default
expect_error "check NUL in preset" 'preset = "gpt2.toml\u0000junk": expected a string without NUL characters' -- "$EXA" check "$CORPUS/job/job_nul_in_preset.toml"
expect_error "check unknown device" '[machine] device = "tpu-v9": expected a device of' -- "$EXA" check "$CORPUS/job/job_device_unknown.toml"
expect_error "train unknown device" '[machine] device = "tpu-v9": expected a device of' -- "$EXA" train "$CORPUS/job/job_device_unknown.toml"
# The resolved job `check` prints reads back as the same job.
"$EXA" check "$SRC/jobs/default.toml" > resolved.toml && "$EXA" check resolved.toml > resolved2.toml && cmp -s <(grep -v '^#' resolved.toml) resolved2.toml \
  && echo "ok: check output reads back" || fail "check output does not read back"
# A file of one's own is an explicit path key, and `check` says so.
printf '[model]\nlayers = 2\nhidden = 64\nheads = 4\n' > mymodel.toml
printf '[model]\npreset_file = "mymodel.toml"\n' > own.toml
expect_ok "check preset_file" '# [model] preset_file = "mymodel.toml": a file of your own' -- "$EXA" check own.toml

# ---- a dataset whose shard header claims 2^63 tokens (checksums valid) ----
mkdir -p data-cache/bad-inputs && tar xzf "$SRC/tests/bad_inputs/data_shard_count_wrap.tgz" -C data-cache/bad-inputs
expect_error "data verify 2^63 tokens" 'shards[0]: 9223372036854775808 tokens of 2 bytes need a file of 64 + 9223372036854775808 x 2 bytes, but bytes = 64' \
  -- "$EXA" data verify data-cache/bad-inputs/evil_wrap
sed 's|run_dir = .*|run_dir = "runs/evilwrap"|' "$CORPUS/job/job_evil_wrap.toml" > evil.toml
expect_error "train on 2^63 tokens" 'manifest.json: shards[0]: 9223372036854775808 tokens' -- "$EXA" train evil.toml
cp -r data-cache/bad-inputs/evil_wrap evil_manifest
for edit in 'm["tokenizer"]["vocab_size"] = 1e300' 'm["tokenizer"]["vocab_size"] = -1' 'm["token_bytes"] = 2**32 + 2'; do
  python3 -c "import json; m = json.load(open('evil_manifest/manifest.json')); m['shards'][0]['tokens'] = 0; m['total_tokens'] = 0; $edit; json.dump(m, open('evil_manifest/manifest.json', 'w'))"
  expect_error "manifest: $edit" "expected an integer in" -- "$EXA" data verify evil_manifest
done

# ---- a tiny real run (byte tokenizer), then its checkpoints crafted ----
for i in $(seq 1 300); do echo "line $i of a small test text, with some words to learn."; done > text.txt
"$EXA" data prepare --input text.txt --out data --tokenizer byte > prep.log 2>&1 || { echo "FAIL: prepare"; cat prep.log; exit 1; }
cat > tiny.toml <<'TOML'
[model]
layers = 1
hidden = 16
heads = 2
seq_len = 16
[parallel]
global_batch = 2
[train]
steps = 6
threads = 1
checkpoint_every = 2
keep_checkpoints = 0
data = "data"
run_dir = "run"
TOML
"$EXA" train tiny.toml --plain > train.log 2>&1 || { echo "FAIL: train"; cat train.log; exit 1; }
# keep_checkpoints = 0 keeps all (as documented).
[ "$(ls -d run/checkpoints/step_* | wc -l)" -eq 3 ] && echo "ok: keep_checkpoints = 0 keeps all" || fail "keep_checkpoints = 0: $(ls run/checkpoints)"
C=run/checkpoints
expect_error "checkpoint list of a missing directory" "checkpoint list: /nonexistent does not exist or is not a directory" -- "$EXA" checkpoint list /nonexistent

# A newline in run_dir: the checkpoints' job.toml reads back, so resume and sample work.
sed 's|run_dir = "run"|run_dir = "run\\nline2"|; s|steps = 6|steps = 2|' tiny.toml > newline.toml
"$EXA" train newline.toml --plain > nl.log 2>&1 || { fail "train with a newline in run_dir"; cat nl.log; }
expect_ok "resume with a newline in run_dir" "resumed from" -- "$EXA" train newline.toml --resume auto --set train.steps=4 --plain
expect_ok "sample with a newline in run_dir" "line" -- "$EXA" sample $'run\nline2/checkpoints/step_00000004' --prompt line --tokens 4

# A checkpoint whose job.toml is nested like job_deep_arrays.toml (checksums valid): sample, export
# and --resume auto refuse it with the parser's message (a stack overflow before).
rm -rf deepjob deeprun && cp -r $C/step_00000006 deepjob && cp "$CORPUS/job/job_deep_arrays.toml" deepjob/job.toml && recheck deepjob
cp -r run deeprun && cp "$CORPUS/job/job_deep_inline_tables.toml" deeprun/checkpoints/step_00000006/job.toml && recheck deeprun/checkpoints/step_00000006
sed 's|run_dir = "run"|run_dir = "deeprun"|' tiny.toml > deeprun.toml
expect_error "sample: nested job.toml" "deepjob/job.toml:2:" -- "$EXA" sample deepjob --prompt line
expect_error "export: nested job.toml" "nested deeper than 32 levels" -- "$EXA" export deepjob --out deepout
expect_error "resume auto: nested job.toml" "step_00000006/job.toml:2:" -- "$EXA" train deeprun.toml --resume auto --set train.steps=8 --plain

# COMPLETE replaced by a FIFO: every reader refuses it at once (no hang).
cp -r $C/step_00000006 fifo_ckpt && rm fifo_ckpt/COMPLETE && mkfifo fifo_ckpt/COMPLETE
expect_error "verify: FIFO COMPLETE" "fifo_ckpt/COMPLETE is a FIFO (named pipe), expected a regular file" -- "$EXA" checkpoint verify fifo_ckpt
expect_error "sample: FIFO COMPLETE" "is a FIFO (named pipe), expected a regular file" -- "$EXA" sample fifo_ckpt --prompt hi
expect_error "export: FIFO COMPLETE" "is a FIFO (named pipe), expected a regular file" -- "$EXA" export fifo_ckpt --out x
cp -r run fiforun && rm fiforun/checkpoints/step_00000006/COMPLETE && mkfifo fiforun/checkpoints/step_00000006/COMPLETE
sed 's|run_dir = "run"|run_dir = "fiforun"|' tiny.toml > fiforun.toml
expect_ok "resume auto skips a FIFO COMPLETE" "COMPLETE is a FIFO (named pipe)" -- "$EXA" train fiforun.toml --resume auto --set train.steps=8 --plain

# trainer_state.json crafted: step 2^62, step -5, a cursor one window short of the end.
craft_state() {  # craft_state NAME PYTHON-EDIT-OF-s
  rm -rf "$1" && cp -r run "$1"
  python3 -c "import json; p='$1/checkpoints/step_00000006/trainer_state.json'; s = json.load(open(p)); $2; json.dump(s, open(p, 'w'))"
  recheck "$1/checkpoints/step_00000006"
  sed "s|run_dir = \"run\"|run_dir = \"$1\"|" tiny.toml > "$1.toml"
}
craft_state st62 's["step"] = 2**62'
expect_error "resume: step 2^62" 'trainer_state.json: "step" = 4611686018427387904: expected an integer in [0, 1099511627776]' -- "$EXA" train st62.toml --resume st62/checkpoints/step_00000006 --set train.steps=8
craft_state stneg 's["step"] = -5'
expect_error "resume: step -5" 'trainer_state.json: "step" = -5: expected an integer in [0, 1099511627776]' -- "$EXA" train stneg.toml --resume stneg/checkpoints/step_00000006 --set train.steps=8
craft_state stshort 'w = s["data_cursor"]["train_windows"]; s["data_cursor"]["position"] = w - 1 if (w - 1) % 2 else w - 2'
expect_error "resume: cursor one window short" 'data cursor "position" = ' -- "$EXA" train stshort.toml --resume stshort/checkpoints/step_00000006 --set train.steps=20
expect_error "resume: step beyond [train] steps" 'trainer_state.json step = 6, beyond --set train.steps=4: [train] steps = 4' -- "$EXA" train tiny.toml --resume $C/step_00000006 --set train.steps=4

# The same checks on 2 ranks (one Session for 1..N ranks: every rank checks the trainer state; the
# run_dir verdict is rank 0's, said once).
if command -v mpirun > /dev/null; then
  MPI=(mpirun --allow-run-as-root --oversubscribe -np 2)
  expect_error "2 ranks: resume step beyond [train] steps" 'trainer_state.json step = 6, beyond --set train.steps=4: [train] steps = 4' \
    -- "${MPI[@]}" "$EXA" train tiny.toml --plain --resume $C/step_00000006 --set train.steps=4
  expect_error "2 ranks: cursor one window short" 'data cursor "position" = ' \
    -- "${MPI[@]}" "$EXA" train stshort.toml --plain --resume stshort/checkpoints/step_00000006 --set train.steps=20
  expect_error "2 ranks: step 2^62" '"step" = 4611686018427387904: expected an integer in [0, 1099511627776]' \
    -- "${MPI[@]}" "$EXA" train st62.toml --plain --resume st62/checkpoints/step_00000006 --set train.steps=8
  expect_error "2 ranks: run_dir in /proc" '[train] run_dir = "/proc/exatrain-run": cannot create the directory' \
    -- "${MPI[@]}" "$EXA" train tiny.toml --plain --set train.run_dir=/proc/exatrain-run
else
  echo "skipped: the 2-rank cases (no mpirun)"
fi

# model.safetensors crafted: a slice offset of 2^36; NaN weights.
rm -rf slice && cp -r $C/step_00000006 slice
python3 - slice/model.safetensors <<'PY'
import json, struct, sys
p = sys.argv[1]; b = open(p, "rb").read(); n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n]); s = json.loads(h["__metadata__"]["exatrain.slices"])
s["wte.weight"]["offset"] = [2**36, 0]; h["__metadata__"]["exatrain.slices"] = json.dumps(s)
t = json.dumps(h).encode(); t += b" " * ((8 - len(t) % 8) % 8)
open(p, "wb").write(struct.pack("<Q", len(t)) + t + b[8 + n:])
PY
recheck slice
expect_error "export: slice offset 2^36" 'exatrain.slices of tensor "wte.weight": the slice of shape [256, 16] at offset [68719476736, 0] does not fit' -- "$EXA" export slice --out sliced
rm -rf nan && cp -r $C/step_00000006 nan
python3 - nan/model.safetensors <<'PY'
import json, struct, sys
p = sys.argv[1]; b = bytearray(open(p, "rb").read()); n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n]); begin = h["ln_f.weight"]["data_offsets"][0]
b[8 + n + begin:8 + n + begin + 4] = struct.pack("<f", float("nan"))
open(p, "wb").write(bytes(b))
PY
recheck nan
expect_error "sample: NaN weights" 'ln_f.weight: 1 of 16 values are NaN or Inf (first at element 0)' -- "$EXA" sample nan --prompt line --tokens 2
expect_error "export: NaN weights" 'pass --allow-nonfinite to export them anyway' -- "$EXA" export nan --out nanout
expect_ok "export --allow-nonfinite warns" 'WARNING: exporting them anyway' -- "$EXA" export nan --out nanout --allow-nonfinite

# job.toml crafted to describe another model than the weights: sample refuses before allocating,
# export names the tensor whose shape disagrees.
rm -rf otherjob && cp -r $C/step_00000006 otherjob
sed -i 's/^ffn_hidden = 64$/ffn_hidden = 32/' otherjob/job.toml && recheck otherjob
expect_error "sample: job.toml of another model" 'otherjob: job.toml describes a model of' -- "$EXA" sample otherjob --prompt line
expect_error "export: job.toml of another model" 'export: tensor "h.0.mlp.fc1.weight" has shape [64, 16], but the checkpoint'"'"'s job.toml implies [32, 16]' \
  -- "$EXA" export otherjob --format hf --out otherout

# Every checkpoint incomplete: the restart moves them aside (kept) instead of overwriting them.
rm -rf inc && cp -r run inc && rm inc/checkpoints/step_*/COMPLETE
sed 's|run_dir = "run"|run_dir = "inc"|' tiny.toml > inc.toml
expect_ok "resume auto with only incomplete checkpoints" "moved inc/checkpoints/step_00000006 aside to inc/checkpoints/step_00000006.incomplete" \
  -- "$EXA" train inc.toml --resume auto --plain
[ -f inc/checkpoints/step_00000006.incomplete/model.safetensors ] && [ -f inc/checkpoints/step_00000006/COMPLETE ] \
  && cmp -s inc/checkpoints/step_00000006.incomplete/model.safetensors run/checkpoints/step_00000006/model.safetensors \
  && echo "ok: incomplete checkpoints kept intact" || fail "incomplete checkpoints not kept: $(ls inc/checkpoints)"

# Leftover temporary directories of interrupted saves are removed at start.
rm -rf tmps && cp -r run tmps
for p in 11 12 13 14 15; do mkdir -p tmps/checkpoints/.tmp-step_00000008-$p && head -c 100000 /dev/zero > tmps/checkpoints/.tmp-step_00000008-$p/model.safetensors; done
sed 's|run_dir = "run"|run_dir = "tmps"|' tiny.toml > tmps.toml
expect_ok "leftover .tmp-* removed at start" "removed 5 temporary directories of interrupted checkpoint saves (0.5 MB)" \
  -- "$EXA" train tmps.toml --resume auto --set train.steps=8 --plain
[ -z "$(ls -A tmps/checkpoints | grep '^\.tmp-')" ] && echo "ok: no .tmp-* left" || fail ".tmp-* left: $(ls -A tmps/checkpoints)"

# Unwritable or invalid run_dir / --out: the key or option and the path are named.
touch a_file
expect_error "run_dir in /proc" '[train] run_dir = "/proc/exatrain-run": cannot create the directory' -- "$EXA" train tiny.toml --set train.run_dir=/proc/exatrain-run
expect_error "run_dir is a file" '[train] run_dir = "a_file/run": cannot create the directory' -- "$EXA" train tiny.toml --set 'train.run_dir="a_file/run"'
expect_error "run_dir empty" '[train] run_dir = "": expected a non-empty string' -- "$EXA" train tiny.toml --set 'train.run_dir=""'
expect_error "export --out in /proc" 'export --out = "/proc/exatrain-out": cannot create the directory' -- "$EXA" export $C/step_00000006 --out /proc/exatrain-out
expect_error "export --out is a file" 'export --out = "a_file" exists but is not a directory' -- "$EXA" export $C/step_00000006 --out a_file
expect_error "prepare --out in /proc" 'data prepare --out = "/proc/exatrain-data": cannot create the directory' -- "$EXA" data prepare --input text.txt --out /proc/exatrain-data --tokenizer byte

# `data prepare` on one huge line stays within its memory bound (docs/data.md): peak RSS measured.
python3 -c "import sys; sys.stdout.write('abcdefgh ' * ((48 << 20) // 9))" > oneline.txt
peak=$(python3 - "$EXA" <<'PY'
import resource, subprocess, sys
subprocess.run([sys.argv[1], "data", "prepare", "--input", "oneline.txt", "--out", "oneline", "--tokenizer", "byte"],
               check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024)
PY
)
if [ -n "$peak" ] && [ "$peak" -lt 200 ]; then echo "ok: prepare of a 48 MB line peaked at $peak MB (< 200)"; else fail "prepare of a 48 MB line peaked at ${peak:-?} MB"; fi

echo "$failures failed"
[ $failures -eq 0 ]
