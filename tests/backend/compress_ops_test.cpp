// The gradient-compression ops (backend.hpp, "gradient compression") against plain host
// references, on the CPU and the guarded CPU backend: top-k by magnitude with its tie and NaN
// rules, the sampled threshold's draws, selection above a threshold, gather / scatter by index
// and by block (out-of-range indices refused), sums of |x|, 1-bit signs, Gram-Schmidt (against
// a double reference) and the index-list counts.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "core/check.hpp"
#include "op_harness.hpp"

namespace exatrain::test {
namespace {

class CompressOps : public testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { EXA_SKIP_IF_UNAVAILABLE(GetParam()); }
  Backend& be() { return backend_named(GetParam()); }
  // Device int32 arrays: float storage of the same size (as the compressors keep them).
  int32_t* ints(Buf& b) { return reinterpret_cast<int32_t*>(b.p); }
  std::vector<int32_t> get_ints(const Buf& b, size_t n) {
    std::vector<int32_t> v(n);
    be().download(v.data(), b.p, 4 * n);
    return v;
  }
  void put_ints(Buf& b, const std::vector<int32_t>& v) { be().upload(b.p, v.data(), 4 * v.size()); }
};

// The reference top-k: sort by (|x| descending, index ascending), keep k, sort by index.
std::vector<int32_t> ref_topk(const std::vector<float>& x, int64_t k) {
  std::vector<int32_t> order(x.size());
  std::iota(order.begin(), order.end(), 0);
  auto key = [&](int32_t i) { return std::isnan(x[size_t(i)]) ? INFINITY : std::fabs(x[size_t(i)]); };
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return key(a) > key(b); });
  order.resize(size_t(k));
  std::sort(order.begin(), order.end());
  return order;
}

TEST_P(CompressOps, TopkMatchesTheSortedReferenceWithTiesByIndexAndBase) {
  std::mt19937 rng(7);
  for (int64_t n : {1, 7, 1000, 40000, 150000}) {  // nth_element below 2^17, radix selection above
    Vec xd = random_vec(rng, size_t(n));
    for (int64_t i = 0; i < n; i += 5) xd[size_t(i)] = 0.5;   // ties
    for (int64_t i = 3; i < n; i += 11) xd[size_t(i)] = -0.5;  // the same magnitude, negative
    const std::vector<float> x = to_f(xd);
    for (int64_t k : {int64_t(0), int64_t(1), std::max<int64_t>(1, n / 100), n / 2, n}) {
      Buf dx(be(), xd), di(be(), size_t(std::max<int64_t>(k, 1))), dv(be(), size_t(std::max<int64_t>(k, 1)));
      be().topk_abs(ints(di), dv.p, dx.p, n, k, 100);
      if (k == 0) continue;
      const std::vector<int32_t> want = ref_topk(x, k);
      const std::vector<int32_t> got = get_ints(di, size_t(k));
      const Vec vals = dv.get();
      for (int64_t i = 0; i < k; i++) {
        ASSERT_EQ(got[size_t(i)], want[size_t(i)] + 100) << "n " << n << " k " << k << " i " << i;
        ASSERT_EQ(float(vals[size_t(i)]), x[size_t(want[size_t(i)])]);
      }
    }
  }
}

TEST_P(CompressOps, TopkCountsANanAsTheLargest) {
  Vec xd = {1, -3, 2, 0, 5};
  xd[3] = std::nan("");
  Buf dx(be(), xd), di(be(), 2), dv(be(), 2);
  be().topk_abs(ints(di), dv.p, dx.p, 5, 2, 0);
  EXPECT_EQ(get_ints(di, 2), (std::vector<int32_t>{3, 4}));
  EXPECT_TRUE(std::isnan(dv.get()[0]));
}

