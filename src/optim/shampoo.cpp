#include "optim/shampoo.hpp"

#include <algorithm>
#include <cmath>

#include "core/check.hpp"

namespace exatrain {

std::vector<Shampoo::Block> Shampoo::blocks(int64_t m, int64_t n, int64_t max_dim) {
  std::vector<Block> out;
  int64_t l_off = 0, r_off = 0;
  for (int64_t r0 = 0; r0 < m; r0 += max_dim)
    for (int64_t c0 = 0; c0 < n; c0 += max_dim) {
      const int64_t mb = std::min(max_dim, m - r0), nb = std::min(max_dim, n - c0);
      out.push_back({r0, mb, c0, nb, l_off, r_off});
      l_off += mb * mb, r_off += nb * nb;
    }
  return out;
}

std::vector<EntryStateSpec> Shampoo::entry_states(const ParamInfo& p) const {
  std::vector<EntryStateSpec> specs = {{"exp_avg", p.shard_shape}, {"exp_avg_sq", p.shard_shape}};
  if (!preconditioned(p)) return specs;
  int64_t l = 0, r = 0;
  for (const Block& b : blocks(p.shard_shape[0], p.shard_shape[1], cfg_.max_preconditioner_dim))
    l += b.mb * b.mb, r += b.nb * b.nb;
  specs.push_back({"shampoo_L", {l}});
  specs.push_back({"shampoo_R", {r}});
  specs.push_back({"shampoo_L_root", {l}});
  specs.push_back({"shampoo_R_root", {r}});
  return specs;
}

// Every block's two roots; a failed one keeps the block's previous root.
void Shampoo::refresh_roots(const EntryPart& e, const std::vector<Block>& bl) {
  float *L = e.entry_state[2], *R = e.entry_state[3], *Lr = e.entry_state[4], *Rr = e.entry_state[5];
  for (const Block& b : bl) {
    if (!be_.sym_inverse_root(Lr + b.l_off, L + b.l_off, b.mb, cfg_.epsilon, 4)) fallbacks_++;
    if (!be_.sym_inverse_root(Rr + b.r_off, R + b.r_off, b.nb, cfg_.epsilon, 4)) fallbacks_++;
  }
}

// S blockwise into dir_, scaled to Adam's norm; false when S is 0 or not finite (no root yet: the
// first refresh failed everywhere), and the caller steps along A.
bool Shampoo::shampoo_direction(const EntryPart& e, const std::vector<Block>& bl, float bc1) {
  const int64_t n = e.p.shard_shape[1];
  const float *Lr = e.entry_state[4], *Rr = e.entry_state[5];
  float* mhat = reserve_scratch(be_, mhat_, e.n, "shampoo m hat");
  be_.copy(mhat, e.entry_state[0], sizeof(float) * size_t(e.n));
  be_.scale(mhat, 1.0f / bc1, e.n);
  float* dir = reserve_scratch(be_, dir_, e.n, "shampoo direction");
  int64_t largest = 0;
  for (const Block& b : bl) largest = std::max(largest, b.mb * b.nb);
  float* tmp = reserve_scratch(be_, tmp_, largest, "shampoo block");
  for (const Block& b : bl) {
    const int64_t at = b.r0 * n + b.c0;
    be_.gemm(false, false, b.mb, b.nb, b.mb, 1.0f, Lr + b.l_off, b.mb, mhat + at, n, 0.0f, tmp, b.nb);
    be_.gemm(false, false, b.mb, b.nb, b.nb, 1.0f, tmp, b.nb, Rr + b.r_off, b.nb, 0.0f, dir + at, n);
  }
  const double s_norm = std::sqrt(be_.sum_squares(dir, e.n)), a_norm = std::sqrt(be_.sum_squares(adam_.data(), e.n));
  if (!(s_norm > 0) || !std::isfinite(s_norm)) return false;
  be_.scale(dir, float(a_norm / s_norm), e.n);
  return true;
}

void Shampoo::update(const EntryPart& e, const OptimStep& ctx) {
  const AdamWConfig& a = cfg_.adamw;
  if (!preconditioned(e.p)) return adamw_part(be_, a, e, e.entry_state[0], e.entry_state[1], ctx);
  check_whole_entry("shampoo", e);
  const int64_t m = e.p.shard_shape[0], n = e.p.shard_shape[1];
  const float bc1 = 1.0f - std::pow(a.beta1, float(ctx.step)), bc2 = 1.0f - std::pow(a.beta2, float(ctx.step));
  float* A = reserve_scratch(be_, adam_, e.n, "shampoo graft");
  be_.adam_direction(A, e.grads, e.entry_state[0], e.entry_state[1], e.n, a.beta1, a.beta2, a.eps, bc1, bc2,
                     ctx.grad_scale);
  const std::vector<Block> bl = blocks(m, n, cfg_.max_preconditioner_dim);
  const float f = cfg_.factor_decay, gg = (1.0f - f) * ctx.grad_scale * ctx.grad_scale;
  for (const Block& b : bl) {
    const float* G = e.grads + b.r0 * n + b.c0;  // [mb, nb] with row stride n
    be_.gemm(false, true, b.mb, b.mb, b.nb, gg, G, n, G, n, f, e.entry_state[2] + b.l_off, b.mb);  // L
    be_.gemm(true, false, b.nb, b.nb, b.mb, gg, G, n, G, n, f, e.entry_state[3] + b.r_off, b.nb);  // R
  }
  const int64_t since = ctx.step - cfg_.start_preconditioning_step;
  const bool refresh = since >= 0 && since % cfg_.precondition_frequency == 0;
  if (refresh) refresh_roots(e, bl);
  float* step = since >= 0 && shampoo_direction(e, bl, bc1) ? dir_.data() : A;
  if (e.p.decay && a.weight_decay != 0) be_.scale(e.params, 1.0f - ctx.lr * a.weight_decay, e.n);
  be_.scale(step, -ctx.lr, e.n);
  be_.add_inplace(e.params, step, e.n);
}

}  // namespace exatrain
