// fp16's loss-scale keys of [train] (job/job.hpp LossScaleSpec, docs/job-file.md): the defaults
// (GradScaler's 2^16, Megatron's window of 1000), reading and the round trip through job_to_toml,
// and the refusals naming file, key and value: the keys at another precision, the dynamic keys
// with a fixed scale, values out of range, an initial scale below the minimum, and fp16 with a
// [comm] compressor or K-FAC (docs/precision.md "Loss scaling").
#include <gtest/gtest.h>

#include "core/check.hpp"
#include "job/parse.hpp"
#include "job_errors.hpp"

using namespace exatrain;

using job_test::contains;
using job_test::parse_error;

TEST(JobLossScale, DefaultsReadAndRoundTrip) {
  const Job d = parse_job("[train]\nprecision = \"fp16\"\n", "job.toml");
  EXPECT_TRUE(d.train.loss_scale.dynamic);
  EXPECT_EQ(d.train.loss_scale.initial, 65536);
  EXPECT_EQ(d.train.loss_scale.growth_interval, 1000);
  EXPECT_EQ(d.train.loss_scale.growth_factor, 2);
  EXPECT_EQ(d.train.loss_scale.backoff, 0.5);
  EXPECT_EQ(d.train.loss_scale.min_scale, 1);
  EXPECT_EQ(d.train.loss_scale.hysteresis, 2);  // Megatron's --hysteresis, DeepSpeed's hysteresis
  const Job j = parse_job("[train]\nprecision = \"fp16\"\nloss_scale = \"dynamic\"\ninitial_loss_scale = 1024\n"
                          "loss_scale_growth_interval = 50\nloss_scale_growth_factor = 4\nloss_scale_backoff = 0.25\n"
                          "min_loss_scale = 0.5\nloss_scale_hysteresis = 3\n", "job.toml");
  const LossScaleSpec& ls = j.train.loss_scale;
  EXPECT_EQ(ls, (LossScaleSpec{true, 1024, 50, 4, 0.25, 0.5, 3}));
  EXPECT_EQ(parse_job(job_to_toml(j), "roundtrip.toml").train.loss_scale, ls);
  const Job f = parse_job("[train]\nprecision = \"fp16\"\nloss_scale = 128\n", "job.toml");
  EXPECT_FALSE(f.train.loss_scale.dynamic);
  EXPECT_EQ(f.train.loss_scale.initial, 128);
  EXPECT_EQ(parse_job(job_to_toml(f), "roundtrip.toml").train.loss_scale, f.train.loss_scale);
  // Other precisions write no loss-scale key (they would be refused on reading back).
  EXPECT_FALSE(contains(job_to_toml(parse_job("[train]\nprecision = \"bf16\"\n", "job.toml")), "loss_scale"));
}

