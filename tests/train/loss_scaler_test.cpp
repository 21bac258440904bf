// fp16's loss scaler (train/loss_scaler.hpp): with hysteresis 1 against torch.amp.GradScaler's
// update rule (backoff on every overflow, growth after growth_interval consecutive good steps, the
// counter restarting on either); with the default hysteresis 2 against Megatron's
// DynamicGradScaler.update() written out below; a fixed scale never moves; a backoff below
// min_loss_scale is an error naming the key; restore caps and fills in the hysteresis left.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include <gtest/gtest.h>

#include "core/check.hpp"
#include "train/loss_scaler.hpp"

using namespace exatrain;

namespace {
LossScaleSpec spec(double initial, int64_t interval, int64_t hysteresis = 1) {
  LossScaleSpec s;
  s.initial = initial;
  s.growth_interval = interval;
  s.hysteresis = hysteresis;
  return s;
}

// megatron/core/optimizer/grad_scaler.py DynamicGradScaler.update(), as written there: the
// hysteresis tracker goes negative on further overflows and is reset only on growth; the scale is
// clamped at min_scale (our scaler refuses to go below it instead; the test stays above it).
struct MegatronDynamic {
  double scale, backoff = 0.5, growth = 2, min_scale = 1;
  int64_t interval, hysteresis, growth_tracker = 0, hysteresis_tracker;
  MegatronDynamic(double s, int64_t i, int64_t h) : scale(s), interval(i), hysteresis(h), hysteresis_tracker(h) {}
  void update(bool found_inf) {
    if (found_inf) {
      growth_tracker = 0;
      hysteresis_tracker -= 1;
      if (hysteresis_tracker <= 0) scale = std::max(scale * backoff, min_scale);
    } else {
      growth_tracker += 1;
      if (growth_tracker == interval) growth_tracker = 0, hysteresis_tracker = hysteresis, scale *= growth;
    }
  }
};
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
  EXPECT_EQ(ls.state(), (LossScalerState{32768, 2, 2, 0}));
  // GradScaler's own trajectory with its defaults (init 2^16, growth_interval 2000): the same rule.
  LossScaler gs(spec(65536, 2000));
  for (int i = 0; i < 1999; i++) gs.update(false);
  EXPECT_EQ(gs.scale(), 65536);
  gs.update(false);
  EXPECT_EQ(gs.scale(), 131072);
}