// Magnitudes that share their upper 16 bits and differ below (the radix selection's second
// histogram, used from 2^17 elements; nth_element below), NaN and +-inf (equal keys: ties by
// index), +-0, subnormals and long runs of ties, at k from 0 to n in steps of about n / 23, and n.
TEST_P(CompressOps, TopkMatchesTheReferenceOnSpecialValuesAndNearKeys) {
  std::mt19937 rng(11);
  const std::vector<float> pool = {0.0f, -0.0f, 1e-45f, -3e-44f, 1.0f, -1.0f, std::nextafter(1.0f, 2.0f),
                                   -std::nextafter(1.0f, 2.0f), 1.0000153f, 1.5f, -1.5f, INFINITY, -INFINITY,
                                   std::nanf(""), 3e38f};
  for (int64_t n : {1, 2, 17, 3000, 140000}) {
    std::vector<float> x(static_cast<size_t>(n));
    for (float& v : x) v = pool[rng() % pool.size()];
    Vec xd(x.begin(), x.end());
    std::vector<int64_t> ks;
    for (int64_t k = 0; k < n; k += std::max<int64_t>(1, n / 23)) ks.push_back(k);
    ks.push_back(n);
    for (int64_t k : ks) {
      Buf dx(be(), xd), di(be(), size_t(std::max<int64_t>(k, 1))), dv(be(), size_t(std::max<int64_t>(k, 1)));
      be().topk_abs(ints(di), dv.p, dx.p, n, k, 7);
      if (k == 0) continue;
      const std::vector<int32_t> want = ref_topk(x, k), got = get_ints(di, size_t(k));
      const Vec vals = dv.get();
      for (int64_t i = 0; i < k; i++) {
        ASSERT_EQ(got[size_t(i)], want[size_t(i)] + 7) << "n " << n << " k " << k << " i " << i;
        const float w = x[size_t(want[size_t(i)])], g = float(vals[size_t(i)]);
        ASSERT_TRUE(std::memcmp(&w, &g, sizeof w) == 0 || (std::isnan(w) && std::isnan(g))) << "n " << n << " i " << i;
      }
    }
  }
}

TEST_P(CompressOps, SampleDrawsOneMagnitudePerStratumReproducibly) {
  std::mt19937 rng(3);
  const int64_t n = 1003, s = 17;
  Vec xd = random_vec(rng, size_t(n));
  Buf dx(be(), xd), a(be(), size_t(s)), b(be(), size_t(s)), c(be(), size_t(s));
  be().sample_abs(a.p, dx.p, n, s, 42);
  be().sample_abs(b.p, dx.p, n, s, 42);
  be().sample_abs(c.p, dx.p, n, s, 43);
  const Vec va = a.get(), vb = b.get(), vc = c.get();
  EXPECT_EQ(va, vb);
  EXPECT_NE(va, vc);
  for (int64_t j = 0; j < s; j++) {  // |x| of an element of stratum j
    bool found = false;
    for (int64_t i = j * n / s; i < (j + 1) * n / s; i++) found = found || std::fabs(float(xd[size_t(i)])) == float(va[size_t(j)]);
    EXPECT_TRUE(found) << "sample " << j;
  }
}

TEST_P(CompressOps, SelectAboveThresholdCountsAllAndWritesTheFirstCap) {
  Vec xd = {0.1, -2, 3, 0.5, -0.5, 4, 0};
  Buf dx(be(), xd), di(be(), 3), dv(be(), 3);
  EXPECT_EQ(be().select_abs_at_least(ints(di), dv.p, dx.p, 7, 0.5f, 3, 10), 5);
  EXPECT_EQ(get_ints(di, 3), (std::vector<int32_t>{11, 12, 13}));
  EXPECT_EQ(dv.get(), (Vec{-2, 3, 0.5}));
}

