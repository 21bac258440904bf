// The 16-bit GEMM and conversions (Backend::gemm_half, f32_to_half, half_to_f32) on every backend
// (op_harness.hpp; "cuda" skips, saying why, without a GPU).
//   Conversions: float32 -> f16 against GCC's _Float16 conversion (IEEE round to nearest even, an
//   independent implementation), over every exponent and the special values; f16 -> float32 exact
//   for all 65536 patterns; bf16 through the same entry points as f32_to_bf16.
//   GEMM: the tolerances follow from the formats (Higham, Accuracy and Stability of Numerical
//   Algorithms, 2nd ed., eq. 3.5: |fl(x.y) - x.y| <= gamma_K sum |x_k y_k|, gamma_K = K u / (1 - K u)):
//   * on inputs already 16-bit (the reference uses the same values), products of two 8- or 11-bit
//     significands are exact in float32, so the only error is float32 accumulation:
//     |C - C_ref| <= gamma_K(2^-24) sum_k |a_ik b_kj|. A GEMM accumulating in bf16 (u = 2^-9) fails it.
//   * against the float32 inputs before rounding, each product also carries the inputs' rounding,
//     (1 + d_a)(1 + d_b) with |d| <= u, the format's unit roundoff 2^-p (p significant bits: bf16
//     p = 8, u = 2^-8, the "bf16 epsilon" of issue 13; f16 p = 11, u = 2^-11): the bound grows by
//     (2 u + u^2) sum |a b|.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "backend/backend.hpp"
#include "op_harness.hpp"

using namespace exatrain;
using namespace exatrain::test;

namespace {

class HalfFormats : public testing::TestWithParam<std::string> {
 public:
  void SetUp() override { EXA_SKIP_IF_UNAVAILABLE(GetParam()); }
  Backend& be() { return backend_named(GetParam()); }

