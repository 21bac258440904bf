#include "optim/muon.hpp"

#include <algorithm>
#include <cmath>
#include <utility>

#include "core/check.hpp"

namespace exatrain {

bool Muon::orthogonalised(const ParamInfo& p) { return p.role == ParamRole::matrix && p.shard_shape.size() == 2; }

std::vector<EntryStateSpec> Muon::entry_states(const ParamInfo& p) const {
  if (orthogonalised(p)) return {{"momentum_buffer", p.shard_shape}};
  return {{"exp_avg", p.shard_shape}, {"exp_avg_sq", p.shard_shape}};
}

// rms_match: Moonlight's 0.2 sqrt(max(m, n)) makes the update's RMS about 0.2, AdamW's typical one,
// so that AdamW's lr and weight decay carry over (arXiv 2502.16982, section 2.2). shape: Keller
// Jordan's sqrt(max(1, m/n)) for a [out, in] weight (lr then wants Muon's own ~0.02).
float Muon::scale(int64_t m, int64_t n) const {
  if (cfg_.rms_match) return float(0.2 * std::sqrt(double(std::max(m, n))));
  return float(std::sqrt(std::max(1.0, double(m) / double(n))));
}

void Muon::reserve(int64_t mn, int64_t kk) {
  if (x_.size() < mn) {
    x_ = DeviceBuffer(be_, mn, "muon X");
    y_ = DeviceBuffer(be_, mn, "muon next X");
  }
  if (a_.size() < kk) {
    a_ = DeviceBuffer(be_, kk, "muon A");
    b_ = DeviceBuffer(be_, kk, "muon B");
  }
}

// The quintic iteration on the short side k = min(m, n): for m <= n, A = X X^T [m, m] and
// X' = a X + B X; for m > n on X^T, written untransposed: A = X^T X [n, n] and X' = a X + X B
// (B is symmetric). Each step: B = copy of A, then B = c A A + b B; X' = copy of X, X' = (B X or
// X B) + a X'.
float* Muon::newton_schulz(float* x, int64_t m, int64_t n) {
  const int64_t k = std::min(m, n), mn = m * n;
  float* y = x == x_.data() ? y_.data() : x_.data();
  float *A = a_.data(), *B = b_.data();
  for (int64_t s = 0; s < cfg_.ns_steps; s++) {
    if (m <= n) be_.gemm(false, true, k, k, n, 1.0f, x, n, x, n, 0.0f, A, k);  // A = X X^T
    else be_.gemm(true, false, k, k, m, 1.0f, x, n, x, n, 0.0f, A, k);         // A = X^T X
    be_.copy(B, A, sizeof(float) * size_t(k * k));
    be_.gemm(false, false, k, k, k, kC, A, k, A, k, kB, B, k);                 // B = b A + c A A
    be_.copy(y, x, sizeof(float) * size_t(mn));
    if (m <= n) be_.gemm(false, false, m, n, m, 1.0f, B, k, x, n, kA, y, n);   // X' = a X + B X
    else be_.gemm(false, false, m, n, n, 1.0f, x, n, B, k, kA, y, n);          // X' = a X + X B
    std::swap(x, y);
  }
  return x;
}

void Muon::update(const EntryPart& e, const OptimStep& ctx) {
  if (!orthogonalised(e.p)) return adamw_part(be_, cfg_.adamw, e, e.entry_state[0], e.entry_state[1], ctx);
  const float wd = e.p.decay ? cfg_.adamw.weight_decay : 0.0f;
  // init_state gave a matrix its momentum buffer only when the region holds it whole.
  EXA_CHECK(e.first == 0 && e.n == e.p.numel, "muon: {} is cut by its region (elements [{}, {}) of {})", e.p.name,
            e.first, e.first + e.n, e.p.numel);
  const int64_t m = e.p.shard_shape[0], n = e.p.shard_shape[1], k = std::min(m, n);
  reserve(m * n, k * k);
  float* x = x_.data();
  be_.momentum_update(x, e.entry_state[0], e.grads, e.n, cfg_.momentum, cfg_.nesterov, ctx.grad_scale);
  const double norm = std::sqrt(be_.sum_squares(x, e.n));
  be_.scale(x, float(1.0 / (norm + kNormEps)), e.n);
  x = newton_schulz(x, m, n);
  if (wd != 0) be_.scale(e.params, 1.0f - ctx.lr * wd, e.n);
  be_.scale(x, -ctx.lr * scale(m, n), e.n);
  be_.add_inplace(e.params, x, e.n);
}

}  // namespace exatrain
