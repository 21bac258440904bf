// fp16's loss scaler (train/loss_scaler.hpp) against torch.amp.GradScaler's update rule: backoff on
// every overflow, growth after growth_interval consecutive good steps, the counter restarting on
// either; a fixed scale never moves; a backoff below min_loss_scale is an error naming the key.
#include <gtest/gtest.h>

#include "core/check.hpp"
#include "train/loss_scaler.hpp"

using namespace exatrain;

namespace {
LossScaleSpec spec(double initial, int64_t interval) {
  LossScaleSpec s;
  s.initial = initial;
  s.growth_interval = interval;
  return s;
}
}  // namespace

TEST(LossScaler, BacksOffOnOverflowAndGrowsAfterGrowthIntervalGoodSteps) {
  LossScaler ls(spec(65536, 3));
  EXPECT_TRUE(ls.enabled());
  EXPECT_EQ(ls.scale(), 65536);
  EXPECT_TRUE(ls.update(true));  // overflow: skip, x0.5
  EXPECT_EQ(ls.scale(), 32768);
  EXPECT_EQ(ls.state().skipped_steps, 1);
  EXPECT_FALSE(ls.update(false));
  EXPECT_FALSE(ls.update(false));
  EXPECT_EQ(ls.scale(), 32768);  // 2 good steps of 3
  EXPECT_EQ(ls.state().good_steps, 2);
  EXPECT_FALSE(ls.update(false));  // the 3rd: x2, counter restarts
  EXPECT_EQ(ls.scale(), 65536);
  EXPECT_EQ(ls.state().good_steps, 0);
  // An overflow restarts the counter: 2 good, overflow, 2 good is no growth.
  ls.update(false), ls.update(false);
  EXPECT_TRUE(ls.update(true));
  EXPECT_EQ(ls.scale(), 32768);
  ls.update(false), ls.update(false);
  EXPECT_EQ(ls.scale(), 32768);
  EXPECT_EQ(ls.state(), (LossScalerState{32768, 2, 2}));
  // GradScaler's own trajectory with its defaults (init 2^16, growth_interval 2000): the same rule.
  LossScaler gs(spec(65536, 2000));
  for (int i = 0; i < 1999; i++) gs.update(false);
  EXPECT_EQ(gs.scale(), 65536);
  gs.update(false);
  EXPECT_EQ(gs.scale(), 131072);
}

TEST(LossScaler, MinScaleStopsWithTheKeyAndFixedScaleNeverMoves) {
  LossScaleSpec s = spec(4, 1000);
  s.min_scale = 1;
  LossScaler ls(s);
  EXPECT_TRUE(ls.update(true));  // 2
  EXPECT_TRUE(ls.update(true));  // 1 = the minimum: allowed
  EXPECT_EQ(ls.scale(), 1);
  try {
    ls.update(true);  // 0.5 < 1
    FAIL() << "no error below min_loss_scale";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("at loss scale 1, and backing off to 0.5 would go below [train] min_loss_scale = 1"),
              std::string::npos) << m;
  }
  EXPECT_EQ(ls.state(), (LossScalerState{1, 0, 2}));  // unchanged by the refused backoff

  LossScaleSpec f = spec(1024, 2);
  f.dynamic = false;
  LossScaler fixed(f);
  EXPECT_TRUE(fixed.update(true));  // skipped, but the scale stays (Megatron's ConstantGradScaler)
  for (int i = 0; i < 10; i++) EXPECT_FALSE(fixed.update(false));
  EXPECT_EQ(fixed.scale(), 1024);
  EXPECT_EQ(fixed.state().skipped_steps, 1);
  // Restoring keeps the job's fixed scale; a dynamic one takes the checkpoint's, within the range.
  fixed.restore(LossScalerState{8, 0, 5}, "ck");
  EXPECT_EQ(fixed.scale(), 1024);
  EXPECT_EQ(fixed.state().skipped_steps, 5);
  LossScaler dyn(spec(65536, 10));
  dyn.restore(LossScalerState{256, 7, 3}, "ck");
  EXPECT_EQ(dyn.state(), (LossScalerState{256, 7, 3}));
  EXPECT_THROW(dyn.restore(LossScalerState{0.25, 0, 0}, "ck"), Error);  // below min_loss_scale = 1

  // Disabled (fp32, bf16): scale 1, never skips.
  LossScaler off;
  EXPECT_FALSE(off.enabled());
  EXPECT_FALSE(off.update(true));
  EXPECT_EQ(off.scale(), 1);
}