TEST(JobLossScale, KeysAreRefusedByNameWhereTheyMeanNothing) {
  std::string e = parse_error("[train]\nprecision = \"bf16\"\nloss_scale = \"dynamic\"\nmin_loss_scale = 2\n");
  EXPECT_TRUE(contains(e, "job.toml: [train] loss_scale = \"dynamic\": loss scaling is for [train] precision = "
                          "\"fp16\" only, and this job's precision is \"bf16\"")) << e;
  EXPECT_TRUE(contains(e, "[train] min_loss_scale = 2: loss scaling is for")) << e;
  e = parse_error("[train]\ninitial_loss_scale = 8\n");  // fp32 by default
  EXPECT_TRUE(contains(e, "[train] initial_loss_scale = 8: loss scaling is for [train] precision = \"fp16\" only, and "
                          "this job's precision is \"fp32\"")) << e;
  e = parse_error("[train]\nprecision = \"fp16\"\nloss_scale = 64\nloss_scale_backoff = 0.5\n");
  EXPECT_TRUE(contains(e, "[train] loss_scale_backoff = 0.5: [train] loss_scale = 64 is a fixed scale")) << e;
  e = parse_error("[train]\nprecision = \"fp16\"\nloss_scale = \"static\"\n");
  EXPECT_TRUE(contains(e, "[train] loss_scale = \"static\": expected \"dynamic\" or a number in (2^-64, 2^64]")) << e;
  e = parse_error("[train]\nprecision = \"fp16\"\nloss_scale = -1\n");
  EXPECT_TRUE(contains(e, "[train] loss_scale = -1: expected \"dynamic\" or a number in (2^-64, 2^64]")) << e;
  // A scale whose reciprocal is not a normal float (1/S, the optimizer's gradient factor).
  e = parse_error("[train]\nprecision = \"fp16\"\nmin_loss_scale = 1e-30\n");
  EXPECT_TRUE(contains(e, "[train] min_loss_scale = 1e-30: expected a number in (2^-64, 2^64]")) << e;
  e = parse_error("[train]\nprecision = \"fp16\"\nloss_scale_backoff = 1\n");
  EXPECT_TRUE(contains(e, "[train] loss_scale_backoff = 1: expected a number in [1e-06, 1)")) << e;
  e = parse_error("[train]\nprecision = \"fp16\"\nloss_scale_growth_factor = 1\n");
  EXPECT_TRUE(contains(e, "[train] loss_scale_growth_factor = 1: expected a number in (1, ")) << e;
  e = parse_error("[train]\nprecision = \"fp16\"\nloss_scale_growth_interval = 0\n");
  EXPECT_TRUE(contains(e, "[train] loss_scale_growth_interval = 0: expected an integer in [1, ")) << e;
  e = parse_error("[train]\nprecision = \"fp16\"\nloss_scale_hysteresis = 0\n");
  EXPECT_TRUE(contains(e, "[train] loss_scale_hysteresis = 0: expected an integer in [1, 2147483647]")) << e;
  e = parse_error("[train]\nprecision = \"fp16\"\nloss_scale = 64\nloss_scale_hysteresis = 2\n");
  EXPECT_TRUE(contains(e, "[train] loss_scale_hysteresis = 2: [train] loss_scale = 64 is a fixed scale")) << e;
  e = parse_error("[train]\nprecision = \"bf16\"\nloss_scale_hysteresis = 2\n");
  EXPECT_TRUE(contains(e, "[train] loss_scale_hysteresis = 2: loss scaling is for [train] precision = \"fp16\"")) << e;
  e = parse_error("[train]\nprecision = \"fp16\"\ninitial_loss_scale = 2\nmin_loss_scale = 4\n");
  EXPECT_TRUE(contains(e, "job.toml: [train] initial_loss_scale = 2 is below min_loss_scale = 4")) << e;
}

TEST(JobLossScale, Fp16RefusesCompressorsAndKfac) {
  std::string e = parse_error("[train]\nprecision = \"fp16\"\n[comm]\ncompressor = \"topk\"\n");
  EXPECT_TRUE(contains(e, "job.toml: [train] precision = \"fp16\" with [comm] compressor = \"topk\": the compressor "
                          "would encode loss-scaled gradients")) << e;
  e = parse_error("[train]\nprecision = \"fp16\"\noptimizer = \"kfac\"\n");
  EXPECT_TRUE(contains(e, "[train] precision = \"fp16\" with optimizer = \"kfac\"")) << e;
  // bf16 keeps both; fp16 keeps the dense bf16 reduction (scaled gradients sum exactly, inf stays inf).
  EXPECT_NO_THROW(parse_job("[train]\nprecision = \"bf16\"\n[comm]\ncompressor = \"topk\"\n", "job.toml"));
  EXPECT_NO_THROW(parse_job("[train]\nprecision = \"fp16\"\ngrad_reduce_dtype = \"bf16\"\n", "job.toml"));
  EXPECT_NO_THROW(parse_job("[train]\nprecision = \"fp16\"\noptimizer = \"muon\"\n", "job.toml"));
}
