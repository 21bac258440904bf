#!/usr/bin/env bash
# bench/gpu/run.sh: build, test and measure the CUDA backend in one call on a GPU machine (issue 13;
# docs/cuda.md). Run from the repository root: `bash bench/gpu/run.sh`. Budget: under 8 minutes
# on one H100/H200 with 16 cores (each stage has its own timeout; the total is printed).
#   1. binaries: configure + build (EXATRAIN_CUDA=ON, build-gpu/) exatrain, test_backend,
#      test_model, bench_gpu; or, with EXA_BUNDLE=FILE.tar.xz, unpack a bundle made elsewhere by
#      bench/gpu/bundle.sh (a GPU machine without this project's Debian packages: the binaries and
#      their libraries travel, NCCL and cuBLASLt are the machine's own)
#   2. op tests: every per-op test on the "cuda" backend (against double references), the half
#      GEMM, the CUDA-only checks, each test in its own process (a sticky CUDA error in one cannot
#      fail the rest), with CUDA_LAUNCH_BLOCKING=1 so an error names its op; the 1-GPU-vs-CPU
#      model equivalence; compute-sanitizer memcheck of a tiny model's training (tests/cuda), memcheck
#      and racecheck of the fused attention's kernels
#   3. bench_gpu --profile: each op's share of GPT-2 124M's bf16 step; then bench_gpu: the cuBLASLt bf16 and fp32 GEMM rates, GPT-2 124M / 350M / 774M training steps
#      (tokens/s, MFU against 989 TFLOP/s bf16 and 67 TFLOP/s fp32)
#   4. PyTorch on the same shapes (fp32 and bf16 autocast), when torch with CUDA is importable
#   5. `exatrain predict` for this GPU (from nvidia-smi's name, or EXA_DEVICE) beside each
#      measurement
# Knobs (environment): MODELS=124m,350m,774m  PRECISIONS=fp32,bf16  BATCH=8  SEQ=1024  STEPS=3
#   EXA_DEVICE=(from the GPU's name)  JOBS=$(nproc)  EXA_BUNDLE=  STAGES=build,ops,model,profile,bench,tf32,torch,predict,memcheck
# Every stage that cannot run fails loudly with the reason; a test failure fails the script (after
# the measurements, so one call still brings every figure back). Logs go to $OUT.
set -uo pipefail
start=$(date +%s)
MODELS=${MODELS:-124m,350m,774m} PRECISIONS=${PRECISIONS:-fp32,bf16} BATCH=${BATCH:-8} SEQ=${SEQ:-1024} STEPS=${STEPS:-3}
JOBS=${JOBS:-$(nproc)} STAGES=${STAGES:-build,ops,model,profile,bench,tf32,torch,predict,memcheck}
BUILD=${BUILD:-build-gpu}
OUT=${OUT:-$BUILD/gpu-results}
failures=()
stage() { echo; echo "=== [$(( $(date +%s) - start )) s] $*"; }
die() { echo "FATAL: $*" >&2; exit 1; }
want() { [[ ",$STAGES," == *",$1,"* ]]; }

{ [ -f CMakeLists.txt ] && [ -d src/backend/cuda ]; } || die "run from the repository root (bash bench/gpu/run.sh)"
mkdir -p "$OUT"

stage "device"
gpu_name=""
if command -v nvidia-smi > /dev/null; then
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv || die "nvidia-smi failed"
  gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
else
  echo "nvidia-smi not found: the device is named by the CUDA runtime below"
fi
case "$gpu_name" in
  *H200*) default_device=h200 ;; *"H100 96GB"*) default_device=h100-96g ;; *H100*) default_device=h100-sxm ;;
  *) default_device=h200 ;;
esac
EXA_DEVICE=${EXA_DEVICE:-$default_device}
echo "catalog device for predict: $EXA_DEVICE"

