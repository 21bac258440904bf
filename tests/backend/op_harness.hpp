// Helpers for the per-op harness: random data, naive double references, finite differences.
#pragma once
#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.hpp"

namespace exatrain::test {

// The backends every op is checked on: the per-op tests are value-parameterised over these
// names (INSTANTIATE_TEST_SUITE_P(..., testing::ValuesIn(backend_names()), backend_test_name)).
// "cuda" when this build has the CUDA backend (EXATRAIN_CUDA); its tests skip, saying why, where
// no GPU is visible (EXA_SKIP_IF_UNAVAILABLE in every fixture's SetUp).
inline std::vector<std::string> backend_names() {
  std::vector<std::string> names{"cpu", "cpu-guarded"};
  if (cuda_backend_built()) names.push_back("cuda");
  return names;
}

// Why backend `name` cannot run in this process ("" when it can): "cuda" without a visible device.
inline std::string unavailable(const std::string& name) {
  std::string why;
  if (name == "cuda" && visible_cuda_devices(&why) == 0) return why;
  return "";
}
#define EXA_SKIP_IF_UNAVAILABLE(name)                                                   \
  do {                                                                                  \
    if (const std::string why_ = ::exatrain::test::unavailable(name); !why_.empty()) \
      GTEST_SKIP() << "backend " << (name) << ": " << why_;                            \
  } while (0)

// One backend per name for the whole test program, 2 threads, parallel paths forced
// (parallel_min_work = 0).
inline Backend& backend_named(const std::string& name) {
  static std::map<std::string, std::unique_ptr<Backend>> cache;
  auto& b = cache[name];
  if (!b) b = make_backend(name, 2, 0);
  return *b;
}

// gtest parameter names: alphanumerics and '_' ("cpu-guarded" -> "cpu_guarded").
inline std::string backend_test_name(const testing::TestParamInfo<std::string>& info) {
  std::string n = info.param;
  for (char& c : n)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return n;
}

using Vec = std::vector<double>;

inline Vec random_vec(std::mt19937& rng, size_t n, double scale = 1.0) {
  std::normal_distribution<double> d(0.0, scale);
  Vec v(n);
  for (auto& x : v) x = float(d(rng));  // representable in float exactly
  return v;
}

inline std::vector<float> to_f(const Vec& v) { return std::vector<float>(v.begin(), v.end()); }
inline Vec to_d(const std::vector<float>& v) { return Vec(v.begin(), v.end()); }

// Device buffer holding a copy of host data; reads back with get().
struct Buf {
  Backend& be;
  float* p;
  size_t n;
  Buf(Backend& b, const Vec& host) : be(b), p(b.alloc(int64_t(host.size()))), n(host.size()) {
    auto f = to_f(host);
    be.upload(p, f.data(), sizeof(float) * n);
  }
  Buf(Backend& b, size_t count) : be(b), p(b.alloc(int64_t(count))), n(count) {}
  ~Buf() { be.free_bytes(p); }
  Vec get() const {
    std::vector<float> f(n);
    be.download(f.data(), p, sizeof(float) * n);
    return to_d(f);
  }
};

// Expect |a - b| <= atol + rtol*|b| elementwise, atol relative to max|b|.
inline void expect_close(const Vec& got, const Vec& want, double rtol, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double maxabs = 0;
  for (double w : want) maxabs = std::max(maxabs, std::fabs(w));
  const double atol = rtol * std::max(maxabs, 1e-30);
  int bad = 0;
  for (size_t i = 0; i < got.size(); i++) {
    if (std::fabs(got[i] - want[i]) > atol + rtol * std::fabs(want[i])) {
      if (bad++ < 5)
        ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << " want " << want[i]
                      << " (max|want| " << maxabs << ")";
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << got.size() << " elements differ";
}

// Gradient of L(inputs) = sum(proj * f(inputs)) w.r.t. inputs[k], by central differences in
// double precision on the naive reference f.
using Fn = std::function<Vec(const std::vector<Vec>&)>;
inline Vec fd_grad(const Fn& f, std::vector<Vec> inputs, size_t k, const Vec& proj,
                   double h = 1e-6) {
  Vec g(inputs[k].size());
  for (size_t i = 0; i < g.size(); i++) {
    const double x0 = inputs[k][i];
    inputs[k][i] = x0 + h;
    Vec yp = f(inputs);
    inputs[k][i] = x0 - h;
    Vec ym = f(inputs);
    inputs[k][i] = x0;
    double s = 0;
    for (size_t j = 0; j < yp.size(); j++) s += proj[j] * (yp[j] - ym[j]);
    g[i] = s / (2 * h);
  }
  return g;
}

}  // namespace exatrain::test
