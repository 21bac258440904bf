// The CUDA backend's fused attention kernels (src/backend/cuda/flash_attention_kernels.cuh), run on
// the host by the emulator of simt_emulator.hpp: the kernels' own source, every CUDA thread a
// std::thread, so that their tiling, masking, online softmax and backward are checked on every
// machine against the CPU backend's attention (float32, on the same 16-bit-rounded q, k, v, as the
// model hands them over under mixed precision). On a GPU the same kernels are checked against the
// CPU again (cuda_test.cpp); what only a GPU shows (the tensor cores' layouts, timing, occupancy) is
// not checked here.

// Tolerances: attention_reference.hpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "attention_reference.hpp"
#include "backend/half_convert.hpp"
#include "simt_emulator.hpp"  // the dialect: after every other header
#include "backend/cuda/flash_attention_kernels.cuh"

using namespace exatrain;
namespace flash = exatrain::cuda::flash;

namespace {

using test::AttentionCase;
using test::round16;
template <int kHalf, int D>
void run_forward(const flash::Params& p) {
  simt::launch({unsigned((p.T + flash::kTile - 1) / flash::kTile), unsigned(p.Hq), unsigned(p.B)},
               flash::kThreads, flash::ForwardSmem<D>::bytes, flash::forward_kernel<kHalf, D>, p);
}
template <int kHalf, int D>
void run_backward(const flash::Params& p) {
  const unsigned tiles = unsigned((p.T + flash::kTile - 1) / flash::kTile);
  simt::launch({tiles, unsigned(p.Hq), unsigned(p.B)}, flash::kThreads, flash::DqSmem<D>::bytes,
               flash::dq_kernel<kHalf, D>, p);
  simt::launch({tiles, unsigned(p.Hkv), unsigned(p.B)}, flash::kThreads, flash::DkvSmem<D>::bytes,
               flash::dkv_kernel<kHalf, D>, p);
}
template <int kHalf>
void dispatch(const flash::Params& p, int D, bool backward) {
  switch (D) {
    case 32: return backward ? run_backward<kHalf, 32>(p) : run_forward<kHalf, 32>(p);
    case 64: return backward ? run_backward<kHalf, 64>(p) : run_forward<kHalf, 64>(p);
    case 128: return backward ? run_backward<kHalf, 128>(p) : run_forward<kHalf, 128>(p);
    default: FAIL() << "no kernel for D = " << D;
  }
}
void run(const flash::Params& p, int D, int half, bool backward) {
  if (half == 0)
    dispatch<0>(p, D, backward);
  else
    dispatch<1>(p, D, backward);
}

void check(const AttentionCase& c, unsigned seed) {
  SCOPED_TRACE("B " + std::to_string(c.B) + " T " + std::to_string(c.T) + " Hq " + std::to_string(c.Hq) +
               " Hkv " + std::to_string(c.Hkv) + " D " + std::to_string(c.D) + (c.half ? " f16" : " bf16"));
  const int64_t W = int64_t(c.Hq + 2 * c.Hkv) * c.D, HD = int64_t(c.Hq) * c.D, N = int64_t(c.B) * c.T;
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> qkv(size_t(N * W)), dout(size_t(N * HD));
  for (int64_t i = 0; i < N * W; i++) {  // q and k scaled up: scores of a few units, peaked rows
    const bool qk = (i % W) < int64_t(c.Hq + c.Hkv) * c.D;
    qkv[size_t(i)] = round16(normal(rng) * (qk ? 1.6f : 1.0f), c.half);
  }
  for (float& v : dout) v = normal(rng);
  const test::AttentionReference ref = test::attention_reference(c, qkv, dout);

  // The CPU backend: the float32 op on the same (rounded) inputs.
  auto cpu = make_backend("cpu", 1, 0);
  std::vector<float> saved_cpu(size_t(cpu->attention_saved_floats(c.B, c.T, c.Hq, c.D, std::nullopt)));
  std::vector<float> out_cpu(size_t(N * HD)), dqkv_cpu(size_t(N * W));
  cpu->attention_forward(out_cpu.data(), saved_cpu.data(), qkv.data(), c.B, c.T, c.Hq, c.Hkv, c.D, std::nullopt);
  cpu->attention_backward(dqkv_cpu.data(), dout.data(), qkv.data(), saved_cpu.data(), c.B, c.T, c.Hq, c.Hkv, c.D,
                          std::nullopt);

  // The kernels, emulated.
  std::vector<float> saved(size_t(flash::saved_floats(c.B, c.T, c.Hq, c.D)), std::nanf(""));
  std::vector<float> out(size_t(N * HD), std::nanf("")), delta(size_t(N * c.Hq)), dqkv(size_t(N * W), std::nanf(""));
  flash::Params p;
  p.qkv = qkv.data();
  p.out = out.data();
  p.lse = flash::saved_lse(saved.data());
  p.o16 = flash::saved_o16(saved.data(), c.B, c.T, c.Hq);
  p.dout = dout.data();
  p.delta = delta.data();
  p.dqkv = dqkv.data();
  p.B = c.B, p.T = c.T, p.Hq = c.Hq, p.Hkv = c.Hkv;
  p.scale = 1.0f / std::sqrt(float(c.D));
  run(p, c.D, c.half, false);
  test::expect_within(out, out_cpu, ref.out_bound, "out");
  run(p, c.D, c.half, true);
  test::expect_within(dqkv, dqkv_cpu, ref.dqkv_bound, "dqkv");

  test::expect_lse(p.lse, ref);

  // Without `out` (selective recomputation): the same saved bits.
  std::vector<float> saved2(saved.size(), std::nanf(""));
  flash::Params p2 = p;
  p2.out = nullptr;
  p2.lse = flash::saved_lse(saved2.data());
  p2.o16 = flash::saved_o16(saved2.data(), c.B, c.T, c.Hq);
  run(p2, c.D, c.half, false);
  EXPECT_EQ(0, std::memcmp(saved.data(), saved2.data(), sizeof(float) * saved.size()));
}

TEST(FlashAttentionEmulated, Bf16AgainstTheCpuBackendAcrossTilesAndGroups) {
  check({2, 70, 4, 2, 32, 0}, 1);   // two tiles (the second partial), groups of 2, two sequences
  check({1, 130, 2, 1, 64, 0}, 2);  // three tiles, one kv head for both query heads (MQA)
}

TEST(FlashAttentionEmulated, F16AndTheLargestHeadAgainstTheCpuBackend) {
  check({1, 130, 2, 2, 128, 1}, 3);  // three tiles (the last partial), D = 128, no grouping
  check({1, 64, 3, 3, 64, 1}, 4);   // exactly one tile
}

// Each kernel's shared memory fits the GPUs it is compiled for: 163 KiB a block on sm_80 (A100), the
// smaller of the two (sm_90: 227 KiB).
TEST(FlashAttentionEmulated, SharedMemoryFitsAnA100Block) {
  constexpr size_t kSm80 = 163 * 1024;
  EXPECT_LE(flash::ForwardSmem<128>::bytes, kSm80);
  EXPECT_LE(flash::DqSmem<128>::bytes, kSm80);
  EXPECT_LE(flash::DkvSmem<128>::bytes, kSm80);
  EXPECT_EQ(flash::shared_bytes(128), std::max({flash::ForwardSmem<128>::bytes, flash::DqSmem<128>::bytes,
                                                flash::DkvSmem<128>::bytes}));
  EXPECT_EQ(flash::shared_bytes(48), 0u) << "no kernels for D = 48";
}

}  // namespace
