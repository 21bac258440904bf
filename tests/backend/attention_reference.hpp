// A double-precision reference of causal grouped-query attention and per-element error bounds for
// an implementation that rounds to a 16-bit format (the CUDA backend's fused kernel), shared by its
// emulated test (flash_attention_emulated_test.cpp) and its GPU test (cuda_test.cpp). Both compare
// that implementation against the CPU backend's float32 attention on the same (16-bit) q, k, v.
//
// The bounds are first-order, per element, from the format's unit roundoff u (2^-8 bf16, 2^-11
// f16) and float32's e = 2^-24 with g(n) = n e for a sum of n terms; P, o, dP, delta and dS are the
// double reference's. For query t and key k (s the scaled score, |s| its sum of |q_d k_d| / sqrt(D)):
//   score error      es_tk  = 2 g(D) |s|_tk                     (both sides' float32 dot products)
//   probability      eP_tk  = P_tk (2 max_k es_tk + g(T) + 4e)  (exp of perturbed scores, the sum)
//   out[t]           sum_k (u P_tk + eP_tk) |v_k| + g(T) sum_k P_tk |v_k|   (P rounded to 16 bits)
//   dP               edp_tk = (u + 2 g(D)) |dout_t|.|v_k|                    (dout rounded)
//   delta            ed_t   = |dout_t|.(u |o_t| + bound(out[t])) + 2 g(D) |dout_t|.|o_t|   (o rounded)
//   dS               e_tk   = eP_tk |dP_tk - delta_t| + P_tk (edp_tk + ed_t) + u |dS_tk|  (dS rounded)
//   dq[t]            scale (sum_k e_tk |k_k| + g(T) sum_k |dS_tk| |k_k|)
//   dk[k]            scale (sum_t e_tk |q_t| + g(G T) sum_t |dS_tk| |q_t|)   (t over the group's heads)
//   dv[k]            sum_t (2u P_tk + eP_tk) |dout_t| + g(G T) sum_t P_tk |dout_t|  (P and dout rounded)
// An element passes within 2 x its bound (the second-order terms, the tensor cores' accumulation,
// which does not round to nearest) plus 1e-7.
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
  std::vector<double> P, o, lse, out_bound, dqkv_bound;
};

