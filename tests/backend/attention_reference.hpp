// A double-precision reference of causal grouped-query attention and per-element error bounds for
// an implementation that rounds to a 16-bit format (the CUDA backend's fused kernel), shared by its
// emulated test (flash_attention_emulated_test.cpp) and its GPU test (cuda_test.cpp). Both compare
// that implementation against the CPU backend's float32 attention on the same (16-bit) q, k, v.
//
// The bounds are first-order, per element, from the format's unit roundoff u (2^-8 bf16, 2^-11
// f16) and its absolute error below its smallest normal, a (2^-25 for f16, whose normals stop at
// 2^-14; 0 for bf16, which has float32's exponents), and float32's e = 2^-24. A float32 sum of n
// terms is counted once for each side: acc(n) = (3n + 32) e, the CPU's n e (round to nearest) and
// the tensor cores' 2 (n + 16) e (they truncate, and align each mma's 16 products to the largest).
// P, o, dP, delta and dS are the double reference's. For query t and key k (s the scaled score,
// |s| its sum of |q_d k_d| / sqrt(D)):
//   score error      es_tk = acc(D) |s|_tk
//   probability      eP_tk = P_tk (2 max_k es_tk + acc(T) + 4e)   (exp of perturbed scores, the sum)
//   out[t]           sum_k (u P_tk + a + eP_tk) |v_k| + acc(T) sum_k P_tk |v_k|   (p rounded)
//   lse[t]           (max_k es_tk + acc(T) + 4e) / ln 2 + e |lse_t|
//   dP               edp_tk = (u + acc(D)) |dout_t|.|v_k| + a sum |v_k|          (dout rounded)
//   delta            ed_t = |dout_t|.(u |o_t| + a + bound(out[t])) + acc(D) |dout_t|.|o_t|  (o rounded)
//   dS               e_tk = eP_tk |dP_tk - delta_t| + P_tk (edp_tk + ed_t) + u |dS_tk| + a  (dS rounded)
//   dq[t]            scale sum_k (e_tk + acc(T) |dS_tk|) |k_k|
//   dk[k]            scale sum_t (e_tk + acc(G T) |dS_tk|) |q_t|          (t over the group's heads)
//   dv[k]            sum_t ((2u + acc(G T)) P_tk + a + eP_tk) |dout_t| + a P_tk  (P and dout rounded)
// An element passes within 2 x its bound (the terms of second order) plus 1e-7.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "backend/half_convert.hpp"