// Megatron's default hysteresis 2: the first overflow after a growth (or the start) is skipped
// without a backoff, every further one backs off until the next growth makes the hysteresis whole.
TEST(LossScaler, HysteresisBacksOffAsMegatronsDynamicGradScaler) {
  LossScaler ls(spec(65536, 3, 2));
  EXPECT_EQ(ls.state().hysteresis_left, 2);
  EXPECT_TRUE(ls.update(true));  // skipped, the scale kept
  EXPECT_EQ(ls.state(), (LossScalerState{65536, 0, 1, 1}));
  EXPECT_FALSE(ls.update(false));  // a good step does not restore the hysteresis
  EXPECT_TRUE(ls.update(true));    // the second overflow since the start: x0.5
  EXPECT_EQ(ls.state(), (LossScalerState{32768, 0, 2, 0}));
  EXPECT_TRUE(ls.update(true));  // and every further one
  EXPECT_EQ(ls.scale(), 16384);
  for (int i = 0; i < 3; i++) ls.update(false);  // growth: x2, the hysteresis whole again
  EXPECT_EQ(ls.state(), (LossScalerState{32768, 0, 3, 2}));
  EXPECT_TRUE(ls.update(true));
  EXPECT_EQ(ls.scale(), 32768);

  // A pseudo-random run against the reference, for hysteresis 1 to 4: above 2^20 the gradients
  // overflow 3 steps in 4 (bursts), below it 1 in 16 (lone spikes), so the scale backs off, grows
  // and backs off again some 230-370 times each (it stays in [2^14, 2^30]); the same scale, counter
  // and hysteresis after every step, and the same skips.
  for (int64_t h = 1; h <= 4; h++) {
    LossScaler ours(spec(std::ldexp(1.0, 30), 4, h));
    MegatronDynamic ref(std::ldexp(1.0, 30), 4, h);
    uint64_t x = 12345 + uint64_t(h);
    int64_t skips = 0;
    for (int step = 0; step < 2000; step++) {
      x = x * 6364136223846793005ULL + 1442695040888963407ULL;
      const uint64_t r = (x >> 33) % 16;
      const bool inf = ref.scale > std::ldexp(1.0, 20) ? r < 12 : r < 1;
      EXPECT_EQ(ours.update(inf), inf);
      ref.update(inf);
      skips += inf;
      ASSERT_EQ(ours.scale(), ref.scale) << "hysteresis " << h << " step " << step;
      ASSERT_EQ(ours.state().good_steps, ref.growth_tracker) << "hysteresis " << h << " step " << step;
      ASSERT_EQ(ours.state().hysteresis_left, std::max<int64_t>(0, ref.hysteresis_tracker))
          << "hysteresis " << h << " step " << step;
    }
    EXPECT_EQ(ours.state().skipped_steps, skips);
  }
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
  EXPECT_EQ(ls.state(), (LossScalerState{1, 0, 2, 0}));  // unchanged by the refused backoff

  LossScaleSpec f = spec(1024, 2);
  f.dynamic = false;
  LossScaler fixed(f);
  EXPECT_TRUE(fixed.update(true));  // skipped, but the scale stays (Megatron's ConstantGradScaler)
  for (int i = 0; i < 10; i++) EXPECT_FALSE(fixed.update(false));
  EXPECT_EQ(fixed.scale(), 1024);
  EXPECT_EQ(fixed.state().skipped_steps, 1);
  // Restoring keeps the job's fixed scale; a dynamic one takes the checkpoint's, within the range.
  fixed.restore(LossScalerState{8, 0, 5, 0}, "ck");
  EXPECT_EQ(fixed.scale(), 1024);
  EXPECT_EQ(fixed.state().skipped_steps, 5);
  LossScaler dyn(spec(65536, 10));
  dyn.restore(LossScalerState{256, 7, 3, 0}, "ck");
  EXPECT_EQ(dyn.state(), (LossScalerState{256, 7, 3, 0}));
  // A restored hysteresis matters: one overflow left of 2 (saved after one overflow), the next
  // overflow backs off; a fresh scaler would not.
  LossScaler resumed(spec(65536, 10, 2)), fresh(spec(65536, 10, 2));
  resumed.restore(LossScalerState{65536, 0, 1, 1}, "ck");
  resumed.update(true), fresh.update(true);
  EXPECT_EQ(resumed.scale(), 32768);
  EXPECT_EQ(fresh.scale(), 65536);
  EXPECT_THROW(dyn.restore(LossScalerState{0.25, 0, 0}, "ck"), Error);  // below min_loss_scale = 1
  // The hysteresis left: taken, capped at this job's hysteresis, or whole for a format-1 checkpoint.
  LossScaler h3(spec(65536, 10, 3));
  h3.restore(LossScalerState{256, 7, 3, 1}, "ck");
  EXPECT_EQ(h3.state().hysteresis_left, 1);
  h3.restore(LossScalerState{256, 7, 3, 5}, "ck");
  EXPECT_EQ(h3.state().hysteresis_left, 3);
  h3.restore(LossScalerState{256, 7, 3, kHysteresisNotSaved}, "ck");
  EXPECT_EQ(h3.state().hysteresis_left, 3);

  // Disabled (fp32, bf16): scale 1, never skips.
  LossScaler off;
  EXPECT_FALSE(off.enabled());
  EXPECT_FALSE(off.update(true));
  EXPECT_EQ(off.scale(), 1);
}