namespace attention_detail {

struct Head {  // one (batch, query head): where its columns are in qkv's rows
  const AttentionCase& c;
  const std::vector<float>& qkv;
  int b;
  int64_t W, qc, kc, vc;
  double u, scale;
  double at(int t, int64_t col) const { return qkv[size_t((int64_t(b) * c.T + t) * W + col)]; }
};

constexpr double kE = 1.0 / 16777216;  // float32's unit roundoff, 2^-24
inline double g(double n) { return n * kE; }

// Row t of P (and eP, the bound on its error), its lse, and of o with its bound.
inline void forward_row(const Head& h, int t, double* P, std::vector<double>& eP, double* lse, double* o,
                        double* ob) {
  const int D = h.c.D;
  std::vector<double> es(size_t(t + 1));
  double mx = -1e300, sum = 0, es_max = 0;
  for (int k = 0; k <= t; k++) {
    double s = 0, sa = 0;
    for (int d = 0; d < D; d++) {
      s += h.at(t, h.qc + d) * h.at(k, h.kc + d);
      sa += std::fabs(h.at(t, h.qc + d) * h.at(k, h.kc + d));
    }
    P[k] = s * h.scale;
    es_max = std::max(es_max, 2 * g(D) * sa * h.scale);
    mx = std::max(mx, P[k]);
  }
  for (int k = 0; k <= t; k++) sum += (P[k] = std::exp(P[k] - mx));
  *lse = (mx + std::log(sum)) / std::log(2.0);
  eP.assign(size_t(t + 1), 0.0);
  for (int k = 0; k <= t; k++) {
    P[k] /= sum;
    eP[size_t(k)] = P[k] * (2 * es_max + g(h.c.T) + 4 * kE);
  }
  for (int d = 0; d < D; d++)
    for (int k = 0; k <= t; k++) {
      const double v = h.at(k, h.vc + d);
      o[d] += P[k] * v;
      ob[d] += (h.u * P[k] + eP[size_t(k)] + g(h.c.T) * P[k]) * std::fabs(v);
    }
}

// Adds row t's share of the bounds on dq (its own row), dk and dv (every key k <= t).
inline void backward_row(const Head& h, int t, const double* P, const std::vector<double>& eP, const double* o,
                         const double* ob, const float* dout, double* bound) {
  const int D = h.c.D;
  const double gT = g(h.c.T), gGT = g(double(h.c.T) * (h.c.Hq / h.c.Hkv));
  double delta = 0, dout_o = 0, ed = 0;
  for (int d = 0; d < D; d++) {
    delta += dout[d] * o[d];
    dout_o += std::fabs(dout[d] * o[d]);
    ed += std::fabs(dout[d]) * (h.u * std::fabs(o[d]) + ob[d]);
  }
  ed += 2 * g(D) * dout_o;
  const size_t qrow = size_t((int64_t(h.b) * h.c.T + t) * h.W);
  for (int k = 0; k <= t; k++) {
    double dp = 0, dout_v = 0;
    for (int d = 0; d < D; d++) {
      dp += dout[d] * h.at(k, h.vc + d);
      dout_v += std::fabs(dout[d] * h.at(k, h.vc + d));
    }
    const double ds = P[k] * (dp - delta), edp = (h.u + 2 * g(D)) * dout_v;
    const double e = eP[size_t(k)] * std::fabs(dp - delta) + P[k] * (edp + ed) + h.u * std::fabs(ds);
    const size_t krow = size_t((int64_t(h.b) * h.c.T + k) * h.W);
    for (int d = 0; d < D; d++) {
      bound[qrow + h.qc + d] += h.scale * (e + gT * std::fabs(ds)) * std::fabs(h.at(k, h.kc + d));
      bound[krow + h.kc + d] += h.scale * (e + gGT * std::fabs(ds)) * std::fabs(h.at(t, h.qc + d));
      bound[krow + h.vc + d] += (2 * h.u * P[k] + eP[size_t(k)] + gGT * P[k]) * std::fabs(dout[d]);
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
  r.out_bound.assign(r.o.size(), 0.0);
  r.dqkv_bound.assign(qkv.size(), 0.0);
  std::vector<double> eP;
  for (int b = 0; b < c.B; b++)
    for (int h = 0; h < c.Hq; h++) {
      const int64_t kc = (c.Hq + h / G) * c.D;
      const attention_detail::Head head{c, qkv, b, W, int64_t(h) * c.D, kc, kc + int64_t(c.Hkv) * c.D,
                                        c.half == 0 ? 1.0 / 256 : 1.0 / 2048, 1.0 / std::sqrt(double(c.D))};
      for (int t = 0; t < c.T; t++) {
        double* P = &r.P[((size_t(b) * c.Hq + h) * c.T + t) * c.T];
        const size_t orow = size_t((int64_t(b) * c.T + t) * HD + head.qc);
        attention_detail::forward_row(head, t, P, eP, &r.lse[(size_t(b) * c.Hq + h) * c.T + t], &r.o[orow],
                                      &r.out_bound[orow]);
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
// double reference, within float32's error of a sum of T exponentials (relative 1e-5 of 1 + |lse|).
inline void expect_lse(const float* lse, const AttentionReference& r) {
  double worst = 0;
  for (size_t i = 0; i < r.lse.size(); i++)
    worst = std::max(worst, std::fabs(lse[i] - r.lse[i]) / (1 + std::fabs(r.lse[i])));
  EXPECT_LT(worst, 1e-5) << "the saved log-sum-exp";
}

}  // namespace exatrain::test
