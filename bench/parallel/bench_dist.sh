#!/usr/bin/env bash
# Side by side on this machine: a small GPT (4 layers, hidden 256, seq 128, vocab 4096, global batch
# 8 sequences, micro-batch 2) trained by 1 rank x 2 threads and by 2 ranks x 1 thread as dp2, tp2
# and pp2 (1F1B), each with its measured breakdown next to the planner's prediction for `local`.
#   bench/parallel/bench_dist.sh [build/bench/parallel/bench_dist] [steps]
set -eu
BIN=${1:-build/bench/parallel/bench_dist}
STEPS=${2:-8}
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
MPI=(mpirun --allow-run-as-root --oversubscribe --bind-to none)
OMP_NUM_THREADS=2 "${MPI[@]}" -np 1 "$BIN" --threads 2 --steps "$STEPS"
for split in "--dp 2" "--tp 2" "--pp 2"; do
  OMP_NUM_THREADS=1 "${MPI[@]}" -np 2 "$BIN" $split --threads 1 --steps "$STEPS"
done
