#include "plan/optimizer_cost.hpp"

#include "plan/compute.hpp"

#include <algorithm>

#include "job/model_shapes.hpp"
#include "plan/flops.hpp"
#include "plan/predict.hpp"

namespace exatrain::plan {

std::vector<EntryClass> entry_classes(const ModelSpec& m, const Plan& p, int64_t pp_rank) {
  const int64_t tp = p.tp, h = m.hidden, f = m.ffn_hidden;
  const int64_t kv_local = kv_dim_per_rank(m, tp);
  const int64_t up_mats = m.activation == Activation::swiglu ? 2 : 1;
  const int64_t layers = layers_on_rank(m, p, pp_rank);
  const int64_t vocab_rows = vocab_slice(m.vocab, tp, 0).rows;
  std::vector<EntryClass> out;
  auto add = [&](const char* name, int64_t count, int64_t rows, int64_t cols, bool two_d, bool layer_matrix) {
    if (count > 0 && rows > 0) out.push_back({name, count, rows, cols, two_d, layer_matrix});
  };
  // [out, in] as torch.nn.Linear (model/layout.hpp): the column-parallel q, k, v and fc1 (gate, up)
  // hold a block of rows, the row-parallel o_proj and fc2 (down) a block of columns.
  add("q_proj", layers, h / tp, h, true, true);
  add("k_proj v_proj", 2 * layers, kv_local, h, true, true);
  add("o_proj", layers, h, h / tp, true, true);
  add(up_mats == 2 ? "gate_proj up_proj" : "fc1", up_mats * layers, f / tp, h, true, true);
  add(up_mats == 2 ? "down_proj" : "fc2", layers, h, f / tp, true, true);
  // 1-D: the two norms of each layer, and its linear biases as one entry per layer (their sizes
  // only matter for the elementwise bytes).
  add("norms", 2 * layers, norm_parameters(m), 1, false, false);
  if (m.bias) add("biases", layers, (h / tp + 2 * kv_local) + h + up_mats * (f / tp) + h, 1, false, false);
  if (pp_rank == 0) {
    add("wte", 1, vocab_rows, h, true, false);
    if (m.position == Position::learned) add("wpe", 1, m.seq_len, h, true, false);
  }
  if (pp_rank == p.pp - 1) {
    add("ln_f", 1, norm_parameters(m), 1, false, false);
    // The untied head, or the head stage's own copy of the tied embedding (pp > 1).
    if (!m.tie_embeddings || p.pp > 1) add("lm_head", 1, vocab_rows, h, true, false);
  }
  return out;
}

double muon_flops(int64_t m, int64_t n, int64_t ns_steps) {
  // Per iteration on X [a, b] (the short side's Gram matrix, optim/muon.hpp): A = X X^T (2 a^2 b),
  // B = b A + c A A (2 a^3), X = a X + B X (2 a^2 b).
  const double a = double(std::min(m, n)), b = double(std::max(m, n));
  return double(ns_steps) * (4 * a * a * b + 2 * a * a * a);
}

namespace {

// Golub & Van Loan, Matrix Computations (4th ed., section 8.3): the symmetric QR algorithm costs
// about 9 n^3 flops with the eigenvectors (4 n^3 / 3 without them); LAPACK's dsyevd (divide and
// conquer) is usually cheaper, so this is an upper count. Rebuilding the root Q diag(d) Q^T: 2 n^3.
constexpr double kEigenFlops = 9, kRootRebuildFlops = 2;

// One Shampoo block [r, c]: per step the factor updates L += G G^T (2 r^2 c) and R += G^T G
// (2 r c^2) and the preconditioning L^{-1/4} M R^{-1/4} (2 r^2 c + 2 r c^2); every `frequency`
// steps an eigendecomposition and a root rebuild of each factor.
double shampoo_block_flops(double r, double c, double frequency) {
  const double per_step = 4 * (r * r * c + r * c * c);
  const double refresh = (kEigenFlops + kRootRebuildFlops) * (r * r * r + c * c * c);
  return per_step + refresh / frequency;
}

}  // namespace

double shampoo_flops(int64_t m, int64_t n, int64_t block, int64_t frequency) {
  // The blocks of Shampoo::blocks: full block x block ones, the remainders at the ends.
  const int64_t mf = m / block, mr = m % block, nf = n / block, nr = n % block;
  const double B = double(block), F = double(frequency);
  double s = double(mf) * double(nf) * shampoo_block_flops(B, B, F);
  if (nr > 0) s += double(mf) * shampoo_block_flops(B, double(nr), F);
  if (mr > 0) s += double(nf) * shampoo_block_flops(double(mr), B, F);
  if (mr > 0 && nr > 0) s += shampoo_block_flops(double(mr), double(nr), F);
  return s;
}

double soap_flops(int64_t m, int64_t n, int64_t max_dim, int64_t frequency) {
  // Vyas et al. 2024 (arXiv 2409.11321), Algorithm 3 and section 4: a side longer than max_dim is
  // not rotated. Per step and rotated side (L: m, R: n): the factor update (2 m^2 n), the gradient
  // into the eigenbasis (2 m^2 n) and Adam's direction back (2 m^2 n). Every `frequency` steps
  // per side: one power-iteration step L Q (2 m^3), a Householder QR with Q formed (4/3 m^3 +
  // 4/3 m^3: Golub & Van Loan section 5.2), and the first moment rotated out of the old basis and
  // into the new one (4 m^2 n).
  const double M = double(m), N = double(n), F = double(frequency);
  const double basis = 2 + 8.0 / 3;
  double s = 0;
  if (m <= max_dim) s += 6 * M * M * N + (basis * M * M * M + 4 * M * M * N) / F;
  if (n <= max_dim) s += 6 * M * N * N + (basis * N * N * N + 4 * M * N * N) / F;
  return s;
}

KfacFlops kfac_flops(int64_t m, int64_t n, double tokens, int64_t factor_update_steps, int64_t inv_update_steps) {
  const double M = double(m), N = double(n);
  return {2 * tokens * (N * N + M * M) / double(factor_update_steps),
          kEigenFlops * (N * N * N + M * M * M) / double(inv_update_steps), 4 * (M * M * N + M * N * N)};
}

KfacBytes kfac_bytes(const ModelSpec& m, const Plan& p, int64_t pp_rank) {
  const double replicas = double(p.dp * p.cp);
  if (p.optimizer != "kfac" || replicas == 1) return {};
  const Plan::OptimizerKnobs& k = p.optimizer_knobs;
  double stats = 0, eigen = 0, numel = 0;
  for (const EntryClass& e : entry_classes(m, p, pp_rank)) {
    if (!e.layer_matrix) continue;
    const double out = double(e.rows), in = double(e.cols), c = double(e.count);
    stats += c * (in * in + out * out), eigen += c * (in * in + in + out * out + out), numel += c * out * in;
  }
  KfacBytes b;
  b.all_reduce = 4 * stats / double(k.factor_update_steps);
  if (p.zero == 0) {
    const double g = k.grad_worker_fraction * replicas;
    b.sent = 4 * ((g - 1) * eigen / double(k.inv_update_steps) + (replicas - g) * numel) / replicas;
  }
  return b;
}

double kfac_factor_bytes(const ModelSpec& m, const Plan& p, int64_t pp_rank) {
  if (p.optimizer != "kfac") return 0;
  const double replicas = double(p.dp * p.cp);
  const double owned = p.zero >= 1 ? 1 / replicas : 1.0;
  const double eigen_share = p.zero >= 1 ? 1 / replicas : p.optimizer_knobs.grad_worker_fraction;
  double floats = 0;
  for (const EntryClass& e : entry_classes(m, p, pp_rank)) {
    if (!e.layer_matrix) continue;
    const double out = double(e.rows), in = double(e.cols), sq = in * in + out * out;
    floats += double(e.count) * (sq * owned + (sq + in + out) * eigen_share + sq);
  }
  return 4 * floats;
}

namespace {

// The optimizer that updates entry class e: a mixed order's first-order one off the layers' matrices.
const std::string& optimizer_of(const Plan& p, const EntryClass& e) {
  return !p.optimizer_knobs.others.empty() && !e.layer_matrix ? p.optimizer_knobs.others : p.optimizer;
}

}  // namespace

double entry_matrix_flops(const Plan& p, const EntryClass& e) {
  if (!e.two_d || optimizer_of(p, e) != p.optimizer) return 0;
  const Plan::OptimizerKnobs& k = p.optimizer_knobs;
  if (p.optimizer == "muon") return e.layer_matrix ? muon_flops(e.rows, e.cols, k.ns_steps) : 0;
  if (p.optimizer == "shampoo")
    return shampoo_flops(e.rows, e.cols, k.max_preconditioner_dim, k.precondition_frequency);
  if (p.optimizer == "soap") return soap_flops(e.rows, e.cols, k.max_preconditioner_dim, k.precondition_frequency);
  return 0;
}

double elementwise_bytes_per_element(const Plan& p, const EntryClass& e, const Calibration& c) {
  // AdamW: read the fp32 gradient, read and write the master weight and its two moments, write
  // the 16-bit weight (c.optimizer_bytes_per_param, docs/planner.md); fp32: 28. One fp32 state
  // value fewer is 8 bytes fewer (read and written), one more pass over an fp32 tensor 8 more.
  const double adamw = p.precision == Precision::fp32 ? 28.0 : c.optimizer_bytes_per_param;
  const std::string& o = optimizer_of(p, e);
  if (o == "sgd" || o == "lion") return adamw - 8;                   // one buffer
  if (o == "lamb") return adamw + 8;                                 // the norms' pass over w and r
  if (o == "muon") return e.layer_matrix ? adamw - 8 : adamw;        // momentum; AdamW elsewhere
  if (o == "kfac") return e.layer_matrix ? adamw : adamw - 8;        // SGD's buffer; P written and read back
  if (o == "adafactor") {
    // Its fp32 values per element (the first moment, an unfactored second moment), and a second
    // pass over the gradient: the factored means first, then the update and its RMS clipping.
    const OptimizerState& st = p.optimizer_state;  // a mixed order's: Adafactor's off the matrices
    return adamw + 8 * ((e.layer_matrix ? st.per_matrix_element : st.per_other_element) - 2) + 8;
  }
  // Shampoo's grafting Adam and SOAP's Adam in the eigenbasis: AdamW's traffic, plus writing and
  // reading back the preconditioned (rotated) direction of a 2-D entry.
  if (o == "shampoo" || o == "soap") return e.two_d ? adamw + 8 : adamw;
  return adamw;
}

namespace {

// K-FAC's matrix work on the slowest replica (optim/kfac.hpp): every replica computes the statistics
// of its own tokens; each matrix's eigendecompositions are done once, by its inverse worker (spread
// over the replicas, at least the largest matrix's on one); its preconditioning by its
// grad_worker_fraction of the replicas under ZeRO 0, by its owner under ZeRO >= 1. At the fp32
// GEMM rate (plan/compute.hpp) of a square GEMM of the matrix's short side, as the other matrix optimizers.
OptimizerCost kfac_matrix_cost(const ModelSpec& m, const Plan& p, const Device& d, const Calibration& c,
                               int64_t pp_rank) {
  const double replicas = double(p.dp * p.cp), tokens = double(p.global_batch) * double(m.seq_len) / replicas;
  const Plan::OptimizerKnobs& k = p.optimizer_knobs;
  double stats = 0, eigen = 0, pre = 0, largest_eigen = 0, largest_pre = 0, flops = 0;
  for (const EntryClass& e : entry_classes(m, p, pp_rank)) {
    if (!e.layer_matrix) continue;
    const double short_side = double(std::min(e.rows, e.cols));
    const double rate = gemm_rate(d, Precision::fp32, {short_side, short_side, short_side}, c);
    const KfacFlops f = kfac_flops(e.rows, e.cols, tokens, k.factor_update_steps, k.inv_update_steps);
    stats += double(e.count) * f.statistics / rate;
    eigen += double(e.count) * f.eigen / rate, largest_eigen = std::max(largest_eigen, f.eigen / rate);
    pre += double(e.count) * f.precondition / rate, largest_pre = std::max(largest_pre, f.precondition / rate);
    flops += double(e.count) * (f.statistics + f.eigen + f.precondition);
  }
  const double spread_eigen = std::max(eigen / replicas, std::min(eigen, largest_eigen));
  const double spread_pre = p.zero == 0 ? pre * k.grad_worker_fraction : std::max(pre / replicas, std::min(pre, largest_pre));
  OptimizerCost out;
  out.matrix_s = stats + spread_eigen + spread_pre;
  out.matrix_flops = flops * out.matrix_s / std::max(stats + eigen + pre, 1e-300);  // this replica's share
  return out;
}

}  // namespace

OptimizerCost optimizer_step_cost(const ModelSpec& m, const Plan& p, const Device& d, const Calibration& c,
                                  int64_t pp_rank) {
  const double bw = d.hbm_bw_gbs * 1e9 * d.bw_efficiency;
  // Muon's Newton-Schulz runs in bfloat16 in the reference (KellerJordan/Muon casts X to bf16) in
  // a mixed-precision run; Shampoo's and SOAP's factors and bases are fp32 (Distributed Shampoo,
  // SOAP's reference implementation).
  const bool bf16_matrices = p.optimizer == "muon" && p.precision != Precision::fp32;
  const Precision matrices = bf16_matrices ? Precision::bf16 : Precision::fp32;
  const int64_t block = p.optimizer == "shampoo" ? p.optimizer_knobs.max_preconditioner_dim : INT64_MAX;
  double bytes = 0, matrix_s = 0, flops = 0, largest_bytes = 0, largest_s = 0, largest_flops = 0;
  for (const EntryClass& e : entry_classes(m, p, pp_rank)) {
    const double entry_bytes = elementwise_bytes_per_element(p, e, c) * double(e.rows) * double(e.cols);
    const double entry_flops = entry_matrix_flops(p, e);
    // At the GEMM rate (plan/compute.hpp) of a square GEMM of the entry's (or block's) short side.
    const double short_side = double(std::min({e.rows, e.cols, block}));
    const double entry_s = entry_flops > 0 ? entry_flops / gemm_rate(d, matrices, {short_side, short_side, short_side}, c) : 0;
    bytes += double(e.count) * entry_bytes;
    flops += double(e.count) * entry_flops;
    matrix_s += double(e.count) * entry_s;
    largest_bytes = std::max(largest_bytes, entry_bytes);
    largest_flops = std::max(largest_flops, entry_flops);
    largest_s = std::max(largest_s, entry_s);
  }
  // ZeRO >= 1 spreads the update over the replicas; one owner per entry when it needs them whole,
  // so the slowest replica holds at least the largest entry. ZeRO 0: every replica does it all.
  const double replicas = double(p.dp * p.cp);
  OptimizerCost out;
  if (p.zero == 0 || replicas == 1) {
    out = {bytes / bw, matrix_s, flops};
  } else if (!p.optimizer_state.whole_entries) {
    out = {bytes / replicas / bw, matrix_s / replicas, flops / replicas};
  } else {
    out = {std::max(bytes / replicas, largest_bytes) / bw, std::max(matrix_s / replicas, largest_s),
           std::max(flops / replicas, largest_flops)};
  }
  if (p.optimizer == "kfac") {  // its matrix work is distributed its own way (above)
    const OptimizerCost k = kfac_matrix_cost(m, p, d, c, pp_rank);
    out.matrix_s = k.matrix_s, out.matrix_flops = k.matrix_flops;
  }
  return out;
}

}  // namespace exatrain::plan
