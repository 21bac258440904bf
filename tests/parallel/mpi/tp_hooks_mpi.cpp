// MpiParallelHooks (the base of the Trainer's hooks): each hook
// is the tensor-parallel collective the engine documents for it.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>

#include "backend/backend.hpp"
#include "backend/half_convert.hpp"
#include "parallel/mpi_group.hpp"
#include "parallel/tp_hooks.hpp"

using namespace exatrain::parallel;

TEST(TpHooksMpi, HooksAreSumAndMaxOverTheTpGroup) {
  CommLedger ledger;
  MpiGroup tp(MPI_COMM_WORLD, "tp", &ledger, nullptr);
  MpiParallelHooks hooks(tp);
  exatrain::ParallelHooks& h = hooks;
  int p = tp.size(), me = tp.rank();
  const int64_t n = 9;
  auto v = [](int r, int64_t i) { return static_cast<float>(std::sin(0.3 * i + r)); };
  std::vector<float> a(n), b(n), c(n), d(n);
  for (int64_t i = 0; i < n; i++) a[i] = b[i] = c[i] = d[i] = v(me, i);
  h.input_grad_allreduce(a.data(), n);
  h.partial_sum_allreduce(b.data(), n);
  h.vocab_sum_allreduce(c.data(), n);
  h.vocab_max_allreduce(d.data(), n);
  for (int64_t i = 0; i < n; i++) {
    double sum = 0;
    float mx = v(0, i);
    for (int r = 0; r < p; r++) sum += v(r, i), mx = std::max(mx, v(r, i));
    EXPECT_NEAR(a[i], sum, 1e-5 * (1 + p));
    EXPECT_NEAR(b[i], sum, 1e-5 * (1 + p));
    EXPECT_NEAR(c[i], sum, 1e-5 * (1 + p));
    EXPECT_EQ(d[i], mx);
  }
  EXPECT_EQ(ledger.calls["tp_all_reduce"], p > 1 ? 4 : 0);
}

TEST(TpHooksMpi, SequenceParallelHooksAreTheNamedRowPairs) {
  CommLedger ledger;
  MpiGroup tp(MPI_COMM_WORLD, "tp", &ledger, nullptr);
  MpiParallelHooks hooks(tp);
  exatrain::ParallelHooks& h = hooks;
  int p = tp.size(), me = tp.rank();
  const int64_t n_local = 7;  // floats of this rank's rows
  auto v = [](int r, int64_t i) { return static_cast<float>(std::cos(0.2 * i - r)); };
  std::vector<float> local(n_local), full(n_local * p), part(n_local * p), mine(n_local);
  for (int64_t i = 0; i < n_local; i++) local[i] = v(me, i);
  h.sp_all_gather(local.data(), full.data(), n_local);  // chunks in rank order
  for (int r = 0; r < p; r++)
    for (int64_t i = 0; i < n_local; i++) EXPECT_EQ(full[r * n_local + i], v(r, i));
  for (int64_t i = 0; i < n_local * p; i++) part[i] = v(me, i);
  h.sp_reduce_scatter(part.data(), mine.data(), n_local);  // SUM, rank r keeps chunk r
  for (int64_t i = 0; i < n_local; i++) {
    double sum = 0;
    for (int r = 0; r < p; r++) sum += v(r, me * n_local + i);
    EXPECT_NEAR(mine[i], sum, 1e-5 * (1 + p));
  }
  EXPECT_EQ(ledger.calls["tp_all_gather"], p > 1 ? 1 : 0);
  EXPECT_EQ(ledger.calls["tp_reduce_scatter"], p > 1 ? 1 : 0);
}

