// A matrix optimizer of the tests, with entry states (Optimizer::entry_states) of shapes unlike its
// parameters: AdamW on every entry, plus, on an entry's tensor-parallel shard W [m, n] (G its
// gradient, s the step's grad_scale):
//   matrices (role matrix):     gram [m, m] = 0.9 gram + s^2 G G^T / n;  W -= lr * c * gram G s
//   matrices and embeddings:    col_sum [n] = 0.9 col_sum + s * sum over rows of G;
//                               W[i, :] -= lr * c * col_sum  for every row i
// It is not an optimizer to train with: it exists so that the entry states' allocation on the
// entry's owner, the update seeing them and the checkpoint storing them by name are tested before
// Shampoo, SOAP and K-FAC keep their factors there. Every operation is a backend op (the guarded
// backend runs it). Weight decay and the bias corrections are AdamW's.
#pragma once
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "optim/optimizer.hpp"

namespace exatrain::test {

class GramAdamW final : public Optimizer {
 public:
  static constexpr float kCoupling = 100.0f;  // c above: the factors move the losses by ~1e-3 (tests/dist/dist_entry_states.cpp, D)

  explicit GramAdamW(Backend& be) : Optimizer(be) {}
  const char* name() const override { return "gram_adamw"; }
  std::vector<std::string> state_names() const override { return {"exp_avg", "exp_avg_sq"}; }
  bool needs_whole_entries() const override { return true; }
  std::vector<EntryStateSpec> entry_states(const ParamInfo& p) const override {
    if (p.shard_shape.size() != 2) return {};
    const int64_t m = p.shard_shape[0], n = p.shard_shape[1];
    if (p.role == ParamRole::matrix) return {{"gram", {m, m}}, {"col_sum", {n}}};
    if (p.role == ParamRole::embedding) return {{"col_sum", {n}}};
    return {};
  }

 protected:
  void update(const EntryPart& e, const OptimStep& ctx) override {
    adamw_part(be_, AdamWConfig{0.9f, 0.95f, 1e-8f, 0.1f}, e, e.state[0], e.state[1], ctx);
    const std::vector<EntryStateSpec> specs = entry_states(e.p);
    if (specs.empty()) return;
    const int64_t m = e.p.shard_shape[0], n = e.p.shard_shape[1];
    const float s = ctx.grad_scale, k = ctx.lr * kCoupling;
    float* col_sum = e.entry_state[specs.size() - 1];  // [n]
    if (specs.size() == 2) {
      float* gram = e.entry_state[0];  // [m, m]
      be_.gemm(false, true, m, m, n, s * s / float(n), e.grads, n, e.grads, n, 0.9f, gram, m);
      be_.gemm(false, false, m, n, m, -k * s, gram, m, e.grads, n, 1.0f, e.params, n);
    }
    be_.scale(col_sum, 0.9f / s, n);  // col_sum = 0.9 col_sum + s * colsum(G), as s * (0.9/s col_sum + colsum G)
    be_.bias_backward(col_sum, e.grads, m, n);
    be_.scale(col_sum, -k * s, n);
    be_.add_bias(e.params, col_sum, m, n);
    be_.scale(col_sum, -1.0f / k, n);
  }
};

}  // namespace exatrain::test
