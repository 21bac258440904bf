#!/usr/bin/env bash
# bench/gpu/run.sh: build, test and measure the CUDA backend in one call on a GPU machine (issue 13;
# docs/cuda.md). Run from the repository root: `bash bench/gpu/run.sh`. Budget: under 8 minutes
# on one H100/H200 with 16 cores (each stage has its own timeout; the total is printed).
#   1. configure + build (EXATRAIN_CUDA=ON, build-gpu/): exatrain, test_backend, test_model, bench_gpu
#   2. op tests: every per-op test on the "cuda" backend (against double references), the half
#      GEMM, the CUDA-only checks, the 1-GPU-vs-CPU model equivalence; ctest's cuda_* tests
#      (compute-sanitizer memcheck on a tiny model)
#   3. bench_gpu: the cuBLASLt bf16 and fp32 GEMM rates, GPT-2 124M / 350M / 774M training steps
#      in fp32 and bf16 (tokens/s, MFU against 989 TFLOP/s bf16 and 67 TFLOP/s fp32); a bf16 run
#      whose trainer made no 16-bit GEMM (no bf16 mixed precision in this build) says so instead
#   4. PyTorch on the same shapes (fp32 and bf16 autocast), when torch with CUDA is importable
#   5. `exatrain predict` for this GPU (catalog device EXA_DEVICE, default h200) beside each
#      measurement, in fp32 and bf16
# Knobs (environment): MODELS=124m,350m,774m  PRECISIONS=fp32,bf16  BATCH=8  SEQ=1024  STEPS=3
#   EXA_DEVICE=h200  JOBS=$(nproc)
# Every stage that cannot run fails loudly with the reason; a test failure fails the script (after
# the measurements, so one call still brings every figure back).
set -uo pipefail
start=$(date +%s)
MODELS=${MODELS:-124m,350m,774m} PRECISIONS=${PRECISIONS:-fp32,bf16} BATCH=${BATCH:-8} SEQ=${SEQ:-1024} STEPS=${STEPS:-3}
EXA_DEVICE=${EXA_DEVICE:-h200} JOBS=${JOBS:-$(nproc)}
BUILD=${BUILD:-build-gpu}
OUT=${OUT:-$BUILD/gpu-results}
failures=()
stage() { echo; echo "=== [$(( $(date +%s) - start )) s] $*"; }
die() { echo "FATAL: $*" >&2; exit 1; }

{ [ -f CMakeLists.txt ] && [ -d src/backend/cuda ]; } || die "run from the repository root (bash bench/gpu/run.sh)"
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
[ -x "$NVCC" ] || die "nvcc not found (PATH, /usr/local/cuda/bin): the CUDA toolkit is needed to build the backend"
command -v cmake > /dev/null || die "cmake not found"
mkdir -p "$OUT"

stage "device"
if command -v nvidia-smi > /dev/null; then
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv || die "nvidia-smi failed"
else
  echo "nvidia-smi not found: the device is named by the CUDA runtime below"
fi
"$NVCC" --version | tail -2

stage "configure + build ($BUILD, -j$JOBS)"
launcher=()
command -v ccache > /dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DEXATRAIN_CUDA=ON -DCMAKE_CUDA_COMPILER="$NVCC" "${launcher[@]}" \
  > "$OUT/configure.log" 2>&1 || { tail -30 "$OUT/configure.log"; die "configure failed ($OUT/configure.log)"; }
grep "exatrain: CUDA backend" "$OUT/configure.log"
build_t0=$(date +%s)
timeout 300 cmake --build "$BUILD" -j"$JOBS" --target exatrain test_backend test_model bench_gpu > "$OUT/build.log" 2>&1 ||
  { tail -40 "$OUT/build.log"; die "build failed or took over 300 s ($OUT/build.log)"; }
echo "built in $(( $(date +%s) - build_t0 )) s"

