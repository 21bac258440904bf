// MpiParallelHooks (the base of the Trainer's hooks): each hook
// is the tensor-parallel collective the engine documents for it.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>

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
