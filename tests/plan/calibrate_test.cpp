// `exatrain calibrate`'s logic (plan/calibrate.hpp): it recovers the constants that made the
// measurements, writes a file `--calibration` reads back, and refuses what it cannot do.
#include <filesystem>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "core/check.hpp"
#include "core/fileio.hpp"
#include "plan/calibrate.hpp"
#include "../test_util/measured_run.hpp"

using namespace exatrain;
using namespace exatrain::plan;

namespace {
// Megatron-style runs on Eos (h100-sxm), global batch 8 per GPU.
MeasuredRun run(const std::string& preset, const std::string& cluster, int64_t gpus, int64_t tp, int64_t mb) {
  return test::measured_run(preset, cluster, gpus, tp, mb, 8 * gpus);
}
std::vector<MeasuredRun> measured(const Calibration& truth) {
  std::vector<MeasuredRun> rs = {run("gpt3-1.3b", "eos", 8, 1, 4), run("gpt3-6.7b", "eos", 64, 8, 2),
                                 run("gpt3-13b", "eos", 256, 8, 1), run("gpt3-350m", "eos", 16, 1, 8)};
  const std::vector<double> t = predict_runs(rs, truth);
  for (size_t i = 0; i < rs.size(); ++i) rs[i].step_s = t[i];
  return rs;
}
}  // namespace

TEST(Calibrate, RecoversTheMachineAndWritesAFileThatReadsBack) {
  Calibration truth = default_calibration();
  truth.set("h100-sxm.sustained=0.55");
  const std::vector<MeasuredRun> rs = measured(truth);
  const CalibrateResult r = calibrate(rs, default_calibration(), {"sustained"});
  EXPECT_EQ(r.device, "h100-sxm");
  ASSERT_EQ(r.constants, std::vector<std::string>{"h100-sxm.sustained"});
  EXPECT_NEAR(r.cal.get("h100-sxm.sustained"), 0.55, 0.002);
  EXPECT_LT(r.fit_mape_pct, 0.1);
  EXPECT_LT(r.loo_mape_pct, 0.2);  // the runs agree: leaving one out changes nothing
  EXPECT_GT(r.before_mape_pct, 5);
  const std::string file = std::filesystem::temp_directory_path() / fmt::format("cal-{}.toml", getpid());
  write_file_atomic(file, calibration_toml(r, rs));
  const Calibration back = load_calibration(file);
  EXPECT_NEAR(back.get("h100-sxm.sustained"), r.cal.get("h100-sxm.sustained"), 1e-5);
  EXPECT_EQ(calibration_devices(file), std::vector<std::string>{"h100-sxm"});
  EXPECT_NO_THROW(check_calibration_device(file, "h100-sxm"));
  try {
    check_calibration_device(file, "a100-80g");
    FAIL() << "another device's calibration must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("calibrates h100-sxm, but this job runs on a100-80g"), std::string::npos) << e.what();
  }
  std::filesystem::remove(file);
}

TEST(Calibrate, AutomaticChoiceFitsOnlyWhatTheRunsDetermine) {
  Calibration truth = default_calibration();
  truth.set("h100-sxm.sustained=0.6");
  // One run: sustained alone, no leave-one-out.
  const std::vector<MeasuredRun> rs = measured(truth);
  const CalibrateResult one = calibrate({rs[1]}, default_calibration(), {});
  EXPECT_EQ(one.constants, std::vector<std::string>{"h100-sxm.sustained"});
  EXPECT_EQ(one.loo_mape_pct, -1);
  EXPECT_NE(one.choice.find("network not fitted: 1 runs"), std::string::npos) << one.choice;
}

TEST(Calibrate, RefusesWhatTheRunsCannotDo) {
  const std::vector<MeasuredRun> rs = measured(default_calibration());
  // Runs of two machines.
  std::vector<MeasuredRun> mixed = rs;
  mixed.push_back(run("gpt3-1.3b", "selene", 8, 1, 4));
  mixed.back().step_s = 1;
  try {
    calibrate(mixed, default_calibration(), {});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("2 devices (a100-80g, h100-sxm)"), std::string::npos) << e.what();
  }
  // An explicit list the runs cannot determine: one run, three constants.
  try {
    calibrate({rs[0]}, default_calibration(), {"sustained", "network", "bw_efficiency"});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("1 run cannot determine 3 constants"), std::string::npos) << e.what();
  }
  // A constant that is not one.
  EXPECT_THROW(calibrate(rs, default_calibration(), {"speed"}), Error);
}

TEST(Calibrate, BadCalibrationFilesNameTheFileAndKey) {
  const std::string file = std::filesystem::temp_directory_path() / fmt::format("badcal-{}.toml", getpid());
  write_file_atomic(file, "[device.h100-sxm]\nsustained = 1.5\n");
  try {
    load_calibration(file);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(file + ": [device.h100-sxm] sustained"), std::string::npos) << e.what();
  }
  write_file_atomic(file, "[device.h100-sxm]\nspeed = 0.5\n");
  EXPECT_THROW(load_calibration(file), Error);
  write_file_atomic(file, "[devices]\nx = 1\n");
  EXPECT_THROW(load_calibration(file), Error);
  std::filesystem::remove(file);
  EXPECT_THROW(load_calibration(file), Error);  // missing
}
