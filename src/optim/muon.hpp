// Muon (Keller Jordan et al. 2024, "Muon: an optimizer for hidden layers in neural networks";
// Liu et al. 2025, "Muon is scalable for LLM training", arXiv 2502.16982): Nesterov momentum whose
// update is orthogonalised by a quintic Newton-Schulz iteration, for the 2-D matrices inside the
// layers (ParamRole::matrix); AdamW for embeddings, head, norms and biases. docs/optimizers.md.
//
// On a matrix shard W [m, n] with gradient G (s = OptimStep::grad_scale):
//   buf = momentum buf + s G;  U = nesterov ? s G + momentum buf : buf          (backend momentum_update)
//   X = U / (|U|_F + 1e-7);  k = min(m, n) steps on the short side (X X^T when m <= n, X^T X else):
//   ns_steps times:  A = X X^T;  B = b A + c A A;  X = a X + B X,   (a, b, c) = (3.4445, -4.7750, 2.0315)
//   W = W (1 - lr wd) - lr scale X,  scale = 0.2 sqrt(max(m, n)) (rms_match) or sqrt(max(1, m/n)) (shape).
// (m > n works with X^T: A = X^T X [n, n], X = a X + X B, the transpose of the reference's step.)
// The state is entry states (Optimizer::entry_states), so no entry carries another's state:
// "momentum_buffer" [m, n] per matrix, "exp_avg" and "exp_avg_sq" of its shape per other entry.
// Under tensor parallelism each tp rank orthogonalises its own shard: an approximation (the
// orthogonalised update of a row or column block, not a block of the whole matrix's).
// |U|_F comes to the host (Backend::sum_squares): one host synchronisation per matrix, free on the
// CPU backends; a GPU backend will want a device-side norm-and-scale op here.
//
// Owns: the Muon update and its scratch matrices. May use: core/, job/, backend/, model/layout.hpp,
// optim/optimizer.hpp.
#pragma once
#include <string>
#include <vector>

#include "optim/optimizer.hpp"

namespace exatrain {

struct MuonConfig {
  float momentum = 0.95f;
  bool nesterov = true;
  int64_t ns_steps = 5;
  bool rms_match = true;  // false: the "shape" scale
  AdamWConfig adamw;      // the other entries; weight_decay also decays the matrices (Moonlight)
};

class Muon final : public Optimizer {
 public:
  // The quintic Newton-Schulz coefficients of Keller Jordan's Muon (github.com/KellerJordan/Muon).
  static constexpr float kA = 3.4445f, kB = -4.7750f, kC = 2.0315f;
  static constexpr double kNormEps = 1e-7;  // X = U / (|U|_F + 1e-7), as the reference

  Muon(Backend& backend, MuonConfig config) : Optimizer(backend), cfg_(config) {}
  const char* name() const override { return "muon"; }
  std::vector<std::string> state_names() const override { return {}; }
  bool needs_whole_entries() const override { return true; }
  std::vector<EntryStateSpec> entry_states(const ParamInfo& p) const override;
  // Whether entry p gets Muon (a 2-D matrix of a layer) rather than AdamW.
  static bool orthogonalised(const ParamInfo& p);
  // The update's scale for a shard of m rows and n columns.
  int64_t scratch_bytes() const override { return bytes_of({&x_, &y_, &a_, &b_}); }
  float scale(int64_t m, int64_t n) const;

 protected:
  void update(const EntryPart& part, const OptimStep& ctx) override;

 private:
  // X (device [m, n], |X|_F <= 1) after ns_steps Newton-Schulz steps; returns the pointer that
  // holds the result (x_ or y_).
  float* newton_schulz(float* x, int64_t m, int64_t n);
  void reserve(int64_t mn, int64_t kk);
  MuonConfig cfg_;
  DeviceBuffer x_, y_, a_, b_;  // scratch: X and the next X [m, n], A and B [k, k]; grown, never shrunk
};

}  // namespace exatrain