TEST_P(CompressOps, GatherScatterFillByIndexAndRefuseIndicesOutside) {
  Vec xd = {10, 11, 12, 13, 14, 15};
  Buf dx(be(), xd), di(be(), 4), dv(be(), 4), out(be(), 4);
  put_ints(di, {5, 0, 2, 2});
  be().gather(out.p, dx.p, 6, ints(di), 4);
  EXPECT_EQ(out.get(), (Vec{15, 10, 12, 12}));
  Buf vals(be(), Vec{1, 2, 3, 4});
  be().scatter_add(dx.p, 6, ints(di), vals.p, 4, 0);  // index 2 twice: 12 + 3 + 4
  EXPECT_EQ(dx.get(), (Vec{12, 11, 19, 13, 14, 16}));
  put_ints(di, {105, 100, 102, 102});  // base 100: a region starting at index 100
  be().scatter_add(dx.p, 6, ints(di), vals.p, 4, 100);
  EXPECT_EQ(dx.get(), (Vec{14, 11, 26, 13, 14, 17}));
  put_ints(di, {4, 1});
  be().scatter_fill(dx.p, 6, ints(di), 2, -1.0f);
  EXPECT_EQ(dx.get(), (Vec{14, -1, 26, 13, -1, 17}));
}

TEST_P(CompressOps, OutOfRangeIndicesAreAnErrorNamingTheOp) {
  Buf dx(be(), Vec{1, 2, 3}), di(be(), 1), out(be(), 1);
  put_ints(di, {3});
  try {
    be().gather(out.p, dx.p, 3, ints(di), 1);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("gather: index 0 = 3 outside the buffer of 3 elements"), std::string::npos)
        << e.what();
  }
  put_ints(di, {-1});
  EXPECT_THROW(be().scatter_add(dx.p, 3, ints(di), out.p, 1, 0), Error);
  EXPECT_THROW(be().scatter_fill(dx.p, 3, ints(di), 1, 0.0f), Error);
}

TEST_P(CompressOps, BlocksGatherScatterFillAndNormsWithAShortLastBlock) {
  const int64_t n = 10, B = 4;  // blocks [0,4) [4,8) [8,10)
  Vec xd = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  Buf dx(be(), xd), norms(be(), 3), blocks(be(), 2), vals(be(), 8);
  be().block_sum_squares(norms.p, dx.p, n, B);
  EXPECT_EQ(norms.get(), (Vec{30, 174, 181}));
  put_ints(blocks, {2, 0});
  be().gather_blocks(vals.p, dx.p, n, ints(blocks), 2, B);
  EXPECT_EQ(vals.get(), (Vec{9, 10, 0, 0, 1, 2, 3, 4}));
  be().scatter_add_blocks(dx.p, n, ints(blocks), vals.p, 2, B);
  EXPECT_EQ(dx.get(), (Vec{2, 4, 6, 8, 5, 6, 7, 8, 18, 20}));
  be().fill_blocks(dx.p, n, ints(blocks), 1, B, 0.0f);
  EXPECT_EQ(dx.get(), (Vec{2, 4, 6, 8, 5, 6, 7, 8, 0, 0}));
  put_ints(blocks, {3, 0});
  EXPECT_THROW(be().gather_blocks(vals.p, dx.p, n, ints(blocks), 1, B), Error);
}

TEST_P(CompressOps, SignsPackAndUnpackWithScaleAndSumAbs) {
  std::mt19937 rng(5);
  const int64_t n = 77;  // 3 words, the last partly used
  Vec xd = random_vec(rng, size_t(n));
  xd[4] = 0;  // 0 counts as +
  Buf dx(be(), xd), bits(be(), 3), y(be(), Vec(size_t(n), 1.0));
  be().sign_pack(ints(bits), dx.p, n);
  be().sign_unpack_add(y.p, ints(bits), n, 0.25f);
  const Vec got = y.get();
  double abs = 0;
  for (int64_t i = 0; i < n; i++) {
    EXPECT_EQ(got[size_t(i)], xd[size_t(i)] >= 0 ? 1.25 : 0.75) << i;
    abs += std::fabs(xd[size_t(i)]);
  }
  EXPECT_NEAR(be().sum_abs(dx.p, n), abs, 1e-9 * abs);
  const std::vector<int32_t> words = get_ints(bits, 3);
  EXPECT_EQ(uint32_t(words[2]) >> (77 - 64), 0u);  // bits past n are unset
}

