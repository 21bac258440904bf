// The fitter behind `validate` and `calibrate` (plan/fit.hpp): it recovers constants that generated
// the measurements, and it refuses runs that cannot determine what it is asked to fit.
#include <cmath>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "catalog/device.hpp"
#include "plan/fit.hpp"
#include "../test_util/measured_run.hpp"

using namespace exatrain;
using namespace exatrain::plan;

namespace {
// GPT-3 style runs on Selene (a100-80g) that differ in size, tp and node count.
MeasuredRun run(const std::string& preset, int64_t gpus, int64_t tp, int64_t micro_batch, int64_t global_batch) {
  return test::measured_run(preset, "selene", gpus, tp, micro_batch, global_batch);
}
std::vector<MeasuredRun> runs() {
  return {run("gpt3-1.3b", 8, 1, 8, 64), run("gpt3-6.7b", 64, 8, 4, 256), run("gpt3-13b", 256, 8, 2, 512),
          run("gpt3-350m", 16, 1, 16, 256), run("gpt3-2.7b", 128, 2, 4, 512)};
}
}  // namespace

TEST(Fit, RecoversTheConstantsThatMadeTheMeasurements) {
  std::vector<MeasuredRun> rs = runs();
  Calibration truth = default_calibration();
  truth.set("a100-80g.sustained=0.61");
  truth.set("a100-80g.network=0.55");
  const std::vector<double> measured = predict_runs(rs, truth);
  for (size_t i = 0; i < rs.size(); ++i) rs[i].step_s = measured[i];
  const std::vector<std::string> fit = {"a100-80g.sustained", "a100-80g.network"};
  ASSERT_EQ(undetermined(rs, default_calibration(), fit), "");
  const FitResult r = fit_constants(rs, default_calibration(), fit);
  EXPECT_NEAR(r.cal.get("a100-80g.sustained"), 0.61, 0.003);
  EXPECT_NEAR(r.cal.get("a100-80g.network"), 0.55, 0.01);
  EXPECT_LT(r.objective_pct, 0.2);
  EXPECT_NEAR(mape_pct(rs, r.predicted), 0, 0.2);
}

TEST(Fit, RefusesRunsThatCannotDetermineTheConstants) {
  std::vector<MeasuredRun> rs = runs();
  for (MeasuredRun& r : rs) r.step_s = 1;
  // Fewer runs than constants.
  const std::string few = undetermined({rs[0], rs[1]}, default_calibration(),
                                       {"a100-80g.sustained", "a100-80g.network", "a100-80g.bw_efficiency"});
  EXPECT_NE(few.find("2 runs cannot determine 3 constants"), std::string::npos) << few;
  // A constant no run depends on: the network on one GPU.
  MeasuredRun single = run("gpt3-1.3b", 1, 1, 8, 8);
  single.step_s = 1;
  const std::string none = undetermined({single, single}, default_calibration(), {"a100-80g.network"});
  EXPECT_NE(none.find("do not depend on a100-80g.network"), std::string::npos) << none;
  // Two constants the runs move the same way: copies of one run cannot separate compute from
  // memory bandwidth.
  const std::string same = undetermined({rs[3], rs[3], rs[3]}, default_calibration(),
                                        {"a100-80g.sustained", "a100-80g.bw_efficiency"});
  EXPECT_NE(same.find("cannot tell a100-80g.sustained and a100-80g.bw_efficiency apart"), std::string::npos) << same;
}

TEST(Fit, GroupMapeWeighsEachGroupOnce) {
  std::vector<MeasuredRun> rs(3);
  rs[0].group = "a", rs[1].group = "a", rs[2].group = "b";
  for (MeasuredRun& r : rs) r.step_s = 1;
  // Group a: errors 10% and 10%; group b: 40%. Mean over groups 25%, over rows 20%.
  EXPECT_NEAR(group_mape_pct(rs, {1.1, 0.9, 1.4}), 25, 1e-9);
  EXPECT_NEAR(mape_pct(rs, {1.1, 0.9, 1.4}), 20, 1e-9);
}
