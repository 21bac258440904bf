#!/usr/bin/env bash
# End-to-end: `exatrain data prepare` on part of the bundled corpus (BPE and byte), `data verify`,
# determinism of the whole output directory, and the error messages (exit status 1) for a
# missing input and a truncated shard.
set -euo pipefail
EXATRAIN=${1:?usage: cli_test.sh path/to/exatrain}
work=$(mktemp -d /tmp/exatrain-cli-XXXXXX)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

(set +o pipefail; xz -dc corpus/kjv.txt.xz | head -n 2000) > "$work/in.txt"
"$EXATRAIN" data prepare --input "$work/in.txt" --out "$work/a" --vocab-size 500 --shard-tokens 20000 \
  2> "$work/progress.txt" > "$work/out.txt"
grep -q "^prepared $work/a: [0-9]* tokens in [0-9]* shard(s), tokenizer sentencepiece-bpe" "$work/out.txt" \
  || fail "prepare summary: $(cat "$work/out.txt")"
grep -q "^tokenize: .*MB read (100%)" "$work/progress.txt" || fail "no progress: $(cat "$work/progress.txt")"
OMP_NUM_THREADS=1 "$EXATRAIN" data prepare --input "$work/in.txt" --out "$work/b" --vocab-size 500 \
  --shard-tokens 20000 2> /dev/null > /dev/null
(cd "$work/a" && sha256sum -- *) > "$work/a.sums"
(cd "$work/b" && sha256sum -- *) > "$work/b.sums"
cmp -s "$work/a.sums" "$work/b.sums" || fail "two runs differ: $(diff "$work/a.sums" "$work/b.sums")"
[ "$(ls "$work/a" | grep -c '^shard_')" -ge 2 ] || fail "expected several shards"
# The manifest's checksums are those sha256sum computes.
for f in "$work"/a/shard_*.bin; do
  grep -q "$(sha256sum "$f" | cut -d' ' -f1)" "$work/a/manifest.json" || fail "checksum of $f"
done
"$EXATRAIN" data verify "$work/a" | grep -q ": OK: " || fail "verify"
"$EXATRAIN" data prepare --input "$work/in.txt" --out "$work/a" --vocab-size 500 --shard-tokens 20000 \
  --reuse 2> /dev/null | grep -q "^reusing $work/a:" || fail "--reuse did not reuse"

"$EXATRAIN" data prepare --input "$work/in.txt" --out "$work/bytes" --tokenizer byte > /dev/null 2>&1
"$EXATRAIN" data verify "$work/bytes" | grep -q "tokenizer byte (vocab 256)" || fail "byte dataset"

set +e
"$EXATRAIN" data prepare --input "$work/missing.txt" --out "$work/c" 2> "$work/err.txt"
rc=$?
set -e
[ $rc -eq 1 ] || fail "missing input: exit $rc"
grep -q "input $work/missing.txt does not exist" "$work/err.txt" || fail "message: $(cat "$work/err.txt")"

truncate -s 1000 "$work/a/shard_00001.bin"
set +e
"$EXATRAIN" data verify "$work/a" 2> "$work/err.txt"
rc=$?
set -e
[ $rc -eq 1 ] || fail "truncated shard: exit $rc"
grep -q "token shard $work/a/shard_00001.bin is truncated or damaged: 1000 bytes on disk, expected" \
  "$work/err.txt" || fail "message: $(cat "$work/err.txt")"
echo "data_cli: all checks passed"
