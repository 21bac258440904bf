// The optimizer step's time on one rank, per [train] optimizer: the elementwise bytes its update
// streams through HBM (memory bound) and the matrix FLOPs of Muon's Newton-Schulz, Shampoo's factor
// updates, eigendecompositions and preconditioning and SOAP's factors, eigenbases and rotations
// (GEMM bound), counted per parameter entry of the rank's shard (the entries of model/layout.hpp,
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
  double seconds() const { return elementwise_s + matrix_s; }
};
// The optimizer step of pipeline rank `pp_rank` on device d, distributed as stated above.
OptimizerCost optimizer_step_cost(const ModelSpec& m, const Plan& p, const Device& d, const Calibration& c,
                                  int64_t pp_rank);

}  // namespace exatrain::plan