# The libraries a binary needs at run time: the bundle's own, then the machine's NCCL and cuBLASLt.
lib_dir_of() {  # the folder of the first file named $1 under the usual CUDA and Python places
  local f
  f=$(find /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local /opt /usr/lib -name "$1" -print -quit 2> /dev/null)
  [ -z "$f" ] || dirname "$f"
}
if [ -n "${EXA_BUNDLE:-}" ]; then
  stage "binaries: unpacking $EXA_BUNDLE (made by bench/gpu/bundle.sh)"
  B=/tmp/exa-bundle
  rm -rf "$B" && mkdir -p "$B" && tar -C "$B" -xJf "$EXA_BUNDLE" || die "cannot unpack $EXA_BUNDLE"
  triplet=$(cat "$B/ompi/triplet") && [ -n "$triplet" ] || die "$EXA_BUNDLE has no ompi/triplet: make it with bench/gpu/bundle.sh"
  # Open MPI finds its components and help files at the paths it was built with; put them there
  # only where the machine has none (a singleton MPI_Init: `exatrain train` without mpirun).
  [ -e "/usr/lib/$triplet/openmpi" ] || { mkdir -p "/usr/lib/$triplet" && cp -a "$B/ompi/lib-openmpi" "/usr/lib/$triplet/openmpi"; }
  [ -e /usr/share/openmpi ] || cp -a "$B/ompi/share-openmpi" /usr/share/openmpi
  nccl_dir=$(lib_dir_of libnccl.so.2) cublas_dir=$(lib_dir_of libcublasLt.so.13)
  echo "NCCL: ${nccl_dir:-not found}  cuBLASLt: ${cublas_dir:-not found}"
  [ -n "$nccl_dir" ] && [ -n "$cublas_dir" ] || die "libnccl.so.2 or libcublasLt.so.13 not found on this machine"
  export LD_LIBRARY_PATH="$B/lib:$nccl_dir:$cublas_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  BIN=$B/bin TEST_BACKEND=$B/bin/test_backend TEST_MODEL=$B/bin/test_model BENCH=$B/bin/bench_gpu
  # A singleton MPI_Init without Open MPI's daemon, shared memory and loopback only, as root.
  export OMPI_MCA_ess_singleton_isolated=1 OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader \
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mca_base_component_show_load_errors=0
  for b in "$BIN"/*; do ldd "$b" | grep "not found" && die "a library of $b is missing (above)"; done
else
  NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
  [ -x "$NVCC" ] || die "nvcc not found (PATH, /usr/local/cuda/bin): the CUDA toolkit is needed to build the backend"
  command -v cmake > /dev/null || die "cmake not found"
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
  BIN=$BUILD TEST_BACKEND=$BUILD/tests/test_backend TEST_MODEL=$BUILD/tests/test_model BENCH=$BUILD/bench/bench_gpu
fi
EXA=$BIN/exatrain

# op_tests LABEL FILTER: each test_backend test matching FILTER in its own process (4 at a time),
# under the environment the caller exported; failures' logs appended to $OUT/ops_failed.log.
op_tests() {
  local label=$1 filter=$2 passed=0 skipped=0 failed=() t f tests logs
  mapfile -t tests < <("$TEST_BACKEND" --gtest_list_tests --gtest_filter="$filter" |
    awk '/^[^ ]/ {suite=$1} /^  / {print suite $1}')
  if [ ${#tests[@]} -eq 0 ]; then  # the binary did not start, or the filter matched nothing
    echo "FAIL: $label: no test listed ($TEST_BACKEND --gtest_list_tests --gtest_filter='$filter')"
    failures+=("$label (none listed)"); return
  fi
  logs=$(mktemp -d)
  export TEST_BACKEND logs
  printf '%s\n' "${tests[@]}" | timeout 150 xargs -P 4 -I{} bash -c \
    'f=$logs/$(echo "{}" | tr / _); CUDA_LAUNCH_BLOCKING=1 timeout 90 "$TEST_BACKEND" --gtest_filter="{}" > "$f.log" 2>&1; echo $? > "$f.rc"'
  for t in "${tests[@]}"; do
    f=$logs/$(echo "$t" | tr / _)
    [ -f "$f.rc" ] || echo 124 > "$f.rc"  # not reached within the stage's 150 s
    if [ "$(cat "$f.rc")" != 0 ]; then failed+=("$t"); { echo "----- $label: $t: exit $(cat "$f.rc")"; tail -60 "$f.log"; } >> "$OUT/ops_failed.log"
    elif grep -q "SKIPPED \]" "$f.log"; then
      skipped=$((skipped + 1)); [ $skipped -gt 1 ] || echo "first skip: $t: $(grep -m1 -iE "skip|no CUDA" "$f.log")"
    else passed=$((passed + 1)); fi
  done
  echo "$label: ${#tests[@]} run, $passed passed, $skipped skipped, ${#failed[@]} failed"
  for t in "${failed[@]}"; do
    echo "FAIL: $t: $(grep -m2 -E "Failure|error|what\(\)|Expected|CUDA|cuda" "$logs/$(echo "$t" | tr / _).log" | tr '\n' ' ' | cut -c1-300)"
  done
  [ ${#failed[@]} -eq 0 ] || failures+=("$label (${#failed[@]}; $OUT/ops_failed.log)")
  # A GPU that nvidia-smi shows but the tests do not see is a failure, not a skip.
  if [ -n "$gpu_name" ] && grep -l "no CUDA device visible" "$logs"/*.log > /dev/null 2>&1; then
    echo "FAIL: nvidia-smi shows $gpu_name but tests skipped with 'no CUDA device visible'"; failures+=("GPU not visible to the tests")
  fi
}

if want ops; then
  stage "op tests on the GPU, one process each"
  # Per-op harness instances on "cuda" (names end in /cuda), the half GEMM on every backend, the CUDA-only checks.
  op_tests "op tests" '*/cuda:CudaOnly*:CudaBackend*'