  std::vector<uint16_t> to_half_public(Half t, const std::vector<float>& x) { return to_half(t, x); }
  std::vector<float> to_f32_public(Half t, const std::vector<uint16_t>& x) { return to_f32(t, x); }
  std::vector<uint16_t> to_half(Half t, const std::vector<float>& x) {
    float* d = be().alloc(int64_t(x.size()));
    auto* h = static_cast<uint16_t*>(be().alloc_bytes(2 * x.size() + 2));
    be().upload(d, x.data(), 4 * x.size());
    be().f32_to_half(t, h, d, int64_t(x.size()));
    std::vector<uint16_t> out(x.size());
    be().download(out.data(), h, 2 * x.size());
    be().free_bytes(d), be().free_bytes(h);
    return out;
  }
  std::vector<float> to_f32(Half t, const std::vector<uint16_t>& x) {
    auto* h = static_cast<uint16_t*>(be().alloc_bytes(2 * x.size() + 2));
    float* d = be().alloc(int64_t(x.size()));
    be().upload(h, x.data(), 2 * x.size());
    be().half_to_f32(t, d, h, int64_t(x.size()));
    std::vector<float> out(x.size());
    be().download(out.data(), d, 4 * x.size());
    be().free_bytes(d), be().free_bytes(h);
    return out;
  }
};

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
uint16_t gcc_f16(float f) {
  const _Float16 h = static_cast<_Float16>(f);
  uint16_t u;
  std::memcpy(&u, &h, 2);
  return u;
}

TEST_P(HalfFormats, F16RoundsToNearestEvenAsIeeeOverEveryExponent) {
  std::mt19937 rng(5);
  std::vector<float> x = {0.0f, -0.0f, 1.0f, -2.5f, 65504.0f, 65519.99f, 65520.0f, -65520.0f, 1e9f, INFINITY,
                          -INFINITY, 5.9604645e-08f, 2.9802322e-08f, 2.9802326e-08f, 8.940697e-08f, 6.1035156e-05f,
                          6.1031434e-05f, 1e-30f, -1e-45f};
  for (int e = -30; e <= 17; e++)  // every exponent a half can hold (and its subnormal range), random significands
    for (int i = 0; i < 200; i++) {
      const uint32_t u = (bits(std::ldexp(1.0f, e)) & 0xff800000u) | (rng() & 0x807fffffu);
      float f;
      std::memcpy(&f, &u, 4);
      x.push_back(f);
    }
  for (int i = 0; i < 64; i++) x.push_back(std::ldexp(float(2 * i + 1), -25 - i % 3));  // ties at the subnormal steps
  const auto got = to_half(Half::f16, x);
  int bad = 0;
  for (size_t i = 0; i < x.size(); i++)
    if (got[i] != gcc_f16(x[i]) && bad++ < 5)
      ADD_FAILURE() << std::hexfloat << x[i] << ": got 0x" << std::hex << got[i] << " want 0x" << gcc_f16(x[i]);
  const auto nan = to_half(Half::f16, {NAN, -NAN});
  EXPECT_EQ(nan[0] & 0x7c00u, 0x7c00u);
  EXPECT_NE(nan[0] & 0x03ffu, 0u);  // still a NaN
}

TEST_P(HalfFormats, HalfToF32IsExactForEveryPatternAndBf16MatchesItsOwnOp) {
  std::vector<uint16_t> all(65536);
  for (uint32_t i = 0; i < 65536; i++) all[i] = uint16_t(i);
  const auto f16 = to_f32(Half::f16, all), bf16 = to_f32(Half::bf16, all);
  for (uint32_t i = 0; i < 65536; i++) {
    _Float16 h;
    std::memcpy(&h, &all[i], 2);
    const float want = static_cast<float>(h);
    ASSERT_TRUE(std::isnan(want) ? std::isnan(f16[i]) : bits(f16[i]) == bits(want)) << "f16 0x" << std::hex << i;
    ASSERT_EQ(bits(bf16[i]), i << 16) << "bf16 0x" << std::hex << i;
  }
  std::mt19937 rng(3);
  std::vector<float> x(1000);
  for (auto& v : x) v = std::normal_distribution<float>(0, 100)(rng);
  float* d = be().alloc(1000);
  auto* h = static_cast<uint16_t*>(be().alloc_bytes(2000));
  be().upload(d, x.data(), 4000);
  be().f32_to_bf16(h, d, 1000);
  std::vector<uint16_t> via_bf16(1000);
  be().download(via_bf16.data(), h, 2000);
  EXPECT_EQ(to_half(Half::bf16, x), via_bf16);
  be().free_bytes(d), be().free_bytes(h);
}

// One gemm_half against both bounds of the header comment.
void check_gemm(HalfFormats& t, Backend& be, Half type, bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                std::mt19937& rng) {
  SCOPED_TRACE(testing::Message() << (type == Half::bf16 ? "bf16" : "f16") << " ta=" << ta << " tb=" << tb
                                  << " M=" << M << " N=" << N << " K=" << K);
  const int64_t lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 1, ldc = N + 2;  // padded rows
  const int64_t ra = ta ? K : M, rb = tb ? N : K;
  std::normal_distribution<float> d(0, 1);
  std::vector<float> a(size_t(ra * lda)), b(size_t(rb * ldb)), c(size_t(M * ldc));
  for (auto& v : a) v = d(rng);
  for (auto& v : b) v = d(rng);
  for (auto& v : c) v = d(rng);
  const auto ah = t.to_half_public(type, a), bh = t.to_half_public(type, b);
  const auto ar = t.to_f32_public(type, ah), br = t.to_f32_public(type, bh);  // the rounded inputs, exactly
  const float alpha = 0.75f, beta = -0.5f;
  auto* dA = static_cast<uint16_t*>(be.alloc_bytes(2 * ah.size()));
  auto* dB = static_cast<uint16_t*>(be.alloc_bytes(2 * bh.size()));
  float* dC = be.alloc(int64_t(c.size()));
  be.upload(dA, ah.data(), 2 * ah.size()), be.upload(dB, bh.data(), 2 * bh.size());
  be.upload(dC, c.data(), 4 * c.size());
  be.gemm_half(type, ta, tb, M, N, K, alpha, dA, lda, dB, ldb, beta, dC, ldc);
  std::vector<float> got(c.size());
  be.download(got.data(), dC, 4 * c.size());
  be.free_bytes(dA), be.free_bytes(dB), be.free_bytes(dC);
  const double u32 = std::ldexp(1.0, -24), gamma = double(K) * u32 / (1 - double(K) * u32);
  const double u16 = type == Half::bf16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);  // 2^-p
  int bad = 0;
  for (int64_t i = 0; i < M; i++)
    for (int64_t j = 0; j < N; j++) {
      double exact_r = 0, exact_f = 0, mag = 0;
      for (int64_t k = 0; k < K; k++) {
        const size_t ia = size_t(ta ? k * lda + i : i * lda + k), ib = size_t(tb ? j * ldb + k : k * ldb + j);
        exact_r += double(ar[ia]) * br[ib];
        exact_f += double(a[ia]) * b[ib];
        mag += std::fabs(double(ar[ia]) * br[ib]);
      }
      const double cij = c[size_t(i * ldc + j)], g = got[size_t(i * ldc + j)];
      // alpha and beta C add two float32 roundings of the result (|alpha C_ab| + |beta C|) u32.
      const double round_out = 2 * u32 * (std::fabs(alpha * exact_r) + std::fabs(beta * cij));
      const double tol_r = alpha * gamma * mag + round_out;
      const double tol_f = alpha * (gamma + 2 * u16 + u16 * u16) * (mag * (1 + 2 * u16)) + round_out;
      const double want_r = alpha * exact_r + beta * cij, want_f = alpha * exact_f + beta * cij;
      if ((std::fabs(g - want_r) > tol_r || std::fabs(g - want_f) > tol_f) && bad++ < 5)
        ADD_FAILURE() << "C[" << i << "," << j << "] = " << g << ": rounded-input reference " << want_r << " (tol "
                      << tol_r << "), float32-input reference " << want_f << " (tol " << tol_f << ")";
    }
  EXPECT_EQ(bad, 0);
}