TEST_P(CompressOps, GramSchmidtMatchesADoubleReferenceAndGivesOrthonormalColumns) {
  std::mt19937 rng(11);
  const int64_t rows = 37, cols = 4;
  Vec a = random_vec(rng, size_t(rows * cols));
  Buf dp(be(), a);
  be().orthonormalize_columns(dp.p, rows, cols);
  Vec q = a;  // the reference: classical order as PyTorch's _orthogonalize_gram_schmidt, epsilon 0
  for (int64_t c = 0; c < cols; c++) {
    double norm = 0;
    for (int64_t r = 0; r < rows; r++) norm += q[size_t(r * cols + c)] * q[size_t(r * cols + c)];
    norm = std::sqrt(norm);
    for (int64_t r = 0; r < rows; r++) q[size_t(r * cols + c)] /= norm;
    for (int64_t d = c + 1; d < cols; d++) {
      double dot = 0;
      for (int64_t r = 0; r < rows; r++) dot += q[size_t(r * cols + c)] * q[size_t(r * cols + d)];
      for (int64_t r = 0; r < rows; r++) q[size_t(r * cols + d)] -= dot * q[size_t(r * cols + c)];
    }
  }
  const Vec got = dp.get();
  expect_close(got, q, 1e-6, "orthonormalized P");
  for (int64_t c = 0; c < cols; c++)
    for (int64_t d = 0; d < cols; d++) {
      double dot = 0;
      for (int64_t r = 0; r < rows; r++) dot += got[size_t(r * cols + c)] * got[size_t(r * cols + d)];
      EXPECT_NEAR(dot, c == d ? 1.0 : 0.0, 1e-6) << c << "," << d;
    }
}

TEST_P(CompressOps, GramSchmidtKeepsARankDeficientMatrixOrthonormalAndAZeroColumnZero) {
  const int64_t rows = 40, cols = 3;
  Vec a(size_t(rows * cols));
  for (int64_t r = 0; r < rows; r++) {
    const float x = float(std::cos(0.3 * double(r)));
    a[size_t(r * cols)] = x, a[size_t(r * cols + 1)] = 2.5f * x, a[size_t(r * cols + 2)] = 0;  // rank 1, and a zero column
  }
  Buf dp(be(), a);
  be().orthonormalize_columns(dp.p, rows, cols);
  const Vec got = dp.get();
  double d01 = 0, d00 = 0, d22 = 0;
  for (int64_t r = 0; r < rows; r++)
    d01 += got[size_t(r * cols)] * got[size_t(r * cols + 1)], d00 += got[size_t(r * cols)] * got[size_t(r * cols)],
        d22 += got[size_t(r * cols + 2)] * got[size_t(r * cols + 2)];
  EXPECT_NEAR(d00, 1.0, 1e-6);
  EXPECT_NEAR(d01, 0.0, 1e-6);  // the dependent column is rounding noise, normalised, yet orthogonal
  EXPECT_EQ(d22, 0.0);
}

TEST_P(CompressOps, IndexListCounts) {
  Buf a(be(), 5), b(be(), 4);
  put_ints(a, {1, 4, 7, 9, 20});
  put_ints(b, {0, 4, 9, 21});
  EXPECT_EQ(be().count_common(ints(a), 5, ints(b), 4), 2);
  EXPECT_EQ(be().count_common(ints(a), 0, ints(b), 4), 0);
  const int64_t bounds[] = {0, 5, 9, 10, 100};
  int64_t below[5];
  be().count_below(below, ints(a), 5, bounds, 5);
  EXPECT_EQ(std::vector<int64_t>(below, below + 5), (std::vector<int64_t>{0, 2, 3, 4, 5}));
}

INSTANTIATE_TEST_SUITE_P(Backends, CompressOps, testing::ValuesIn(backend_names()), backend_test_name);

}  // namespace
}  // namespace exatrain::test