stage "op tests on the GPU"
EXA=$BUILD/exatrain
run_test() {  # name, timeout, command...
  local name=$1 limit=$2; shift 2
  if timeout "$limit" "$@" > "$OUT/$name.log" 2>&1; then
    echo "ok: $name ($(grep -cE '^\[       OK \]' "$OUT/$name.log") passed, $(grep -cE '^\[  SKIPPED \]' "$OUT/$name.log") skipped)"
  else
    echo "FAIL: $name (exit $?):"; grep -E "FAILED|Failure|error|SKIPPED" "$OUT/$name.log" | head -30
    failures+=("$name")
  fi
  grep -m3 -A1 "SKIPPED \]" "$OUT/$name.log" | grep -i "no CUDA device" | head -1
}
# Per-op harness instances on "cuda" (names end in /cuda), the half GEMM on every backend, the CUDA-only checks.
run_test op_tests 180 "$BUILD/tests/test_backend" --gtest_filter='*/cuda:HalfOps*:CudaOnly*:CudaBackend*'
run_test model_equivalence 120 "$BUILD/tests/test_model" --gtest_filter='GptCuda*'
(cd "$BUILD" && timeout 300 ctest -R '^cuda_' --output-on-failure) > "$OUT/ctest_cuda.log" 2>&1 ||
  { echo "FAIL: ctest cuda_*"; failures+=(ctest_cuda); }
grep -E "Test +#|tests passed|Skipped|SKIP|ok:" "$OUT/ctest_cuda.log" | head -10

stage "bench_gpu: GEMM rates and GPT-2 training steps ($PRECISIONS)"
timeout 300 "$BUILD/bench/bench_gpu" --models "$MODELS" --precisions "$PRECISIONS" --batch "$BATCH" --seq "$SEQ" --steps "$STEPS" 2>&1 |
  tee "$OUT/bench_gpu.log" | grep -E "RESULT|model |memory|bench_gpu:" ||
  { echo "FAIL: bench_gpu"; tail -20 "$OUT/bench_gpu.log"; failures+=(bench_gpu); }

stage "PyTorch on the same shapes"
if python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2> /dev/null; then
  timeout 150 python3 bench/gpu/torch_gpt2.py --models "$MODELS" --batch "$BATCH" --seq "$SEQ" --steps "$STEPS" 2>&1 |
    tee "$OUT/torch.log" | grep -E "RESULT|SKIP|torch " || echo "torch run failed or timed out ($OUT/torch.log)"
else
  echo "SKIP: PyTorch with CUDA is not importable here (python3 -c 'import torch; torch.cuda.is_available()')"
fi

stage "exatrain predict for $EXA_DEVICE beside each measurement"
preset_of() { case $1 in 124m) echo gpt2 ;; 350m) echo gpt2-medium ;; 774m) echo gpt2-large ;; *) die "model $1" ;; esac; }
for m in ${MODELS//,/ }; do
  for precision in fp32 bf16; do
    job=$OUT/predict_${m}_$precision.toml
    printf '[model]\npreset = "%s"\nseq_len = %s\n[machine]\npreset = "eos"\ndevice = "%s"\n[parallel]\ngpus = 1\ntp = 1\npp = 1\nmicro_batch = %s\nglobal_batch = %s\nrecompute = "none"\nzero = 0\n[train]\nprecision = "%s"\n' \
      "$(preset_of "$m")" "$SEQ" "$EXA_DEVICE" "$BATCH" "$BATCH" "$precision" > "$job"
    line=$("$EXA" predict "$job" 2>&1 | grep -m1 "^step") || line="predict failed: $("$EXA" predict "$job" 2>&1 | tail -1)"
    measured=$(grep "RESULT model=$m precision=$precision " "$OUT/bench_gpu.log" 2>/dev/null |
      grep -oE "tokens_per_s=[0-9]+|not measured.*" || echo "tokens_per_s=? (no bench_gpu line)")
    echo "$m $precision: predicted [$line] | measured $measured"
  done
done

stage "done in $(( $(date +%s) - start )) s"
echo "logs: $OUT"
if [ ${#failures[@]} -gt 0 ]; then echo "FAILED: ${failures[*]}"; exit 1; fi
echo "all stages ran (a bf16 line 'not measured' means the bf16 run made no 16-bit GEMM: docs/cuda.md)"