fi

if want model; then
  stage "1 GPU against the CPU backend on the same weights"
  # Logs of passing checks stay in /tmp ($OUT brings back 8 files at most on the device tool).
  if CUDA_LAUNCH_BLOCKING=1 timeout 90 "$TEST_MODEL" --gtest_filter='GptCuda*' > /tmp/model_equivalence.log 2>&1; then
    grep -E "OK \]|SKIPPED" /tmp/model_equivalence.log
  else
    cp /tmp/model_equivalence.log "$OUT/"
    echo "FAIL: model equivalence:"; grep -E "Failure|error|Expected|Which is|FAILED" "$OUT/model_equivalence.log" | head -20
    failures+=(model_equivalence)
  fi
fi

# bench LOG LABEL LIMIT ARGS...: one bench_gpu run (the caller's environment prefix applies), its
# output appended to LOG and its RESULT lines shown. A run that fails, or reports a model that failed
# (bench_gpu goes on after one that runs out of memory, say: "RESULT model=... failed: ..."), fails
# the script.
bench() {
  local log=$1 label=$2 limit=$3 out
  shift 3
  out=$(timeout "$limit" "$BENCH" --batch "$BATCH" --seq "$SEQ" "$@" 2>&1) ||
    { echo "FAIL: bench_gpu ($label)"; failures+=("bench_gpu ($label)"); }
  echo "$out" >> "$log"
  grep -E "^RESULT|bench_gpu:" <<< "$out"
  if grep -q "^RESULT model=.* failed:" <<< "$out"; then failures+=("bench_gpu ($label): a model failed"); fi
}

if want profile; then
  stage "bench_gpu --profile: the GPU time of each op of GPT-2 124M's bf16 steps"
  profile_args=(--models 124m --precisions bf16 --batch "$BATCH" --seq "$SEQ" --steps 2 --gemm 4096 --profile)
  timeout 100 "$BENCH" "${profile_args[@]}" 2>&1 | tee "$OUT/profile.log" | sed -n '/^profile of/,$p' ||
    failures+=(profile)
  echo "--- the same without the fused attention (EXATRAIN_CUDA_FLASH=0, EXATRAIN_CUDA_TF32=attention: run 4's best)"
  EXATRAIN_CUDA_FLASH=0 EXATRAIN_CUDA_TF32=attention timeout 100 "$BENCH" "${profile_args[@]}" 2>&1 |
    tee "$OUT/profile_unfused.log" | sed -n '/^profile of/,$p' || failures+=(profile_unfused)
fi

if want bench; then
  stage "bench_gpu: GEMM rates and GPT-2 training steps ($PRECISIONS)"
  bench "$OUT/bench_gpu.log" default 200 --models "$MODELS" --precisions "$PRECISIONS" --steps "$STEPS"
fi

if want tf32; then
  stage "bench_gpu: fp32 on TF32 (EXATRAIN_CUDA_TF32=1); bf16 unfused (EXATRAIN_CUDA_FLASH=0, TF32 attention)"
  args=(--models "$MODELS" --steps "$STEPS" --gemm 4096)
  EXATRAIN_CUDA_TF32=1 bench "$OUT/bench_tf32.log" "TF32" 100 "${args[@]}" --precisions fp32
  EXATRAIN_CUDA_FLASH=0 EXATRAIN_CUDA_TF32=attention bench "$OUT/bench_tf32.log" "unfused TF32 attention" 100 \
    "${args[@]}" --precisions bf16
  echo "--- and the vocabulary itself padded to 50304 (the logits' rows are padded to 50304 either way: Gpt::logits_ld)"
  bench "$OUT/bench_tf32.log" "vocab 50304" 100 "${args[@]}" --precisions bf16 --vocab 50304
