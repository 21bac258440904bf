#include "optim/soap.hpp"

#include <cmath>
#include <tuple>

#include "core/check.hpp"

namespace exatrain {

std::vector<EntryStateSpec> Soap::entry_states(const ParamInfo& p) const {
  std::vector<EntryStateSpec> specs = {{"exp_avg", p.shard_shape}, {"exp_avg_sq", p.shard_shape}};
  if (p.shard_shape.size() != 2) return specs;
  const int64_t m = p.shard_shape[0], n = p.shard_shape[1];
  if (m <= cfg_.max_preconditioner_dim) specs.insert(specs.end(), {{"soap_GG_L", {m, m}}, {"soap_Q_L", {m, m}}});
  if (n <= cfg_.max_preconditioner_dim) specs.insert(specs.end(), {{"soap_GG_R", {n, n}}, {"soap_Q_R", {n, n}}});
  return specs;
}

// The entry states in entry_states' order: exp_avg, exp_avg_sq, then L's pair, then R's.
Soap::Sides Soap::sides(const EntryPart& e) const {
  Sides s;
  s.n = e.p.numel;
  if (e.p.shard_shape.size() != 2) return s;
  s.m = e.p.shard_shape[0], s.n = e.p.shard_shape[1];
  size_t k = 2;
  if (s.m <= cfg_.max_preconditioner_dim) s.L = e.entry_state[k], s.QL = e.entry_state[k + 1], k += 2;
  if (s.n <= cfg_.max_preconditioner_dim) s.R = e.entry_state[k], s.QR = e.entry_state[k + 1];
  return s;
}

void Soap::rotate(float* out, const float* in, const Sides& s, bool to_basis) {
  const int64_t m = s.m, n = s.n;
  const float* x = in;
  float* t = s.QR ? reserve_scratch(be_, tmp_, m * n, "soap rotation") : out;
  if (s.QL) {  // t = QL^T x (to the basis) or QL x (back)   [m, n]
    be_.gemm(to_basis, false, m, n, m, 1.0f, s.QL, m, x, n, 0.0f, t, n);
    x = t;
  }
  if (s.QR) {  // out = x QR or x QR^T   [m, n]
    be_.gemm(false, !to_basis, m, n, n, 1.0f, x, n, s.QR, n, 0.0f, out, n);
  } else if (x != out) {
    be_.copy(out, x, sizeof(float) * size_t(m * n));
  }
}

// L = f L + (1 - f) g g^T [m, m];  R = f R + (1 - f) g^T g [n, n].
void Soap::update_factors(const Sides& s, const float* g) {
  const float f = cfg_.factor_decay;
  if (s.L) be_.gemm(false, true, s.m, s.m, s.n, 1.0f - f, g, s.n, g, s.n, f, s.L, s.m);
  if (s.R) be_.gemm(true, false, s.n, s.n, s.m, 1.0f - f, g, s.n, g, s.n, f, s.R, s.n);
}

// The first bases; a failure leaves the identity.
void Soap::init_bases(const Sides& s) {
  for (auto [A, Q, d] : {std::tuple{s.L, s.QL, s.m}, std::tuple{s.R, s.QR, s.n}}) {
    if (!A) continue;
    if (be_.sym_eigenbasis(Q, A, d)) continue;
    fallbacks_++;
    std::vector<float> eye(static_cast<size_t>(d * d), 0.0f);
    for (int64_t i = 0; i < d; i++) eye[size_t(i * d + i)] = 1.0f;
    be_.upload(Q, eye.data(), sizeof(float) * eye.size());
  }
}

// m~ back to the parameters' basis, both bases refreshed (v~ permuted with their columns), m~ into
// the new bases. A failed refresh keeps that side's basis and v~'s order.
void Soap::refresh_bases(const Sides& s, float* m, float* v) {
  float* plain = reserve_scratch(be_, proj_, s.m * s.n, "soap projection");
  rotate(plain, m, s, false);
  std::vector<int64_t> row(static_cast<size_t>(s.m)), col(static_cast<size_t>(s.n));
  const bool l = s.L && be_.power_qr_refresh(s.QL, s.L, s.m, row.data());
  const bool r = s.R && be_.power_qr_refresh(s.QR, s.R, s.n, col.data());
  fallbacks_ += (s.L && !l) + (s.R && !r);
  if (l || r) be_.permute_matrix(v, s.m, s.n, l ? row.data() : nullptr, r ? col.data() : nullptr);
  rotate(m, plain, s, true);
}

void Soap::update(const EntryPart& e, const OptimStep& ctx) {
  check_whole_entry("soap", e);
  const Sides s = sides(e);
  float* g = reserve_scratch(be_, g_, e.n, "soap gradient");
  be_.copy(g, e.grads, sizeof(float) * size_t(e.n));
  be_.scale(g, ctx.grad_scale, e.n);
  float *m = e.entry_state[0], *v = e.entry_state[1];
  if (ctx.step == 1) {  // the factors and first bases only (soap.py's skipped step)
    update_factors(s, g);
    return init_bases(s);
  }
  const int64_t t = ctx.step - 1;
  const AdamWConfig& a = cfg_.adam;
  float* proj = reserve_scratch(be_, proj_, e.n, "soap projection");
  float* dir = reserve_scratch(be_, dir_, e.n, "soap direction");
  rotate(proj, g, s, true);
  be_.adam_direction(dir, proj, m, v, e.n, a.beta1, a.beta2, a.eps, 1.0f, 1.0f, 1.0f);  // m~ / (sqrt(v~) + eps)
  rotate(proj, dir, s, false);
  const float bc1 = 1.0f - std::pow(a.beta1, float(t)), bc2 = 1.0f - std::pow(a.beta2, float(t));
  be_.scale(proj, -ctx.lr * std::sqrt(bc2) / bc1, e.n);
  be_.add_inplace(e.params, proj, e.n);
  if (e.p.decay && a.weight_decay != 0) be_.scale(e.params, 1.0f - ctx.lr * a.weight_decay, e.n);
  update_factors(s, g);
  if ((s.L || s.R) && t % cfg_.precondition_frequency == 0) refresh_bases(s, m, v);
}

}  // namespace exatrain
