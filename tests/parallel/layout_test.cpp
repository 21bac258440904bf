// ZeRO shard arithmetic, vocabulary split and the byte-accounting convention (no MPI).
#include <gtest/gtest.h>

#include "parallel/comm.hpp"
#include "parallel/grad_sync.hpp"
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

// Over one replica there is nothing to shard: every stage runs ZeRO 0 (full arenas, initialised
// weights, no per-unit gathers, released pages or shard copies), as the planner's "no effect" note
// and its memory and time model count it; over more, each stage runs as itself.
TEST(Zero, EveryStageOverOneReplicaRunsZeroZero) {
  for (int zero : {0, 1, 2, 3}) {
    EXPECT_EQ(zero_run(zero, 1), 0) << zero;
    EXPECT_EQ(zero_run(zero, 2), zero) << zero;
  }
  const ArenaPolicy one = arena_policy(3, 1), two = arena_policy(3, 2);
  EXPECT_TRUE(one.init_weights && !one.lazy_params && !one.lazy_grads);
  EXPECT_TRUE(!two.init_weights && two.lazy_params && two.lazy_grads);
}

TEST(VocabParallel, RangesSplitTheVocabularyContiguously) {
  int64_t vocab = 50257;
  int tp = 4;
  int64_t next = 0;
  for (int r = 0; r < tp; r++) {
    VocabRange v = vocab_range(vocab, tp, r);
    EXPECT_EQ(v.begin, next);
    // ceil(50257 / 4) = 12565 rows each, the last 50257 - 3 * 12565 = 12562.
    EXPECT_EQ(v.end - v.begin, r < tp - 1 ? 12565 : 12562);
    next = v.end;
  }
  EXPECT_EQ(next, vocab);
}

TEST(ByteConvention, RingFormulasInElements) {
  // Even split: 2 (p-1)/p E for all-reduce, (p-1)/p E for reduce-scatter and all-gather.
  EXPECT_EQ(ring_all_reduce_sent(1000, 4, 0), 1500);
  EXPECT_EQ(ring_reduce_scatter_sent(1000, 4, 3), 750);
  EXPECT_EQ(ring_all_gather_sent(1000, 4, 2), 750);
  EXPECT_EQ(ring_all_reduce_sent(1000, 1, 0), 0);
  // Uneven split, E = 10 over p = 4: chunks 3 3 2 2. Rank 1 sends every chunk but its own (3)
  // in reduce-scatter and every chunk but chunk 2 (2) in all-gather.
  EXPECT_EQ(ring_chunk(10, 4, 1), 3);
  EXPECT_EQ(ring_chunk(10, 4, 2), 2);
  EXPECT_EQ(ring_reduce_scatter_sent(10, 4, 1), 7);
  EXPECT_EQ(ring_all_gather_sent(10, 4, 1), 8);
  EXPECT_EQ(ring_all_reduce_sent(10, 4, 1), 15);
  // Summed over the ring, every chunk is sent p-1 times in each pass.
  int64_t total = 0;
  for (int r = 0; r < 4; r++) total += ring_all_reduce_sent(10, 4, r);
  EXPECT_EQ(total, 2 * 3 * 10);
}

TEST(ByteConvention, MeasuredTimesMapToThePlannersBreakdownNames) {
  CommLedger l;
  l.seconds["tp_all_reduce"] = 1.0;
  l.seconds["tp_all_gather"] = 0.5;
  l.seconds["dp_reduce_scatter"] = 0.25;
  l.seconds["pp_recv"] = 2.0;
  l.seconds["pp_send"] = 0.125;
  l.seconds["cp_send"] = 4.0;
  l.seconds["world_barrier"] = 8.0;
  auto b = comm_breakdown_s(l);
  EXPECT_EQ(b.size(), 5u);
  EXPECT_DOUBLE_EQ(b["tp_comm"], 1.5);
  EXPECT_DOUBLE_EQ(b["dp_comm"], 0.25);
  EXPECT_DOUBLE_EQ(b["pp_bubble"], 2.0);
  EXPECT_DOUBLE_EQ(b["pp_comm"], 0.125);
  EXPECT_DOUBLE_EQ(b["cp_comm"], 4.0);
}