fi

if want torch; then
  stage "PyTorch on the same shapes"
  if env -u LD_LIBRARY_PATH python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2> /dev/null; then
    env -u LD_LIBRARY_PATH PYTHONUNBUFFERED=1 timeout 100 python3 bench/gpu/torch_gpt2.py --models "$MODELS" --batch "$BATCH" \
      --seq "$SEQ" --steps "$STEPS" 2>&1 | tee "$OUT/torch.log" | grep -E "RESULT|SKIP|torch " ||
      echo "torch run failed or timed out ($OUT/torch.log)"
  else
    echo "SKIP: PyTorch with CUDA is not importable here (python3 -c 'import torch; torch.cuda.is_available()')"
  fi
fi

if want predict; then
  stage "exatrain predict for $EXA_DEVICE beside each measurement"
  preset_of() { case $1 in 124m) echo gpt2 ;; 350m) echo gpt2-medium ;; 774m) echo gpt2-large ;; *) echo "?" ;; esac; }
  for m in ${MODELS//,/ }; do
    [ "$(preset_of "$m")" != "?" ] || die "MODELS: '$m' is not one of 124m, 350m, 774m"
    for precision in fp32 bf16; do
      job=/tmp/predict_${m}_$precision.toml
      printf '[model]\npreset = "%s"\nseq_len = %s\n[machine]\npreset = "eos"\ndevice = "%s"\n[parallel]\ngpus = 1\ntp = 1\npp = 1\nmicro_batch = %s\nglobal_batch = %s\nrecompute = "none"\nzero = 0\n[train]\nprecision = "%s"\n' \
        "$(preset_of "$m")" "$SEQ" "$EXA_DEVICE" "$BATCH" "$BATCH" "$precision" > "$job"
      line=$("$EXA" predict "$job" 2>&1 | grep -m1 "^step") || line="predict failed: $("$EXA" predict "$job" 2>&1 | tail -1)"
      measured=$(grep "RESULT model=$m precision=$precision " "$OUT/bench_gpu.log" 2>/dev/null |
        grep -oE "tokens_per_s=[0-9]+|not measured.*" || echo "tokens_per_s=? (no bench_gpu line)")
      echo "$m $precision: predicted [$line] | measured $measured"
    done
  done
fi

if want memcheck; then
  stage "compute-sanitizer memcheck of a tiny model's training (tests/cuda/cuda_cli.sh)"
  timeout 100 bash tests/cuda/cuda_cli.sh memcheck "$EXA" /tmp/exa-memcheck > /tmp/memcheck.log 2>&1; rc=$?
  tail -4 /tmp/memcheck.log
  [ $rc -eq 0 ] || [ $rc -eq 77 ] || { cp /tmp/memcheck.log "$OUT/"; failures+=("memcheck (exit $rc)"); }
  stage "bf16 training on the GPU against the CPU backend (tests/cuda/cuda_cli.sh bf16)"
  timeout 100 bash tests/cuda/cuda_cli.sh bf16 "$EXA" /tmp/exa-bf16 2>&1 | tail -3; rc=${PIPESTATUS[0]}
  [ "$rc" -eq 0 ] || [ "$rc" -eq 77 ] || failures+=("bf16 against the CPU (exit $rc)")
  # The fused attention's kernels (their shared memory shared by a block's warps): memcheck, and
  # racecheck for shared-memory hazards between threads (the emulated test only races on the host).
  san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  for tool in memcheck racecheck; do
    stage "compute-sanitizer $tool of the fused attention (CudaOnly.FusedAttentionMatches*)"
    timeout 150 "$san" --tool "$tool" --error-exitcode 3 "$TEST_BACKEND" --gtest_filter='CudaOnly.FusedAttentionMatches*' \
      > "/tmp/flash_$tool.log" 2>&1; rc=$?
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED" "/tmp/flash_$tool.log" | tail -3
    [ $rc -eq 0 ] || { cp "/tmp/flash_$tool.log" "$OUT/"; failures+=("fused attention $tool (exit $rc)"); }
  done
fi

stage "done in $(( $(date +%s) - start )) s"
echo "logs: $OUT"
if [ ${#failures[@]} -gt 0 ]; then echo "FAILED: ${failures[*]}"; exit 1; fi
echo "all stages ran and passed"