TEST_P(HalfFormats, GemmHalfAccumulatesInFloat32WithinTheFormatsBounds) {
  std::mt19937 rng(11);
  for (Half type : {Half::bf16, Half::f16})
    for (int trial = 0; trial < 4; trial++) {
      const bool ta = trial & 1, tb = trial & 2;
      check_gemm(*this, be(), type, ta, tb, 17, 9, 3, rng);
      check_gemm(*this, be(), type, ta, tb, 64, 48, 1000, rng);  // long K: the accumulation's bound matters
    }
}

// The conversion path's float32 operand copies are working memory the backend holds outside its
// allocations: scratch_bytes reports them (the trainer's accounted_bytes adds it), at least the
// largest GEMM's op(A) and op(B) so far, and they are kept (not regrown) for a smaller GEMM.
// fp16 always takes the conversion path on the CPU (oneDNN 2.6 has no fp16 matmul).
TEST(HalfScratch, CpuConversionPathReportsItsOperandCopies) {
  std::unique_ptr<Backend> be = make_cpu_backend(1);
  EXPECT_EQ(be->scratch_bytes(), 0);
  const int64_t M = 40, N = 24, K = 300;
  auto* A = static_cast<uint16_t*>(be->alloc_bytes(2 * size_t(M * K)));
  auto* B = static_cast<uint16_t*>(be->alloc_bytes(2 * size_t(K * N)));
  float* C = be->alloc(M * N);
  be->gemm_half(Half::f16, false, false, M, N, K, 1.0f, A, K, B, N, 0.0f, C, N);
  const int64_t after = be->scratch_bytes();
  EXPECT_GE(after, int64_t(sizeof(float)) * (M * K + K * N));
  EXPECT_LE(after, 4 * int64_t(sizeof(float)) * (M * K + K * N + 2));  // capacity, not a leak per call
  be->gemm_half(Half::f16, false, false, 8, 8, 8, 1.0f, A, 8, B, 8, 0.0f, C, 8);
  EXPECT_EQ(be->scratch_bytes(), after);
  be->free_bytes(A), be->free_bytes(B), be->free_bytes(C);
}

}  // namespace

INSTANTIATE_TEST_SUITE_P(Backends, HalfFormats, testing::ValuesIn(backend_names()), backend_test_name);
