// Bubble fractions against the schedules' formulas (Narayanan et al. SC21 Sec. 2.2).
#include <gtest/gtest.h>

#include "plan/pipeline.hpp"
#include "plan/predict.hpp"

using namespace exatrain;
using namespace exatrain::plan;

TEST(Pipeline, BubbleFractionFormulas) {
  Plan p;
  p.pp = 8; p.dp = 2; p.micro_batch = 2; p.global_batch = 128; p.tp = 1; p.gpus = 16;
  int64_t m = 128 / (2 * 2);
  EXPECT_DOUBLE_EQ(bubble_fraction(p), 7.0 / m);  // 1F1B and GPipe: (p-1)/m
  p.schedule = Schedule::gpipe;
  EXPECT_DOUBLE_EQ(bubble_fraction(p), 7.0 / m);
  p.schedule = Schedule::one_f_one_b;
  p.vp = 3;
  EXPECT_DOUBLE_EQ(bubble_fraction(p), 7.0 / (3.0 * m));  // interleaved: (p-1)/(v m)
}

TEST(Pipeline, BubbleTimeEqualAndUnevenStages) {
  EXPECT_DOUBLE_EQ(bubble_time({2, 2, 2, 2}, 1), 3 * 2.0);
  EXPECT_DOUBLE_EQ(bubble_time({2, 2, 2, 2}, 2), 3 * 2.0 / 2);
  EXPECT_DOUBLE_EQ(bubble_time({1, 2, 2, 3}, 1), 5.0);  // the slowest stage sets the pace
  EXPECT_DOUBLE_EQ(bubble_time({5}, 1), 0.0);
}

TEST(Pipeline, PredictedBubbleIsFractionOfCompute) {
  // Layers dominate (tiny vocabulary): pp_bubble / compute -> (p-1)/(v m).
  ModelSpec m;
  m.layers = 48; m.hidden = 4096; m.heads = 32; m.kv_heads = 32; m.ffn_hidden = 16384;
  m.seq_len = 2048; m.vocab = 8;
  MachineSpec mach;
  mach.device = "a100-80g"; mach.gpus_per_node = 8; mach.intra_node_bw_gbs = 300;
  mach.inter_node_bw_gbs = 200; mach.intra_node_latency_us = 2; mach.inter_node_latency_us = 4;
  Plan p;
  p.pp = 4; p.tp = 1; p.dp = 1; p.gpus = 4; p.micro_batch = 1; p.global_batch = 16; p.vp = 2;
  Prediction pr = predict(m, mach, p);
  EXPECT_NEAR(pr.breakdown.pp_bubble / pr.breakdown.compute, 3.0 / (2 * 16), 0.002);
}

TEST(Pipeline, BalancedStagesGiveTheEndsFewerLayers) {
  EXPECT_EQ(balanced_layers(126, 16), (std::vector<int64_t>{7, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 7}));
  EXPECT_EQ(balanced_layers(70, 12), (std::vector<int64_t>{5, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 5}));
  EXPECT_EQ(balanced_layers(13, 4), (std::vector<int64_t>{3, 4, 3, 3}));
  EXPECT_EQ(balanced_layers(7, 2), (std::vector<int64_t>{4, 3}));
}
