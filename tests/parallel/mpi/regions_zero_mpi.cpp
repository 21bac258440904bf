// Under mpirun: tensor-parallel regions, sequence-parallel pairs, vocab-parallel cross-entropy,
// ZeRO reduce-scatter/all-gather and the bucketed gradient all-reduce, each against a single-rank
// reference that every rank computes locally.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>

#include "core/check.hpp"
#include "parallel/comm.hpp"
#include "parallel/mpi_group.hpp"
#include "parallel/tp_regions.hpp"
#include "parallel/zero.hpp"

#include "backend/backend.hpp"

using namespace exatrain::parallel;

// Computed in double and rounded once: with FMA contraction (g++ default for C++) a float
// expression can round differently at two inlined call sites.
static float value(int rank, int64_t i) {
  return static_cast<float>(std::cos(0.11 * i - 0.7 * rank) * (1 + rank));
}

TEST(TpRegionsMpi, RegionPairsAreAllReduceOrIdentity) {
  CommLedger ledger;
  MpiGroup tp_group(MPI_COMM_WORLD, "tp", &ledger, nullptr);
  TpComm tp(tp_group);  // fp32 messages
  int p = tp_group.size(), me = tp_group.rank();
  const int64_t n = 64;
  std::vector<float> x(n), ref(n, 0.f);
  double tol = 0;  // |value(r, .)| <= 1 + r: float sums of p such terms
  for (int64_t i = 0; i < n; i++) {
    x[i] = value(me, i);
    double s = 0;
    for (int r = 0; r < p; r++) s += value(r, i), tol = std::max(tol, 1e-6 * (1 + p + p * p / 2.0));
    ref[i] = static_cast<float>(s);
  }
  std::vector<float> y = x;
  copy_to_tp_region_forward(tp, y.data(), n);  // identity
  EXPECT_EQ(y, x);
  reduce_from_tp_region_backward(tp, y.data(), n);  // identity
  EXPECT_EQ(y, x);
  reduce_from_tp_region_forward(tp, y.data(), n);
  for (int64_t i = 0; i < n; i++) EXPECT_NEAR(y[i], ref[i], tol);
  y = x;
  copy_to_tp_region_backward(tp, y.data(), n);
  for (int64_t i = 0; i < n; i++) EXPECT_NEAR(y[i], ref[i], tol);
  EXPECT_EQ(ledger.calls["tp_all_reduce"], p > 1 ? 2 : 0);
}

TEST(TpRegionsMpi, SequenceParallelPairsShardTheFlatTokenRows) {
  CommLedger ledger;
  MpiGroup tp_group(MPI_COMM_WORLD, "tp", &ledger, nullptr);
  TpComm tp(tp_group);  // fp32 messages
  int p = tp_group.size(), me = tp_group.rank();
  // The engine's layout: N = B*T token rows of C floats, rank r holding rows [r*N/tp, (r+1)*N/tp)
  // (B = 3, T = 4p: for p > 2 a shard's rows span two sequences, which a [B, T, C] split would not).
  const int64_t N = 3 * 4 * p, C = 5, Ns = N / p, n_shard = Ns * C;
  // y_partial[N, C] differs per rank; g~ forward gives my rows of the sum.
  std::vector<float> partial(N * C), shard(n_shard);
  for (int64_t i = 0; i < N * C; i++) partial[i] = value(me, i);
  reduce_scatter_to_sp_region_forward(tp, partial.data(), shard.data(), n_shard);
  for (int64_t row = 0; row < Ns; row++)
    for (int64_t c = 0; c < C; c++) {
      double ref = 0;
      for (int r = 0; r < p; r++) ref += value(r, (me * Ns + row) * C + c);
      EXPECT_NEAR(shard[row * C + c], ref, 1e-6 * (1 + p * p));
    }
  // f~ forward (all-gather of the rows) of the g~ output is the full all-reduce (Megatron-SP's
  // identity: reduce-scatter + all-gather == all-reduce).
  std::vector<float> full(N * C), allreduced = partial;
  gather_from_sp_region_forward(tp, shard.data(), full.data(), n_shard);
  tp.all_reduce_sum(allreduced.data(), N * C);
  for (int64_t i = 0; i < N * C; i++) EXPECT_NEAR(full[i], allreduced[i], 1e-6 * (1 + p * p));
  // Backward pairs are the transposes: f~ backward = reduce-scatter, g~ backward = all-gather.
  std::vector<float> dshard(n_shard), dfull(N * C);
  gather_from_sp_region_backward(tp, partial.data(), dshard.data(), n_shard);
  EXPECT_EQ(dshard, shard);
  reduce_scatter_to_sp_region_backward(tp, shard.data(), dfull.data(), n_shard);
  EXPECT_EQ(dfull, full);
  // One rank: every pair copies (the no-op) and nothing is communicated.
  if (p == 1) {
    EXPECT_EQ(shard, partial);
  }
  EXPECT_EQ(ledger.calls["tp_reduce_scatter"], p > 1 ? 2 : 0);
  EXPECT_EQ(ledger.calls["tp_all_gather"], p > 1 ? 2 : 0);
}

