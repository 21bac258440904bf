// The CUDA backend beyond the per-op harness (which checks every op of "cuda" against double
// references, op_harness.hpp): make_backend("cuda")'s refusal when it cannot run and the loading of
// cuBLASLt (both run everywhere),
// and on a GPU: bit-identical repeats of the ops whose reductions could have depended on timing
// (backend.hpp's determinism promise), the caching allocator reusing blocks, and the CUDA ops
// against the CPU backend on the same random data.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "../test_util/error_of.hpp"
#include "attention_reference.hpp"
#include "backend/backend.hpp"
#include "backend/cuda/flash_attention.hpp"
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
  Dev saved(be, std::vector<float>(size_t(be.attention_saved_floats(B, T, Hq, D, std::nullopt))));
  Dev dqkv(be, std::vector<float>(size_t(N * W)));
  be.attention_forward(out.p, saved.p, qkv.p, B, T, Hq, Hkv, D, std::nullopt);
  be.attention_backward(dqkv.p, dout.p, qkv.p, saved.p, B, T, Hq, Hkv, D, std::nullopt);
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

// The fused attention (16-bit operands: cuda/flash_attention.hpp) against the CPU backend's float32
// attention on the same rounded q, k, v, within the bounds derived from the formats' unit roundoff
// (attention_reference.hpp; the emulated test, flash_attention_emulated_test.cpp, checks the same
// kernels' source on the host); its saved log-sum-exp against the double reference; two runs give
// the same bits (no atomics), and a forward without `out` (selective recomputation) the same saved
// state. Outputs start as NaN, so an element no kernel writes fails. Returns false, checking nothing,
// where the backend takes its float32 path for this case (EXATRAIN_CUDA_FLASH=0, or a device whose
// blocks cannot have the kernels' shared memory: sm_86/89 at D = 128).
bool check_fused_attention(Backend& gpu, Backend& cpu, const test::AttentionCase& c) {
  SCOPED_TRACE("B " + std::to_string(c.B) + " T " + std::to_string(c.T) + " Hq " + std::to_string(c.Hq) + " Hkv " +
               std::to_string(c.Hkv) + " D " + std::to_string(c.D) + (c.half ? " f16" : " bf16"));
  const int64_t W = int64_t(c.Hq + 2 * c.Hkv) * c.D, N = int64_t(c.B) * c.T, HD = int64_t(c.Hq) * c.D;
  const Half half = c.half == 0 ? Half::bf16 : Half::f16;
  if (gpu.attention_saved_floats(c.B, c.T, c.Hq, c.D, half) != cuda::flash::saved_floats(c.B, c.T, c.Hq, c.D))
    return false;
  std::vector<float> qkv = random_floats(size_t(N * W), 11, 1.3f);
  for (float& v : qkv) v = test::round16(v, c.half);
  const std::vector<float> dout = random_floats(size_t(N * HD), 12);
  const test::AttentionReference ref = test::attention_reference(c, qkv, dout);
  const float nan = std::nanf("");
  auto run = [&](Backend& be, std::optional<Half> ops) {
    const size_t n_saved = size_t(be.attention_saved_floats(c.B, c.T, c.Hq, c.D, ops));
    Dev q(be, qkv), dy(be, dout), out(be, std::vector<float>(size_t(N * HD), nan));
    Dev dq(be, std::vector<float>(qkv.size(), nan)), saved(be, std::vector<float>(n_saved, nan));
    Dev saved2(be, saved.get());
    be.attention_forward(out.p, saved.p, q.p, c.B, c.T, c.Hq, c.Hkv, c.D, ops);
    be.attention_forward(nullptr, saved2.p, q.p, c.B, c.T, c.Hq, c.Hkv, c.D, ops);
    be.attention_backward(dq.p, dy.p, q.p, saved.p, c.B, c.T, c.Hq, c.Hkv, c.D, ops);
    const std::vector<float> s1 = saved.get(), s2 = saved2.get();
    EXPECT_EQ(0, std::memcmp(s1.data(), s2.data(), 4 * n_saved)) << "a forward without out saved other bits";
    return std::vector<std::vector<float>>{out.get(), dq.get(), s1};
  };
  const auto want = run(cpu, std::nullopt), a = run(gpu, half), b = run(gpu, half);
  test::expect_within(a[0], want[0], ref.out_bound, "out");
  test::expect_within(a[1], want[1], ref.dqkv_bound, "dqkv");
  test::expect_lse(a[2].data(), ref);
  for (size_t i = 0; i < a.size(); i++)
    EXPECT_EQ(0, std::memcmp(a[i].data(), b[i].data(), 4 * a[i].size())) << "two GPU runs differ (" << i << ")";
  return true;
}

// Each case that runs fused; a case that does not is named on stdout, and a test none of whose cases
// runs fused is skipped with the reason.
void check_fused_attention_cases(Backend& gpu, Backend& cpu, const std::vector<test::AttentionCase>& cases) {
  std::string not_fused;
  size_t checked = 0;
  for (const test::AttentionCase& c : cases)
    if (check_fused_attention(gpu, cpu, c))
      checked++;
    else
      not_fused += " D=" + std::to_string(c.D);
  if (checked == cases.size()) return;
  const std::string why = "the fused attention does not run here for" + not_fused +
                          " (EXATRAIN_CUDA_FLASH=0, or the device's shared memory below flash::shared_bytes(D))";
  if (checked == 0) GTEST_SKIP() << why;
  std::printf("%s: those cases were not checked\n", why.c_str());
}

// Partial tiles, groups, one kv head, D 32 / 64 / 128, both formats: small, so that
// compute-sanitizer's memcheck and racecheck can run it (bench/gpu/run.sh).
TEST_F(CudaOnly, FusedAttentionMatchesTheCpuWithinTheFormatsBounds) {
  check_fused_attention_cases(gpu(), cpu(), {{2, 70, 4, 2, 32, 0}, {1, 130, 2, 1, 64, 0}, {1, 130, 2, 2, 128, 1}});
}

// Larger: two sequences at D = 128 with four heads on one kv head, groups of two in f16, and GPT-2's
// shape at 1,024 tokens (16 tiles).
TEST_F(CudaOnly, FusedAttentionLargerCasesMatchTheCpu) {
  check_fused_attention_cases(gpu(), cpu(), {{2, 200, 4, 1, 128, 0}, {1, 100, 6, 3, 64, 1}, {1, 1024, 2, 2, 64, 0}});
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
