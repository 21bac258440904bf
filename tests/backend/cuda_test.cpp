// The CUDA backend beyond the per-op harness (which checks every op of "cuda" against double
// references, op_harness.hpp): make_backend("cuda")'s refusal when it cannot run and the loading of
// cuBLASLt (both run everywhere),
// and on a GPU: bit-identical repeats of the ops whose reductions could have depended on timing
// (backend.hpp's determinism promise), the caching allocator reusing blocks, and the CUDA ops
// against the CPU backend on the same random data.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "../test_util/error_of.hpp"
#include "backend/backend.hpp"
#ifdef EXATRAIN_HAVE_CUDA
#include "backend/cuda/cuda_backend.hpp"
#endif
#include "op_harness.hpp"

using namespace exatrain;
using namespace exatrain::test;

namespace {

TEST(CudaBackend, MakeBackendRefusesWithTheReasonWhenItCannotRun) {
  std::string why;
  if (visible_cuda_devices(&why) > 0) GTEST_SKIP() << "a CUDA device is visible: the refusal is not reachable";
  const std::string msg = error_of([] { make_backend("cuda"); });
  if (cuda_backend_built()) {
    EXPECT_NE(msg.find("no CUDA device visible: cudaGetDeviceCount = 0"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[train] device = \"cpu\""), std::string::npos) << msg;
  } else {
    EXPECT_NE(msg.find("built without the CUDA backend"), std::string::npos) << msg;
    EXPECT_NE(msg.find("-DEXATRAIN_CUDA=ON"), std::string::npos) << msg;
  }
  EXPECT_NE(why.find("no CUDA device visible"), std::string::npos) << why;
  const std::string unknown = error_of([] { make_backend("tpu"); });
  EXPECT_NE(unknown.find("\"cpu\", \"cpu-guarded\" or \"cuda\""), std::string::npos) << unknown;
}

// cuBLASLt is loaded at run time (dlopen, not linked: cuda_backend_impl.hpp says why): the toolkit's
// library and every function the backend calls must be there, GPU or not.
TEST(CudaBackend, CublasLtLoadsWithEveryFunctionTheBackendCalls) {
#ifdef EXATRAIN_HAVE_CUDA
  EXPECT_NO_THROW(cuda_load_libraries());
#else
  GTEST_SKIP() << "this build has no CUDA backend (EXATRAIN_CUDA=OFF)";
#endif
}

class CudaOnly : public testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_backend_built()) GTEST_SKIP() << "this build has no CUDA backend (EXATRAIN_CUDA=OFF)";
    EXA_SKIP_IF_UNAVAILABLE(std::string("cuda"));
  }
  Backend& gpu() { return backend_named("cuda"); }
  Backend& cpu() { return backend_named("cpu"); }
};

std::vector<float> random_floats(size_t n, unsigned seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

struct Dev {
  Backend& be;
  float* p;
  size_t n;
  Dev(Backend& b, const std::vector<float>& h) : be(b), p(b.alloc(int64_t(h.size()))), n(h.size()) {
    be.upload(p, h.data(), 4 * n);
  }
  ~Dev() { be.free_bytes(p); }
  std::vector<float> get() const {
    std::vector<float> h(n);
    be.download(h.data(), p, 4 * n);
    return h;
  }
};

// Attention forward + backward, layernorm backward, cross-entropy and the double sums, twice on
// the GPU: the same bits (no atomics, fixed reduction trees); and within float tolerance of the
// CPU backend on the same inputs (another summation order).
std::vector<std::vector<float>> step(Backend& be, int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t D) {
  const int64_t W = (Hq + 2 * Hkv) * D, N = B * T, C = 48, V = 101;
  Dev qkv(be, random_floats(size_t(N * W), 1)), dout(be, random_floats(size_t(N * Hq * D), 2));
  Dev out(be, std::vector<float>(size_t(N * Hq * D)));
  Dev saved(be, std::vector<float>(size_t(be.attention_saved_floats(B, T, Hq))));
  Dev dqkv(be, std::vector<float>(size_t(N * W)));
  be.attention_forward(out.p, saved.p, qkv.p, B, T, Hq, Hkv, D);
  be.attention_backward(dqkv.p, dout.p, qkv.p, saved.p, B, T, Hq, Hkv, D);
  Dev x(be, random_floats(size_t(N * C), 3)), w(be, random_floats(size_t(C), 4)), b(be, random_floats(size_t(C), 5));
  Dev y(be, std::vector<float>(size_t(N * C))), mean(be, std::vector<float>(size_t(N))), rstd(be, mean.get());
  Dev dx(be, std::vector<float>(size_t(N * C))), dw(be, std::vector<float>(size_t(C))), db(be, dw.get());
  be.layernorm_forward(y.p, mean.p, rstd.p, x.p, w.p, b.p, N, C, 1e-5f);
  be.layernorm_backward(dx.p, dw.p, db.p, y.p, x.p, w.p, mean.p, rstd.p, N, C);
  Dev logits(be, random_floats(size_t(N * V), 6, 3.0f)), rowmax(be, std::vector<float>(size_t(N)));
  Dev stats(be, std::vector<float>(size_t(2 * N)));
  std::vector<int32_t> tgt(static_cast<size_t>(N), 0);
  for (size_t i = 0; i < tgt.size(); i++) tgt[i] = int32_t((i * 37) % size_t(V));
  auto* dt = static_cast<int32_t*>(be.alloc_bytes(4 * tgt.size()));
  be.upload(dt, tgt.data(), 4 * tgt.size());
  be.xent_max(rowmax.p, logits.p, N, V, V);
  be.xent_stats(stats.p, stats.p + N, logits.p, rowmax.p, dt, 0, N, V, V);
  be.xent_backward(logits.p, rowmax.p, stats.p, dt, 0, 1.0f / float(N), N, V, V);
  be.free_bytes(dt);
  const std::vector<float> sums = {float(be.sum_squares(dqkv.p, N * W)), float(be.dot(dx.p, y.p, N * C)),
                                   float(be.sum_abs(logits.p, N * V))};
  return {out.get(), saved.get(), dqkv.get(), y.get(), dx.get(), dw.get(), db.get(), stats.get(), logits.get(), sums};
}

TEST_F(CudaOnly, OpsRepeatBitIdenticallyAndMatchTheCpuBackend) {
  const auto a = step(gpu(), 2, 37, 4, 2, 16), b = step(gpu(), 2, 37, 4, 2, 16), c = step(cpu(), 2, 37, 4, 2, 16);
  // The saved state is each backend's own; both keep the probabilities [B,Hq,T,T] today.
  const char* names[] = {"attention out", "attention saved state (probabilities)", "dqkv", "layernorm y", "dx",
                         "dw", "db", "xent stats", "xent grad", "sums"};
  for (size_t i = 0; i < a.size(); i++) {
    EXPECT_EQ(a[i], b[i]) << names[i] << ": two GPU runs differ";
    expect_close(to_d(a[i]), to_d(c[i]), 1e-4, names[i]);
  }
}

TEST_F(CudaOnly, CachingAllocatorHandsFreedBlocksBackZeroed) {
  Backend& be = gpu();
  float* p = be.alloc(1000);
  be.fill(p, 3.0f, 1000);
  be.free_bytes(p);
  float* q = be.alloc(1000);  // the same size class: the cached block, zeroed again (alloc_bytes' contract)
  EXPECT_EQ(p, q);
  std::vector<float> h(1000, -1.0f);
  be.download(h.data(), q, 4000);
  for (float v : h) ASSERT_EQ(v, 0.0f);
  be.free_bytes(q);
}

}  // namespace
