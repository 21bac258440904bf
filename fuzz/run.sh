#!/usr/bin/env bash
# fuzz/run.sh BUILD_DIR SECONDS [HARNESS...]: runs each libFuzzer harness (default: all of them)
# for SECONDS on a scratch copy of its seed corpus (fuzz/corpus/NAME, plus fuzz/regressions/NAME),
# so the committed corpus is not changed; prints one line per harness (executions, execs/s,
# corpus size, coverage) and fails if any harness finds a crash, a sanitizer report, a leak, a
# timeout or an out-of-memory. Findings are kept under BUILD_DIR/fuzz-findings/NAME/.
# FUZZ_JOBS harnesses (default: the CPU count) run at once, each single-threaded, so every
# harness still gets SECONDS of one core; each says on stderr when it is done, and the table
# prints at the end in the harnesses' order.
set -uo pipefail
build=$1 seconds=$2; shift 2
here=$(cd "$(dirname "$0")" && pwd)
harnesses=("$@")
[ ${#harnesses[@]} -eq 0 ] && harnesses=(job safetensors manifest shard trainer_state tokenizer metrics csv pairs)
jobs=${FUZZ_JOBS:-$(nproc)}
[[ $jobs =~ ^[1-9][0-9]*$ ]] || { echo "fuzz/run.sh: FUZZ_JOBS must be a positive integer, not '$jobs'"; exit 2; }
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:symbolize=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export OMP_NUM_THREADS=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

for h in "${harnesses[@]}"; do
  [ -x "$build/fuzz/fuzz_$h" ] || { echo "fuzz/run.sh: $build/fuzz/fuzz_$h is not built (make fuzz-build)"; exit 2; }
done

# One harness: fuzzes, then writes its report line (and, on a finding, the log's key lines) to
# $work/NAME.out and its exit status to $work/NAME.rc.
fuzz_one() {
  local h=$1 bin=$build/fuzz/fuzz_$1 log=$build/fuzz-findings/$1/log.txt
  mkdir -p "$work/$h" "$build/fuzz-findings/$h"
  local dict=() seeds=("$here/corpus/$h")
  [ -f "$here/dicts/$h.dict" ] && dict=(-dict="$here/dicts/$h.dict")
  [ -d "$here/regressions/$h" ] && seeds+=("$here/regressions/$h")
  # -timeout: one input taking 10 s is a hang; -rss_limit_mb: 2 GB is an out-of-memory finding.
  "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=131072 -print_final_stats=1 \
    -artifact_prefix="$build/fuzz-findings/$h/" "${dict[@]}" "$work/$h" "${seeds[@]}" > "$log" 2>&1
  local rc=$? result=ok
  local execs rate cov files bytes
  execs=$(grep -oP 'stat::number_of_executed_units:\s*\K[0-9]+' "$log" | tail -1)
  rate=$(grep -oP 'stat::average_exec_per_sec:\s*\K[0-9]+' "$log" | tail -1)
  cov=$(grep -oP 'cov: \K[0-9]+' "$log" | tail -1)
  files=$(find "$work/$h" -type f | wc -l)
  bytes=$(du -sb "$work/$h" | cut -f1)
  [ $rc -eq 0 ] || result="FINDING (exit $rc; see $log)"
  {
    printf '%-14s %10s %8s %6s/%-5s %8s  %s\n' "$h" "${execs:-?}" "${rate:-?}" "$files" "$((bytes / 1024))K" "${cov:-?}" "$result"
    [ $rc -eq 0 ] || grep -E 'ERROR|SUMMARY|fuzz: |Test unit written|ParseDictionaryFile|#[0-9]+ 0x' "$log" | head -30
  } > "$work/$h.out"
  echo $rc > "$work/$h.rc"
}

# xargs -P keeps `jobs` harnesses running (bash's `wait -n` can miss a job when two end together).
export build seconds here work
export -f fuzz_one
printf '%s\0' "${harnesses[@]}" | xargs -0 -P "$jobs" -I{} bash -c 'fuzz_one "$1"; echo "fuzz/run.sh: $1 done" >&2' _ {}

failed=0
printf '%-14s %10s %8s %12s %8s  %s\n' harness execs exec/s corpus cov result
for h in "${harnesses[@]}"; do
  if [ -f "$work/$h.out" ] && [ "$(cat "$work/$h.rc" 2>/dev/null)" = 0 ]; then cat "$work/$h.out"; continue; fi
  failed=1
  if [ -f "$work/$h.out" ]; then cat "$work/$h.out"; else printf '%-14s %s\n' "$h" "NO RESULT (the harness's run ended before writing one)"; fi
done
exit $failed