TEST(TpRegionsMpi, VocabParallelCrossEntropyMatchesTheFullSoftmax) {
  MpiGroup tp(MPI_COMM_WORLD, "tp", nullptr, nullptr);
  int p = tp.size(), me = tp.rank();
  const int64_t N = 6, V = 37;  // tokens, vocabulary (not divisible by 2, 4 or 8)
  auto logit = [](int64_t n, int64_t v) { return static_cast<float>(3.0 * std::sin(0.9 * v + 2.1 * n)); };
  auto target = [](int64_t n) { return (n * 7 + 3) % 37; };
  VocabRange vr = vocab_range(V, p, me);
  // Local pieces: max over my columns, then sum of exp and my share of the target logit.
  std::vector<float> mx(N), sum(N), tgt(N, 0.f);
  for (int64_t n = 0; n < N; n++) {
    mx[n] = -INFINITY;
    for (int64_t v = vr.begin; v < vr.end; v++) mx[n] = std::max(mx[n], logit(n, v));
  }
  vocab_parallel_max(tp, mx.data(), N);
  for (int64_t n = 0; n < N; n++) {
    sum[n] = 0;
    for (int64_t v = vr.begin; v < vr.end; v++) sum[n] += std::exp(logit(n, v) - mx[n]);
    if (target(n) >= vr.begin && target(n) < vr.end) tgt[n] = logit(n, target(n));
  }
  vocab_parallel_sum(tp, sum.data(), N);
  vocab_parallel_sum(tp, tgt.data(), N);
  for (int64_t n = 0; n < N; n++) {
    double m = -1e30, s = 0;
    for (int64_t v = 0; v < V; v++) m = std::max(m, double(logit(n, v)));
    for (int64_t v = 0; v < V; v++) s += std::exp(logit(n, v) - m);
    double ref = std::log(s) + m - logit(n, target(n));
    double got = std::log(double(sum[n])) + mx[n] - tgt[n];
    EXPECT_NEAR(got, ref, 1e-5 * (1 + std::fabs(ref))) << n;
  }
}

// Host-accessible memory for the buckets (the CPU backend), and the dense reduction.
static exatrain::Backend& backend() {
  static std::unique_ptr<exatrain::Backend> be = exatrain::make_cpu_backend(1);
  return *be;
}
static IdentityCompressor dense;

TEST(ZeroMpi, ReduceScatterThenAllGatherGivesTheMeanEverywhere) {
  CommLedger ledger;
  MpiGroup dp(MPI_COMM_WORLD, "dp", &ledger, nullptr);
  int p = dp.size(), me = dp.rank();
  ZeroLayout z = ZeroLayout::make(1003, p);
  std::vector<float> grads(z.padded, 0.f);
  for (int64_t i = 0; i < z.total; i++) grads[i] = value(me, i);
  std::vector<float> shard(z.shard);
  reduce_scatter_grads(backend(), dp, z, grads.data(), shard.data(), 1.0f / p);
  // "Optimizer step" on my shard: params = -grad mean; then gather everyone's shard.
  std::vector<float> params(z.padded, 99.f);
  for (int64_t j = 0; j < z.shard; j++) params[me * z.shard + j] = -shard[j];
  all_gather_params(dp, z, params.data());
  for (int64_t i = 0; i < z.padded; i++) {
    double ref = 0;
    if (i < z.total)
      for (int r = 0; r < p; r++) ref += value(r, i);
    EXPECT_NEAR(params[i], -ref / p, 1e-6 * (1 + p)) << i;  // padding stays 0
  }
  if (p > 1) {
    EXPECT_EQ(ledger.bytes["dp_reduce_scatter"], 4 * (p - 1) * z.padded / p);
    EXPECT_EQ(ledger.bytes["dp_all_gather"], 4 * (p - 1) * z.padded / p);
  }
}

TEST(ZeroMpi, BucketedAllReduceOverlapsAndEqualsTheMean) {
  CommLedger ledger;
  MpiGroup dp(MPI_COMM_WORLD, "dp", &ledger, nullptr);
  int p = dp.size(), me = dp.rank();
  const int64_t n = 1000, bucket = 64;
  std::vector<float> grads(n);
  GradBucketer bk(backend(), dp, dense, grads.data(), n, bucket);
  EXPECT_EQ(bk.buckets(), 16);
  for (int step = 0; step < 2; step++) {  // the bucketer re-arms after finish()
    for (int64_t i = 0; i < n; i++) grads[i] = value(me + step, i);
    // "Backward": layers of uneven sizes finish from the end of the arena to the start.
    const int64_t sizes[] = {100, 3, 250, 77, 70};
    int64_t end = n;
    for (int64_t s : sizes) {
      bk.mark_ready(end - s, s);
      end -= s;
      // Started as soon as complete: every bucket lying wholly in [end, n) and none below.
      EXPECT_EQ(bk.launched(), (n - end) >= 40 ? 1 + (n - 40 - end) / bucket : 0) << end;
    }
    bk.mark_ready(0, end);  // the rest (embedding) last
    bk.finish(1.0f / p);
    EXPECT_EQ(bk.launched_early(), bk.buckets());  // all launched as backward produced them
    for (int64_t i = 0; i < n; i++) {
      double ref = 0;
      for (int r = 0; r < p; r++) ref += value(r + step, i);
      EXPECT_NEAR(grads[i], ref / p, 1e-6 * (1 + 2 * p)) << i;
    }
  }
  if (p > 1) {
    EXPECT_EQ(ledger.calls["dp_all_reduce"], 2 * 16);
  }
  // Marking a range twice is an error.
  GradBucketer twice(backend(), dp, dense, grads.data(), n, bucket);
  twice.mark_ready(0, 10);
  EXPECT_THROW(twice.mark_ready(5, 10), exatrain::Error);
}