namespace exatrain::test {

struct AttentionCase {
  int B, T, Hq, Hkv, D, half;  // half: 0 = bf16, 1 = f16
};

inline float round16(float v, int half) {
  return half == 0 ? half_convert::bf16_to_f32(half_convert::f32_to_bf16(v))
                   : half_convert::f16_to_f32(half_convert::f32_to_f16(v));
}

// The double reference's probabilities P[b][h][t][k], output o, log-sum-exp lse[b][h][t] (log2 of
// sum_k 2^(s_k log2 e), the fused kernel's saved statistic) and per-element error bounds.
struct AttentionReference {
  std::vector<double> P, o, lse, out_bound, lse_bound, dqkv_bound;
};

namespace attention_detail {

struct Head {  // one (batch, query head): where its columns are in qkv's rows
  const AttentionCase& c;
  const std::vector<float>& qkv;
  int b;
  int64_t W, qc, kc, vc;
  double u, a, scale;  // the format's unit roundoff and its absolute error below its normals
  double at(int t, int64_t col) const { return qkv[size_t((int64_t(b) * c.T + t) * W + col)]; }
};

constexpr double kE = 1.0 / 16777216;  // float32's unit roundoff, 2^-24
inline double acc(double n) { return (3 * n + 32) * kE; }  // a float32 sum of n terms, both sides

// Row t of P (and eP, the bound on its error), its lse, and of o with its bound.
inline void forward_row(const Head& h, int t, double* P, std::vector<double>& eP, double* lse, double* lse_bound,
                        double* o, double* ob) {
  const int D = h.c.D;
  double mx = -1e300, sum = 0, es_max = 0;
  for (int k = 0; k <= t; k++) {
    double s = 0, sa = 0;
    for (int d = 0; d < D; d++) {
      s += h.at(t, h.qc + d) * h.at(k, h.kc + d);
      sa += std::fabs(h.at(t, h.qc + d) * h.at(k, h.kc + d));
    }
    P[k] = s * h.scale;
    es_max = std::max(es_max, acc(D) * sa * h.scale);
    mx = std::max(mx, P[k]);
  }
  for (int k = 0; k <= t; k++) sum += (P[k] = std::exp(P[k] - mx));
  *lse = (mx + std::log(sum)) / std::log(2.0);
  *lse_bound = (es_max + acc(h.c.T) + 4 * kE) / std::log(2.0) + kE * std::fabs(*lse);
  eP.assign(size_t(t + 1), 0.0);
  for (int k = 0; k <= t; k++) {
    P[k] /= sum;
    eP[size_t(k)] = P[k] * (2 * es_max + acc(h.c.T) + 4 * kE);
  }
  for (int d = 0; d < D; d++)
    for (int k = 0; k <= t; k++) {
      const double v = h.at(k, h.vc + d);
      o[d] += P[k] * v;
      ob[d] += (h.u * P[k] + h.a + eP[size_t(k)] + acc(h.c.T) * P[k]) * std::fabs(v);
    }
}

// Adds row t's share of the bounds on dq (its own row), dk and dv (every key k <= t).
inline void backward_row(const Head& h, int t, const double* P, const std::vector<double>& eP, const double* o,
                         const double* ob, const float* dout, double* bound) {
  const int D = h.c.D;
  const double gT = acc(h.c.T), gGT = acc(double(h.c.T) * (h.c.Hq / h.c.Hkv));
  double delta = 0, dout_o = 0, ed = 0;
  for (int d = 0; d < D; d++) {
    delta += dout[d] * o[d];
    dout_o += std::fabs(dout[d] * o[d]);
    ed += std::fabs(dout[d]) * (h.u * std::fabs(o[d]) + h.a + ob[d]);
  }
  ed += acc(D) * dout_o;
  const size_t qrow = size_t((int64_t(h.b) * h.c.T + t) * h.W);
  for (int k = 0; k <= t; k++) {
    double dp = 0, dout_v = 0, v_abs = 0;
    for (int d = 0; d < D; d++) {
      dp += dout[d] * h.at(k, h.vc + d);
      dout_v += std::fabs(dout[d] * h.at(k, h.vc + d));
      v_abs += std::fabs(h.at(k, h.vc + d));
    }
    const double ds = P[k] * (dp - delta), edp = (h.u + acc(D)) * dout_v + h.a * v_abs;
    const double e = eP[size_t(k)] * std::fabs(dp - delta) + P[k] * (edp + ed) + h.u * std::fabs(ds) + h.a;
    const size_t krow = size_t((int64_t(h.b) * h.c.T + k) * h.W);
    for (int d = 0; d < D; d++) {
      bound[qrow + h.qc + d] += h.scale * (e + gT * std::fabs(ds)) * std::fabs(h.at(k, h.kc + d));
      bound[krow + h.kc + d] += h.scale * (e + gGT * std::fabs(ds)) * std::fabs(h.at(t, h.qc + d));
      bound[krow + h.vc + d] += ((2 * h.u + gGT) * P[k] + h.a + eP[size_t(k)]) * std::fabs(dout[d]) + h.a * P[k];
    }
  }
}

}  // namespace attention_detail

inline AttentionReference attention_reference(const AttentionCase& c, const std::vector<float>& qkv,
                                              const std::vector<float>& dout) {
  const int64_t W = int64_t(c.Hq + 2 * c.Hkv) * c.D, HD = int64_t(c.Hq) * c.D, G = c.Hq / c.Hkv;
  AttentionReference r;
  r.P.assign(size_t(c.B) * c.Hq * c.T * c.T, 0.0);
  r.o.assign(size_t(c.B) * c.T * HD, 0.0);
  r.lse.assign(size_t(c.B) * c.Hq * c.T, 0.0);
  r.lse_bound.assign(r.lse.size(), 0.0);
  r.out_bound.assign(r.o.size(), 0.0);
  r.dqkv_bound.assign(qkv.size(), 0.0);
  std::vector<double> eP;
  for (int b = 0; b < c.B; b++)
    for (int h = 0; h < c.Hq; h++) {
      const int64_t kc = (c.Hq + h / G) * c.D;
      const attention_detail::Head head{c, qkv, b, W, int64_t(h) * c.D, kc, kc + int64_t(c.Hkv) * c.D,
                                        c.half == 0 ? 1.0 / 256 : 1.0 / 2048, c.half == 0 ? 0.0 : std::ldexp(1.0, -25),
                                        1.0 / std::sqrt(double(c.D))};
      for (int t = 0; t < c.T; t++) {
        double* P = &r.P[((size_t(b) * c.Hq + h) * c.T + t) * c.T];
        const size_t orow = size_t((int64_t(b) * c.T + t) * HD + head.qc);
        const size_t row = (size_t(b) * c.Hq + h) * c.T + t;
        attention_detail::forward_row(head, t, P, eP, &r.lse[row], &r.lse_bound[row], &r.o[orow], &r.out_bound[orow]);
        attention_detail::backward_row(head, t, P, eP, &r.o[orow], &r.out_bound[orow], &dout[orow],
                                       r.dqkv_bound.data());
      }
    }
  return r;
}

// got (the 16-bit implementation) against want (the CPU backend's float32), element by element.
inline void expect_within(const std::vector<float>& got, const std::vector<float>& want,
                          const std::vector<double>& bound, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int bad = 0;
  double worst = 0;  // the largest error as a fraction of its element's tolerance
  for (size_t i = 0; i < got.size(); i++) {
    const double tol = 2 * bound[i] + 1e-7, err = std::fabs(double(got[i]) - want[i]);
    worst = std::max(worst, err / tol);
    if (!(err <= tol) && bad++ < 5)
      ADD_FAILURE() << what << "[" << i << "]: " << got[i] << " against the CPU's " << want[i] << " (tolerance "
                    << tol << ")";
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << got.size() << " elements outside their tolerance";
  testing::Test::RecordProperty(what + "_worst_fraction_of_tolerance", std::to_string(worst));
}

// The fused kernel's saved log-sum-exp (the first B Hq T floats of its saved state) against the
// double reference, within 2 x its bound plus 1e-7.
inline void expect_lse(const float* lse, const AttentionReference& r) {
  int bad = 0;
  for (size_t i = 0; i < r.lse.size(); i++) {
    const double tol = 2 * r.lse_bound[i] + 1e-7, err = std::fabs(lse[i] - r.lse[i]);
    if (!(err <= tol) && bad++ < 5)
      ADD_FAILURE() << "lse[" << i << "]: " << lse[i] << " against " << r.lse[i] << " (tolerance " << tol << ")";
  }
  EXPECT_EQ(bad, 0) << "saved log-sum-exp: " << bad << " of " << r.lse.size() << " outside their tolerance";
}

}  // namespace exatrain::test
