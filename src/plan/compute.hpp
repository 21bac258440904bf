// The compute time of one micro-batch on one rank: every GEMM of a transformer layer at the
// device's rate for its shape, attention by its kernel, element-wise work and fp8 casts as counted
// bytes at the device's memory bandwidth (docs/planner.md "Compute"). Pure functions.
//
// GEMM rate = peak(precision) * gemm_efficiency * sustained * shape(M, N, K) / shape(best), where
// gemm_efficiency is the device's measured large-GEMM fraction (the MAMF ceiling, catalog data, at
// its best shape) and shape() its tile model: the fill of the last tile in M and in N (exact for the
// device's tile), the last wave of tiles over the device's compute units (mean field: a wave of W
// tiles per unit keeps W / (W + 1/2) busy on average, as cuBLAS picks among tile shapes), and the
// pipeline's fixed cost per tile of about k0 of K (K / (K + k0)). A device measured by `exatrain
// profile` (a CPU) has a measured smooth model instead: 1 / (1 + dim_half / width) / (1 + tokens_half
// / tokens). Every GEMM is also bounded by its HBM traffic (roofline).
#pragma once
#include <array>
#include <string>

#include "catalog/device.hpp"
#include "job/job.hpp"
#include "plan/plan.hpp"

namespace exatrain::plan {

struct Calibration;

// One GEMM C[M x N] = A[M x K] B[K x N], `batch` times; `tokens_in_k`: the token dimension is K
// (a weight gradient) rather than M.
struct Gemm {
  double M = 0, N = 0, K = 0, batch = 1;
  bool tokens_in_k = false;
};
// Seconds for the GEMM at `precision` (fp8: the fp8 peak at c.fp8_relative of the bf16 fraction).
double gemm_seconds(const Device& d, Precision precision, const Gemm& g, const Calibration& c);
// FLOP/s of that GEMM (2 M N K batch / gemm_seconds).
double gemm_rate(const Device& d, Precision precision, const Gemm& g, const Calibration& c);
// The shape factor alone (1 at the device's best shape), for reports and tests.
double gemm_shape_efficiency(const Device& d, const Gemm& g, const Calibration& c);

struct LayerTime {
  double fwd = 0, bwd = 0, recompute = 0;  // compute incl. memory-bound work
  double attention_fwd = 0;                // part of fwd: the attention core (overlaps cp)
  // The linear layers' GEMMs: what tensor-parallel communication overlaps with (tp_comm_overlap);
  // linear_recompute: those full recomputation re-runs (linear_fwd, less the last linear's with
  // Plan::recompute_early_stop; 0 for the other modes).
  double linear_fwd = 0, linear_bwd = 0, linear_recompute = 0;
  // Op-level checkpointing: the recomputed GEMMs that consume the outputs of the two all-gathers its
  // recompute re-runs (the attention's, the MLP's), what each hides under with tp_comm_overlap. With
  // SwiGLU the k and up projections (every second matmul of q, k, v, o, gate, up, down is
  // recomputed); with GELU and its fused QKV (as plan/flops.hpp counts it) none: the recomputed o
  // and fc2 read no gathered input (0).
  std::array<double, 2> op_gather_consumers{0, 0};
  // Where the layer's time goes, forward + backward + recompute: linear-layer GEMMs, the attention
  // core, element-wise kernels, fp8 casts (sums to total()).
  double linear = 0, attention = 0, elementwise = 0, casts = 0;
  double total() const { return fwd + bwd + recompute; }
};
// One transformer layer, one micro-batch, one rank.
LayerTime layer_time(const ModelSpec& m, const Plan& p, const Device& d, const Calibration& c);
// The LM head (logits GEMMs, cross entropy passes over fp32 logits) of one micro-batch on the
// last pipeline rank, forward and backward.
double head_time(const ModelSpec& m, const Plan& p, const Device& d, const Calibration& c);
// The embedding lookup's forward and backward of one micro-batch on the first rank.
double embedding_time(const ModelSpec& m, const Plan& p, const Device& d);

// Why the plan's kernels cannot be modelled on the device, or "": a fused attention kernel the
// catalog has no figure for on it (flash3 off Hopper, flash2 on a V100), rowwise-scaled fp8.
std::string kernel_problem(const Plan& p, const Device& d);

// The fraction of the counted s x s attention square a causal kernel executes: (s + b) / (2 s) for
// query/key blocks of b = 128 (the diagonal blocks run whole).
double causal_share(double seq_len);

}  // namespace exatrain::plan
