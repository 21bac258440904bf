// The optimizer step's time on one rank, per [train] optimizer: the elementwise bytes its update
// streams through HBM (memory bound) and the matrix FLOPs of Muon's Newton-Schulz, Shampoo's factor
// updates, eigendecompositions and preconditioning, SOAP's factors, eigenbases and rotations and
// K-FAC's statistics, eigendecompositions and preconditioning (GEMM bound), counted per parameter entry of the rank's shard (the entries of model/layout.hpp,
// at the shard shapes of plan/memory.cpp), and how ZeRO spreads that work over the dp·cp replicas.
// The formulas and their sources: docs/optimizers.md, "What the planner counts".
//
// Distribution (what the runtime does, parallel/zero.hpp and optim/): tensor parallelism: each tp
// rank updates its own shard (per-shard Newton-Schulz, per-shard preconditioners), so the shapes
// below are the shard's. ZeRO 0: every dp·cp replica does all of its stage's work. ZeRO >= 1: the
// replicas split the elementwise work evenly, and an optimizer that needs whole entries
// (OptimizerState::whole_entries) gives each entry one owner (ZeroLayout::aligned), so the
// slowest replica does max(total / (dp·cp), the largest single entry) of each part. The updated
// weights' all-gather is ZeRO's own, already in dp_comm (plan/comm.hpp) for every optimizer:
// nothing is gathered in addition.
//
// Owns: the optimizer term of the time model (predict.cpp puts it in Breakdown::optimizer).
// May use: core/, job/, catalog/, plan/plan.hpp, plan/flops.hpp, plan/predict.hpp (Calibration).
#pragma once
#include <cstdint>
#include <vector>

#include "catalog/device.hpp"
#include "job/job.hpp"
#include "plan/plan.hpp"

namespace exatrain::plan {

struct Calibration;  // plan/predict.hpp

// `count` parameter entries of one shard shape [rows, cols] on a rank (cols = 1 and two_d = false
// for the 1-D norms and biases). layer_matrix: a 2-D weight inside a layer (ParamRole::matrix:
// q, k, v, o, fc1/fc2 or gate/up/down); the other 2-D entries are the embeddings and the head.
struct EntryClass {
  const char* name = "";
  int64_t count = 0, rows = 0, cols = 1;
  bool two_d = false, layer_matrix = false;
  double elements() const { return double(count) * double(rows) * double(cols); }
};

// The entries of pipeline rank `pp_rank`, tensor-parallel rank 0 (the largest vocabulary slice);
// their elements add up to parameters_on_rank(m, p, pp_rank).
std::vector<EntryClass> entry_classes(const ModelSpec& m, const Plan& p, int64_t pp_rank);

// Matrix FLOPs of one step on one [m, n] entry (a multiply-add = 2 FLOPs):
//   Muon, a = min(m, n), b = max(m, n):  ns_steps (4 a^2 b + 2 a^3)
//   Shampoo, per block [r, c] of at most `block` rows and columns:
//     4 (r^2 c + r c^2)  +  (9 + 2) (r^3 + c^3) / frequency
//   SOAP, a side is rotated when it is at most max_dim (L: m, R: n):
//     6 (m^2 n [L] + m n^2 [R])  +  ((2 + 8/3) m^3 + 4 m^2 n [L] + (2 + 8/3) n^3 + 4 m n^2 [R]) / frequency
double muon_flops(int64_t m, int64_t n, int64_t ns_steps);
double shampoo_flops(int64_t m, int64_t n, int64_t block, int64_t frequency);
double soap_flops(int64_t m, int64_t n, int64_t max_dim, int64_t frequency);
// K-FAC (optim/kfac.hpp) on one layer matrix [m = out, n = in] with `tokens` rows (tokens) per
// replica and step: its statistics S_A += x^T x, S_G += dy^T dy (2 tokens (n^2 + m^2)) every
// factor_update_steps, the eigendecompositions of both factors (9 (n^3 + m^3), as Shampoo's count)
// every inv_update_steps, and the preconditioning QG^T g QA, QG V QA^T (4 (m^2 n + m n^2)) every step.
struct KfacFlops {
  double statistics = 0, eigen = 0, precondition = 0;
};
KfacFlops kfac_flops(int64_t m, int64_t n, double tokens, int64_t factor_update_steps, int64_t inv_update_steps);
// K-FAC's communication per step (amortised over its intervals) on one replica of pipeline rank
// pp_rank: the statistics' all-reduce over the dp·cp replicas (the buffer's bytes: every matrix's
// in^2 + out^2 floats, every factor_update_steps) and the bytes it sends point to point: under
// ZeRO 0 with g = grad_worker_fraction·replicas gradient workers, each matrix's eigenbases to the
// g - 1 others every inv_update_steps and its P to the replicas - g others every step, spread
// evenly over the replicas (KAISA's assignment). ZeRO >= 1 sends nothing point to point.
struct KfacBytes {
  double all_reduce = 0, sent = 0;
};
KfacBytes kfac_bytes(const ModelSpec& m, const Plan& p, int64_t pp_rank);
// K-FAC's fp32 memory of matrix side lengths on one replica of pipeline rank pp_rank (what
// optim/kfac.hpp allocates): per layer matrix [out, in] the factors A, G (in^2 + out^2; under ZeRO
// >= 1 only on the matrix's owner: 1/(dp·cp) of them), the eigenbases and eigenvalues
// (in^2 + in + out^2 + out; on its gradient workers: grad_worker_fraction of the matrices under
// ZeRO 0, the owner's share under ZeRO >= 1) and the step's statistics (in^2 + out^2, on every
// replica). 0 for other optimizers.
double kfac_factor_bytes(const ModelSpec& m, const Plan& p, int64_t pp_rank);
// The matrix FLOPs of p.optimizer on one entry of class e (0 for the elementwise optimizers, for
// 1-D entries and, for Muon, for the embeddings and head, which get AdamW).
double entry_matrix_flops(const Plan& p, const EntryClass& e);
// Bytes the elementwise part streams per element of an entry of class e: AdamW's
// c.optimizer_bytes_per_param (28 for fp32 runs), 8 less per fp32 state value it does not keep,
// 8 more per extra pass (docs/optimizers.md).
double elementwise_bytes_per_element(const Plan& p, const EntryClass& e, const Calibration& c);

struct OptimizerCost {
  double elementwise_s = 0, matrix_s = 0;  // on the slowest replica of the rank's stage
  double matrix_flops = 0;                 // of that replica, per step
  double comm_s = 0;                       // the optimizer's own communication (K-FAC's; predict.cpp adds it)
  double seconds() const { return elementwise_s + matrix_s + comm_s; }
};
// The optimizer step of pipeline rank `pp_rank` on device d, distributed as stated above.
OptimizerCost optimizer_step_cost(const ModelSpec& m, const Plan& p, const Device& d, const Calibration& c,
                                  int64_t pp_rank);

}  // namespace exatrain::plan
