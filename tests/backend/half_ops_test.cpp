// Per-op harness for the 16-bit ops (mixed precision), on every backend: gemm_half against a
// float64 GEMM of the 16-bit-rounded inputs, within the error bound of float32 accumulation; the
// proof that the inputs really are rounded (the result is farther from the GEMM of the unrounded
// inputs than that bound); f32_to_half / half_to_f32 for bf16 and fp16 (nearest even, exact); the
// embedding lookups from a 16-bit copy (exact).
// tests/CMakeLists.txt runs the GemmHalf tests a second time with DNNL_MAX_CPU_ISA=AVX512_CORE,
// which makes the CPU backend take its conversion + sgemm path instead of oneDNN's bf16 matmul.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>

#include "backend/backend.hpp"
#include "op_harness.hpp"

using namespace exatrain;
using namespace exatrain::test;

namespace {

Backend* g_backend = nullptr;
Backend& be() { return *g_backend; }

class HalfOps : public testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    EXA_SKIP_IF_UNAVAILABLE(GetParam());  // "cuda" without a visible GPU: skipped, saying why
    g_backend = &backend_named(GetParam());
  }
};

// ---- references, independent of the backend's converters -----------------------------------------

double decode(Half t, uint16_t h) {
  if (t == Half::bf16) {
    const uint32_t u = uint32_t(h) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  const int e = (h >> 10) & 0x1f, m = h & 0x3ff;
  const double s = (h & 0x8000) ? -1.0 : 1.0;
  if (e == 0x1f) return m ? std::numeric_limits<double>::quiet_NaN() : s * HUGE_VAL;
  if (e == 0) return s * std::ldexp(double(m), -24);  // subnormal
  return s * std::ldexp(double(1024 + m), e - 25);
}

// 16-bit device copy of host floats, via the backend's converter.
struct HalfBuf {
  Backend& b;
  uint16_t* p;
  int64_t n;
  HalfBuf(Backend& be_, Half t, const std::vector<float>& host) : b(be_), n(int64_t(host.size())) {
    p = static_cast<uint16_t*>(b.alloc_bytes(sizeof(uint16_t) * size_t(n)));
    Buf src(b, to_d(host));
    b.f32_to_half(t, p, src.p, n);
  }
  ~HalfBuf() { b.free_bytes(p); }
  std::vector<uint16_t> get() const {
    std::vector<uint16_t> out(static_cast<size_t>(n));
    b.download(out.data(), p, sizeof(uint16_t) * size_t(n));
    return out;
  }
};

// ---- conversions -----------------------------------------------------------------------------------

// Whether h is the nearest 16-bit value to x (ties: even mantissa), fp16 overflowing to inf at
// 65520 (the midpoint between the largest half, 65504, and 2^16).
void expect_nearest_even(Half t, float x, uint16_t h) {
  const double got = decode(t, h);
  if (std::isnan(x)) {
    EXPECT_TRUE(std::isnan(got)) << x;
    return;
  }
  if (t == Half::f16 && std::fabs(double(x)) >= 65520.0) {
    EXPECT_EQ(got, std::copysign(HUGE_VAL, double(x))) << x;
    return;
  }
  ASSERT_FALSE(std::isinf(got)) << x;
  const double err = std::fabs(got - double(x));
  for (int d : {-1, 1}) {  // the neighbours of h (same sign) are no nearer
    const uint16_t nb = uint16_t(h + d);
    if ((nb & 0x7fff) == 0x7fff || ((h & 0x7fff) == 0 && d < 0)) continue;
    const double e2 = std::fabs(decode(t, nb) - double(x));
    if (std::isnan(e2)) continue;
    EXPECT_LE(err, e2) << "x = " << x << " h = " << h;
    if (err == e2) {
      EXPECT_EQ(h & 1, 0) << "tie not to even: x = " << x;
    }
  }
}

TEST_P(HalfOps, ConvertsToNearestEvenAndBackExactly) {
  std::mt19937 rng(7);
  std::vector<float> xs = {0.0f, -0.0f, 1.0f, -2.5f, 65504.0f, 65519.0f, 65520.0f, -70000.0f, 6.1035156e-05f,
                           5.9604645e-08f, 2.9802322e-08f, 1e-9f, 1.00048828125f /* fp16 tie */,
                           1.00390625f /* bf16 tie */, 3.0e38f, std::numeric_limits<float>::quiet_NaN()};
  std::uniform_real_distribution<float> mant(1.0f, 2.0f);
  std::uniform_int_distribution<int> ex(-30, 20);
  for (int i = 0; i < 4000; i++) xs.push_back((i % 2 ? -1.0f : 1.0f) * std::ldexp(mant(rng), ex(rng)));
  for (Half t : {Half::bf16, Half::f16}) {
    HalfBuf h(be(), t, xs);
    const std::vector<uint16_t> got = h.get();
    for (size_t i = 0; i < xs.size(); i++) expect_nearest_even(t, xs[i], got[i]);
    // half_to_f32 of every 16-bit pattern equals the reference decoding (NaN stays NaN).
    std::vector<uint16_t> all(65536);
    for (size_t i = 0; i < all.size(); i++) all[i] = uint16_t(i);
    uint16_t* dev = static_cast<uint16_t*>(be().alloc_bytes(sizeof(uint16_t) * all.size()));
    be().upload(dev, all.data(), sizeof(uint16_t) * all.size());
    Buf out(be(), all.size());
    be().half_to_f32(t, out.p, dev, int64_t(all.size()));
    const Vec back = out.get();
    for (size_t i = 0; i < all.size(); i++) {
      const double want = decode(t, uint16_t(i));
      if (std::isnan(want))
        EXPECT_TRUE(std::isnan(back[i])) << i;
      else
        EXPECT_EQ(back[i], want) << "pattern " << i;
    }
    be().free_bytes(dev);
  }
}

// ---- gemm_half -------------------------------------------------------------------------------------

struct Shape {
  bool ta, tb;
  int64_t M, N, K, pad;  // pad: extra row stride beyond the stored row length
};

// The elementwise bound of float32 accumulation (Higham, Accuracy and Stability, Thm 3.5 for a
// dot product of length K: |err| <= gamma_K sum |a b|, gamma_K ~ K u, u = 2^-24), plus the
// rounding of alpha * s + beta * c: (K + 2) u (|alpha| sum|a b| + |beta c|).
void check_gemm(Half t, const Shape& s, float alpha, float beta, std::mt19937& rng) {
  const int64_t ar = s.ta ? s.K : s.M, ac = s.ta ? s.M : s.K, br = s.tb ? s.N : s.K, bc = s.tb ? s.K : s.N;
  const int64_t lda = ac + s.pad, ldb = bc + s.pad, ldc = s.N + s.pad;
  const std::vector<float> A = to_f(random_vec(rng, size_t(ar * lda))), B = to_f(random_vec(rng, size_t(br * ldb)));
  const Vec C0 = random_vec(rng, size_t(s.M * ldc));
  HalfBuf a(be(), t, A), b(be(), t, B);
  const std::vector<uint16_t> ah = a.get(), bh = b.get();
  Buf c(be(), C0);
  be().gemm_half(t, s.ta, s.tb, s.M, s.N, s.K, alpha, a.p, lda, b.p, ldb, beta, c.p, ldc);
  const Vec got = c.get();
  const double u = std::ldexp(1.0, -24);
  int outside_rounded = 0, outside_unrounded = 0;
  for (int64_t i = 0; i < s.M; i++)
    for (int64_t j = 0; j < s.N; j++) {
      double ref = 0, ref_unrounded = 0, mag = 0;
      for (int64_t k = 0; k < s.K; k++) {
        const int64_t ia = s.ta ? k * lda + i : i * lda + k, ib = s.tb ? j * ldb + k : k * ldb + j;
        const double p = decode(t, ah[size_t(ia)]) * decode(t, bh[size_t(ib)]);
        ref += p, mag += std::fabs(p);
        ref_unrounded += double(A[size_t(ia)]) * double(B[size_t(ib)]);
      }
      const double c_in = beta == 0.0f ? 0.0 : double(float(C0[size_t(i * ldc + j)]));
      const double want = alpha * ref + beta * c_in, want_fp32 = alpha * ref_unrounded + beta * c_in;
      const double tol = double(s.K + 2) * u * (std::fabs(alpha) * mag + std::fabs(beta * c_in)) + 1e-30;
      const double g = got[size_t(i * ldc + j)];
      if (std::fabs(g - want) > tol && outside_rounded++ < 5)
        ADD_FAILURE() << "C[" << i << "," << j << "] = " << g << ", want " << want << " +- " << tol;
      if (std::fabs(g - want_fp32) > tol) outside_unrounded++;
    }
  EXPECT_EQ(outside_rounded, 0);
  // The inputs were rounded to 16 bits: most results lie outside the fp32 GEMM's error band.
  EXPECT_GT(outside_unrounded, s.M * s.N / 2) << "the result matches the unrounded fp32 GEMM";
  // The padding between rows of C is not written.
  for (int64_t i = 0; i < s.M; i++)
    for (int64_t j = s.N; j < ldc; j++) EXPECT_EQ(got[size_t(i * ldc + j)], float(C0[size_t(i * ldc + j)]));
}

// The lookups from a 16-bit copy (mixed precision reads the embeddings so): each element is the
// exact decoding of the copy's bits (rows outside the vocabulary slice 0, positions added to what
// out holds), on a slice that does not start at 0 and tokens on both sides of it.
TEST_P(HalfOps, EmbeddingLookupsWidenTheSixteenBitCopyExactly) {
  std::mt19937 rng(11);
  const int64_t B = 2, T = 5, C = 7, V = 9, start = 4, N = B * T;
  std::vector<int32_t> tok(static_cast<size_t>(N));
  std::uniform_int_distribution<int32_t> pick(0, int32_t(start + V + 2));
  for (auto& t : tok) t = pick(rng);
  tok[0] = int32_t(start), tok[1] = int32_t(start + V - 1), tok[2] = int32_t(start - 1), tok[3] = int32_t(start + V);
  auto* dtok = static_cast<int32_t*>(be().alloc_bytes(sizeof(int32_t) * size_t(N)));
  be().upload(dtok, tok.data(), sizeof(int32_t) * size_t(N));
  for (Half t : {Half::bf16, Half::f16}) {
    HalfBuf wte(be(), t, to_f(random_vec(rng, size_t(V * C)))), wpe(be(), t, to_f(random_vec(rng, size_t(T * C))));
    const Vec base = random_vec(rng, size_t(N * C));
    Buf out(be(), Vec(size_t(N * C), std::nan(""))), pos(be(), base);  // NaN: every element must be written
    be().embedding_forward_half(t, out.p, dtok, wte.p, start, V, N, C);
    be().positional_forward_half(t, pos.p, wpe.p, B, T, C);
    const Vec got = out.get(), got_pos = pos.get();
    const std::vector<uint16_t> w = wte.get(), p = wpe.get();
    for (int64_t n = 0; n < N; n++)
      for (int64_t c = 0; c < C; c++) {
        const int64_t r = tok[size_t(n)] - start;
        const size_t i = size_t(n * C + c);
        EXPECT_EQ(got[i], r >= 0 && r < V ? decode(t, w[size_t(r * C + c)]) : 0.0) << "row " << n << " col " << c;
        EXPECT_EQ(got_pos[i], double(float(base[i]) + float(decode(t, p[size_t((n % T) * C + c)])))) << i;
      }
  }
  be().free_bytes(dtok);
}

TEST_P(HalfOps, GemmHalfMatchesRoundedFloat64Reference) {
  std::mt19937 rng(3);
  for (Half t : {Half::bf16, Half::f16})
    for (int trial = 0; trial < 8; trial++) {
      const bool ta = trial & 1, tb = trial & 2;
      const Shape s{ta, tb, 1 + int64_t(rng() % 37), 1 + int64_t(rng() % 41), 2 + int64_t(rng() % 53),
                    trial & 4 ? 3 : 0};
      SCOPED_TRACE(testing::Message() << (t == Half::bf16 ? "bf16" : "fp16") << " ta " << ta << " tb " << tb
                                      << " M " << s.M << " N " << s.N << " K " << s.K);
      check_gemm(t, s, 1.0f, 0.0f, rng);
      check_gemm(t, s, 1.0f, 1.0f, rng);      // the gradient accumulation of dW += dY^T X
      check_gemm(t, s, -0.75f, 0.5f, rng);
    }
}

TEST_P(HalfOps, GemmHalfLargeShapesAboveTheThreadingThreshold) {
  std::mt19937 rng(5);
  // The model's shapes: forward (N, T), dX (N, N) and dW (T, N); 2 M N K > 4e6.
  for (const Shape& s : {Shape{false, true, 192, 160, 128, 0}, Shape{false, false, 192, 128, 160, 0},
                         Shape{true, false, 160, 128, 192, 0}}) {
    check_gemm(Half::bf16, s, 1.0f, 1.0f, rng);
    check_gemm(Half::f16, s, 1.0f, 0.0f, rng);
  }
}

TEST_P(HalfOps, GemmHalfBetaZeroIgnoresNanInC) {
  const int64_t M = 5, N = 7, K = 9;
  std::mt19937 rng(9);
  HalfBuf a(be(), Half::bf16, to_f(random_vec(rng, size_t(M * K)))), b(be(), Half::bf16, to_f(random_vec(rng, size_t(K * N))));
  Buf c(be(), Vec(size_t(M * N), std::nan("")));
  be().gemm_half(Half::bf16, false, false, M, N, K, 1.0f, a.p, K, b.p, N, 0.0f, c.p, N);
  for (double v : c.get()) EXPECT_TRUE(std::isfinite(v));
}

// The path is the one the CPU supports: oneDNN's bf16 matmul where /proc/cpuinfo lists avx512_bf16
// or amx_bf16 (unless DNNL_MAX_CPU_ISA caps oneDNN below them), else conversion + sgemm.
TEST_P(HalfOps, GemmHalfPathFollowsTheCpu) {
  if (GetParam().rfind("cpu", 0) != 0) GTEST_SKIP() << GetParam() << " is not a CPU backend: its path is its own";
  std::ifstream f("/proc/cpuinfo");
  const std::string info((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const bool bf16_isa = info.find("avx512_bf16") != std::string::npos || info.find("amx_bf16") != std::string::npos;
  const char* cap = std::getenv("DNNL_MAX_CPU_ISA");
  const std::string path = be().gemm_half_path(Half::bf16);
  if (bf16_isa && !cap)
    EXPECT_NE(path.find("oneDNN"), std::string::npos) << path;
  else
    EXPECT_NE(path.find("sgemm"), std::string::npos) << path;
  EXPECT_NE(be().gemm_half_path(Half::f16).find("sgemm"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(Backends, HalfOps, testing::ValuesIn(backend_names()), backend_test_name);

}  // namespace