// ZeRO 2 over an arena of n floats cut at `split` into buckets of `bucket`: m micro-batches
// reduce-scattered bucket by bucket and accumulated into the shard, the arena reading 0 after each
// end_micro_batch(); the shard holds the mean of my owned ranges, gather_params fills the rest.
static void zero2_round_trip(int64_t n, int64_t bucket, int64_t split, bool exact) {
  CommLedger ledger;
  MpiGroup dp(MPI_COMM_WORLD, "dp", &ledger, nullptr);
  const int p = dp.size(), me = dp.rank();
  std::vector<float> grads(n, 0.f);
  GradBucketer bk(backend(), dp, dense, grads.data(), n, bucket, BucketOp::reduce_scatter, {split}, 1);
  EXPECT_EQ(bk.bucket(0).end, std::min(split, bucket));
  const int micro_batches = 3;
  for (int step = 0; step < 2; step++) {
    ledger.reset();
    bk.zero_shard();
    for (int mb = 0; mb < micro_batches; mb++) {
      for (int64_t i = 0; i < n; i++) grads[i] += value(me + step + mb, i);
      for (int64_t end = n; end > 0; end -= std::min<int64_t>(end, 123))
        bk.mark_ready(end - std::min<int64_t>(end, 123), std::min<int64_t>(end, 123));
      bk.end_micro_batch();
      EXPECT_EQ(*std::max_element(grads.begin(), grads.end()), 0.f);
      EXPECT_EQ(*std::min_element(grads.begin(), grads.end()), 0.f);
    }
    bk.finish(1.0f / p);
    EXPECT_EQ(bk.launched_early(), micro_batches * bk.buckets());  // launched as "backward" made them
    auto mean = [&](int64_t i) {
      double ref = 0;
      for (int q = 0; q < p; q++)
        for (int mb = 0; mb < micro_batches; mb++) ref += value(q + step + mb, i);
      return ref / p;
    };
    // My ranges hold the mean; "optimizer": params = -grad on them, then gather the rest.
    // They come back to back in shard_grads(), in owned_ranges() order.
    std::vector<float> params(n, 99.f);
    int64_t owned = 0, sent = 0;
    const float* shard = bk.shard_grads();
    for (ShardRange r : bk.owned_ranges(me)) {
      for (int64_t i = r.begin; i < r.end; i++) {
        const float g = shard[owned + (i - r.begin)];
        EXPECT_NEAR(g, mean(i), 1e-5 * (1 + 2 * p)) << i;
        params[i] = -g;
      }
      owned += r.size();
    }
    int64_t gathered = 0;
    for (int64_t b = 0; b < bk.buckets(); b++) {  // each bucket padded to a multiple of p
      const int64_t size = bk.bucket(b).end - bk.bucket(b).begin, padded = (size + p - 1) / p * p;
      sent += ring_reduce_scatter_sent(padded, p, me);
      gathered += ring_all_gather_sent(padded, p, me);
    }
    EXPECT_LE(owned, (n + p - 1) / p + bk.buckets());
    bk.gather_params(params.data());
    for (int64_t i = 0; i < n; i++) EXPECT_NEAR(params[i], -mean(i), 1e-5 * (1 + 2 * p)) << i;
    // Bytes: m reduce-scatters and one all-gather of every (padded) bucket; when p divides every
    // bucket that is exactly m reduce-scatters and one all-gather of the whole arena.
    if (p > 1) {
      EXPECT_EQ(ledger.bytes["dp_reduce_scatter"], micro_batches * 4 * sent);
      EXPECT_EQ(ledger.bytes["dp_all_gather"], 4 * gathered);
    }
    if (p > 1 && exact) {
      EXPECT_EQ(sent, ring_reduce_scatter_sent(n, p, me));
      EXPECT_EQ(gathered, ring_all_gather_sent(n, p, me));
    }
  }
}

TEST(ZeroMpi, Zero2BucketsReduceScatterEveryMicroBatchAndGatherLikeFlatCollectives) {
  const int p = [] { int s = 0; MPI_Comm_size(MPI_COMM_WORLD, &s); return s; }();
  zero2_round_trip(1008 * p, 64 * p, 40 * p, true);  // p divides every bucket
}

TEST(ZeroMpi, Zero2BucketsThatDpDoesNotDivideGoThroughAPaddedCopy) {
  zero2_round_trip(1003, 64, 41, false);  // odd split, odd arena: padded buckets at p > 1
}
