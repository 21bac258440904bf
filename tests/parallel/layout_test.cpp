// ZeRO shard arithmetic, vocabulary split and the byte-accounting convention (no MPI).
#include <gtest/gtest.h>

#include "parallel/comm.hpp"
#include "parallel/tp_regions.hpp"
#include "parallel/zero.hpp"

using namespace exatrain::parallel;

TEST(Zero, ShardsAreEqualAlignedAndCoverTheArena) {
  ZeroLayout z = ZeroLayout::make(1003, 4, 16);
  EXPECT_EQ(z.padded % (4 * 16), 0);
  EXPECT_GE(z.padded, 1003);
  EXPECT_LT(z.padded - 1003, 4 * 16);  // minimal padding
  EXPECT_EQ(z.shard * 4, z.padded);
  int64_t covered = 0;
  for (int r = 0; r < 4; r++) {
    EXPECT_EQ(z.range(r).begin, r * z.shard);
    covered += z.owned(r).size();
  }
  EXPECT_EQ(covered, 1003);
  EXPECT_EQ(z.owned(3).end, 1003);
  // Tiny arena: the last ranks own nothing real.
  ZeroLayout t = ZeroLayout::make(5, 4, 16);
  EXPECT_EQ(t.shard, 16);
  EXPECT_EQ(t.owned(0).size(), 5);
  EXPECT_EQ(t.owned(1).size(), 0);
}

TEST(VocabParallel, RangesSplitTheVocabularyContiguously) {
  int64_t vocab = 50257;
  int tp = 4;
  int64_t next = 0;
  for (int r = 0; r < tp; r++) {
    VocabRange v = vocab_range(vocab, tp, r);
    EXPECT_EQ(v.begin, next);
    EXPECT_TRUE(v.end - v.begin == vocab / tp || v.end - v.begin == vocab / tp + 1);
    next = v.end;
  }
  EXPECT_EQ(next, vocab);
}

TEST(ByteConvention, RingFormulas) {
  // 1 MiB over 4 ranks: all-reduce sends 2 * 3/4 MiB, reduce-scatter and all-gather 3/4 MiB.
  double n = 1 << 20;
  EXPECT_EQ(ring_allreduce_bytes(n, 4), 1.5 * n);
  EXPECT_EQ(ring_reduce_scatter_bytes(n, 4), 0.75 * n);
  EXPECT_EQ(ring_allgather_bytes(n, 4), 0.75 * n);
  EXPECT_EQ(ring_allreduce_bytes(n, 1), 0.0);
  // Reduce-scatter followed by all-gather costs exactly one all-reduce.
  EXPECT_EQ(ring_reduce_scatter_bytes(n, 8) + ring_allgather_bytes(n, 8), ring_allreduce_bytes(n, 8));
}