// The 16-bit hooks (the Trainer's under mixed precision, [train] tp_comm_dtype = "auto"): each
// region's tensor is rounded to the 16-bit format, reduced in it (each pairwise sum in fp32,
// rounded back) and widened exactly; the cross-entropy statistics stay fp32; every 16-bit
// collective sends half the fp32 hooks' bytes. At 2 ranks the sum is one rounding of the exact
// sum of the two rounded values; at more, within one 16-bit step per addition.
TEST(TpHooksMpi, SixteenBitHooksRoundSumAndWidenAndSendHalfTheBytes) {
  using exatrain::Half;
  namespace hc = exatrain::half_convert;
  for (Half h : {Half::bf16, Half::f16}) {
    auto round = [h](float x) {
      return h == Half::bf16 ? hc::bf16_to_f32(hc::f32_to_bf16(x)) : hc::f16_to_f32(hc::f32_to_f16(x));
    };
    const double step = h == Half::bf16 ? 1.0 / 256 : 1.0 / 2048;  // the format's unit roundoff (half its relative spacing)
    const char* name = h == Half::bf16 ? "bf16" : "fp16";
    CommLedger l16, l32;
    MpiGroup tp16(MPI_COMM_WORLD, "tp", &l16, nullptr), tp32(MPI_COMM_WORLD, "tp", &l32, nullptr);
    std::unique_ptr<exatrain::Backend> be = exatrain::make_cpu_backend(1);
    MpiParallelHooks hooks(tp16, *be, h), fp32(tp32);
    exatrain::ParallelHooks& h16 = hooks;
    const int p = tp16.size(), me = tp16.rank();
    const int64_t n = 11;
    auto v = [](int r, int64_t i) { return static_cast<float>(std::sin(0.37 * i + 1.3 * r) * (1 + i)); };
    // Rank-order sum of the rounded values, and its bound: one rounding per addition.
    auto check_sum = [&](float got, int64_t i, const char* what) {
      float exact = 0, mag = 0;
      for (int r = 0; r < p; r++) exact += round(v(r, i)), mag += std::fabs(round(v(r, i)));
      if (p == 2) EXPECT_EQ(got, round(round(v(0, i)) + round(v(1, i)))) << name << " " << what << " " << i;
      else EXPECT_NEAR(got, exact, (p - 1) * step * mag) << name << " " << what << " " << i;
      EXPECT_EQ(got, round(got)) << name << " " << what << ": not a widened 16-bit value";
    };
    std::vector<float> a(n), b(n), c(n), a32(n), c32(n);
    for (int64_t i = 0; i < n; i++) a[i] = b[i] = c[i] = a32[i] = c32[i] = v(me, i);
    h16.input_grad_allreduce(a.data(), n);
    h16.partial_sum_allreduce(b.data(), n);
    fp32.input_grad_allreduce(a32.data(), n);
    // Two 16-bit all-reduces of n elements send what one fp32 all-reduce does.
    EXPECT_EQ(l16.bytes["tp_all_reduce"], l32.bytes["tp_all_reduce"]) << name;
    if (p > 1) {
      EXPECT_GT(l32.bytes["tp_all_reduce"], 0) << name;
    }
    h16.vocab_sum_allreduce(c.data(), n);  // fp32: the same as the fp32 hooks'
    fp32.vocab_sum_allreduce(c32.data(), n);
    for (int64_t i = 0; i < n; i++) {
      if (p == 1) {  // one rank: nothing sent, nothing rounded
        EXPECT_EQ(a[i], v(0, i));
        EXPECT_EQ(b[i], v(0, i));
        continue;
      }
      check_sum(a[i], i, "input_grad_allreduce");
      check_sum(b[i], i, "partial_sum_allreduce");
      EXPECT_EQ(c[i], c32[i]) << name << " vocab_sum_allreduce " << i;
    }
    // Sequence parallelism: the gathered rows are the rounded rows; the reduce-scatter's rows are sums.
    const int64_t n_local = 6;
    std::vector<float> local(n_local), full(n_local * p), part(n_local * p), mine(n_local);
    for (int64_t i = 0; i < n_local; i++) local[i] = v(me, i);
    h16.sp_all_gather(local.data(), full.data(), n_local);
    for (int r = 0; r < p; r++)
      for (int64_t i = 0; i < n_local; i++)
        EXPECT_EQ(full[r * n_local + i], p == 1 ? v(r, i) : round(v(r, i))) << name << " sp_all_gather";
    for (int64_t i = 0; i < n_local * p; i++) part[i] = v(me, i);
    std::vector<float> part32 = part, mine32(n_local), full32(n_local * p);
    h16.sp_reduce_scatter(part.data(), mine.data(), n_local);
    fp32.sp_all_gather(local.data(), full32.data(), n_local);
    fp32.sp_reduce_scatter(part32.data(), mine32.data(), n_local);
    if (p > 1)
      for (int64_t i = 0; i < n_local; i++) check_sum(mine[i], me * n_local + i, "sp_reduce_scatter");
    // Bytes: the 16-bit collectives send half the fp32 ones' (the same calls on both sides).
    EXPECT_EQ(l16.bytes["tp_all_gather"] * 2, l32.bytes["tp_all_gather"]) << name;
    EXPECT_EQ(l16.bytes["tp_reduce_scatter"] * 2, l32.bytes["tp_reduce_scatter"]) << name;
  }
}
