#!/usr/bin/env bash
# fuzz/run.sh BUILD_DIR SECONDS [HARNESS...]: runs each libFuzzer harness (default: all of them)
# for SECONDS on a scratch copy of its seed corpus (fuzz/corpus/NAME, plus fuzz/regressions/NAME),
# so the committed corpus is not changed; prints one line per harness (executions, execs/s,
# corpus size, coverage) and fails if any harness finds a crash, a sanitizer report, a leak, a
# timeout or an out-of-memory. Findings are kept under BUILD_DIR/fuzz-findings/NAME/.
set -uo pipefail
build=$1 seconds=$2; shift 2
here=$(cd "$(dirname "$0")" && pwd)
harnesses=("$@")
[ ${#harnesses[@]} -eq 0 ] && harnesses=(job safetensors manifest shard trainer_state tokenizer metrics csv pairs)
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:symbolize=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export OMP_NUM_THREADS=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failed=0
printf '%-14s %10s %8s %12s %8s  %s\n' harness execs exec/s corpus cov result
for h in "${harnesses[@]}"; do
  bin=$build/fuzz/fuzz_$h
  [ -x "$bin" ] || { echo "fuzz/run.sh: $bin is not built (make fuzz-build)"; exit 2; }
  mkdir -p "$work/$h" "$build/fuzz-findings/$h"
  dict=()
  [ -f "$here/dicts/$h.dict" ] && dict=(-dict="$here/dicts/$h.dict")
  seeds=("$here/corpus/$h")
  [ -d "$here/regressions/$h" ] && seeds+=("$here/regressions/$h")
  log=$build/fuzz-findings/$h/log.txt
  # -timeout: one input taking 10 s is a hang; -rss_limit_mb: 2 GB is an out-of-memory finding.
  "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=131072 -print_final_stats=1 \
    -artifact_prefix="$build/fuzz-findings/$h/" "${dict[@]}" "$work/$h" "${seeds[@]}" > "$log" 2>&1
  rc=$?
  execs=$(grep -oP 'stat::number_of_executed_units:\s*\K[0-9]+' "$log" | tail -1)
  rate=$(grep -oP 'stat::average_exec_per_sec:\s*\K[0-9]+' "$log" | tail -1)
  cov=$(grep -oP 'cov: \K[0-9]+' "$log" | tail -1)
  files=$(find "$work/$h" -type f | wc -l)
  bytes=$(du -sb "$work/$h" | cut -f1)
  if [ $rc -eq 0 ]; then result=ok; else result="FINDING (exit $rc; see $log)"; failed=1; fi
  printf '%-14s %10s %8s %6s/%-5s %8s  %s\n' "$h" "${execs:-?}" "${rate:-?}" "$files" "$((bytes / 1024))K" "${cov:-?}" "$result"
  if [ $rc -ne 0 ]; then grep -E 'ERROR|SUMMARY|fuzz: |Test unit written|ParseDictionaryFile|#[0-9]+ 0x' "$log" | head -30; fi
done
exit $failed
