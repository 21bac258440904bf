// `exatrain calibrate`'s logic (plan/calibrate.hpp): it recovers the constants that made the
// measurements, writes a file `--calibration` reads back, and refuses what it cannot do.
#include <algorithm>
#include <cmath>
#include <filesystem>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include "core/check.hpp"
#include "core/fileio.hpp"
#include "catalog/device.hpp"
#include "plan/calibrate.hpp"
#include "plan/fit.hpp"
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
  EXPECT_EQ(r.at_bound, "");  // 0.55 lies well inside [0.05, 1]
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

TEST(Calibrate, SaysWhenTheRunsAreFasterThanTheBoundsAllow) {
  // Steps 1.5x faster than the device at its whole measured rate (sustained 1, the upper bound): the
  // fit stops at the bound and says so, with the average miss left and what to check.
  Calibration fastest = default_calibration();
  fastest.set("h100-sxm.sustained=1");
  const std::vector<MeasuredRun> exact = measured(fastest);
  std::vector<MeasuredRun> rs = exact;
  for (MeasuredRun& m : rs) m.step_s /= 1.5;
  CalibrationPrior off;
  off.on = false;
  for (const CalibrationPrior& prior : {CalibrationPrior{}, off}) {
    const CalibrateResult r = calibrate(rs, default_calibration(), {"sustained"}, prior);
    EXPECT_NEAR(r.cal.get("h100-sxm.sustained"), 1.0, 0.001);
    EXPECT_EQ(r.at_bound.rfind("h100-sxm.sustained = ", 0), 0u) << r.at_bound;
    EXPECT_NE(r.at_bound.find("is at its upper bound 1, and the runs pull it higher (predicted +50.0% on average): the "
                              "rates it scales (the catalog's figures for h100-sxm) are below what the runs reached, or "
                              "another part of their steps is over-predicted"), std::string::npos) << r.at_bound;
  }
  // Slower than 5% of the rates: the lower bound.
  for (MeasuredRun& m : rs) m.step_s *= 1.5 * 40;
  const CalibrateResult slow = calibrate(rs, default_calibration(), {"sustained"}, off);
  EXPECT_EQ(slow.at_bound.rfind("h100-sxm.sustained = ", 0), 0u) << slow.at_bound;
  EXPECT_NE(slow.at_bound.find("is at its lower bound 0.05, and the runs pull it lower"), std::string::npos)
      << slow.at_bound;
  // Runs that the fit reproduces just inside the bound (0.25% slower than at sustained 1), and runs
  // of which only one is faster than the bound allows: the fit ends inside, or nothing pulls it out.
  rs = exact;
  for (MeasuredRun& m : rs) m.step_s *= 1.0025;
  EXPECT_EQ(calibrate(rs, default_calibration(), {"sustained"}, off).at_bound, "");
  rs[0].step_s /= 1.2;
  EXPECT_EQ(calibrate(rs, default_calibration(), {"sustained"}, off).at_bound, "");
  // An optimum inside the bound by less than the 1e-3 window (runs 0.05% slower than at sustained 1):
  // the fit ends next to the bound, but nothing pulls past it.
  rs = exact;
  for (MeasuredRun& m : rs) m.step_s *= 1.0005;
  const CalibrateResult near = calibrate(rs, default_calibration(), {"sustained"}, off);
  EXPECT_LT(std::abs(std::log(near.cal.get("h100-sxm.sustained"))), 1e-3);
  EXPECT_EQ(near.at_bound, "");
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
  // Network and bw_efficiency are taken only where they predict a run left out better. On these
  // runs with unfused attention (as Megatron's before FlashAttention) attention plays no part.
  auto unfused = [](const Calibration& made_with) {
    std::vector<MeasuredRun> out = measured(default_calibration());
    for (MeasuredRun& m : out) m.plan.attention = Attention::unfused;
    const std::vector<double> t = predict_runs(out, made_with);
    for (size_t i = 0; i < out.size(); ++i) out[i].step_s = t[i];
    return out;
  };
  // Made with the shipped network: network is left out, with that reason.
  const CalibrateResult four = calibrate(unfused(truth), default_calibration(), {});
  EXPECT_NE(four.choice.find("attention not fitted: the step times of these runs do not depend on"), std::string::npos)
      << four.choice;
  EXPECT_EQ(std::count(four.constants.begin(), four.constants.end(), "h100-sxm.network"), 0) << four.choice;
  EXPECT_NE(four.choice.find("network not fitted: it does not lower the leave-one-out MAPE"), std::string::npos)
      << four.choice;
  // Made with collectives 0.2% slower: network would predict a run left out better, but by under
  // 0.1 point (0.04% -> 0.00%), which is the noise of the search and of real runs: left out.
  Calibration tiny = truth;
  tiny.set("h100-sxm.network", 0.998);
  const CalibrateResult small = calibrate(unfused(tiny), default_calibration(), {});
  EXPECT_EQ(small.constants, std::vector<std::string>{"h100-sxm.sustained"}) << small.choice;
  EXPECT_NE(small.choice.find("network not fitted: it does not lower the leave-one-out MAPE by 0.1 points"),
            std::string::npos) << small.choice;
  // Made with collectives at half the model's bandwidth: network is taken and recovered, the prior
  // notwithstanding (at width 1.0 it lets runs that agree through where network is more than
  // noise / (runs sd) of their steps: 0.9% for these four runs, 1.2% in the folds of three), and
  // without it.
  truth.set("h100-sxm.network=0.5");
  for (const char* prior : {"", "off"}) {
    const CalibrateResult slow_net = calibrate(unfused(truth), default_calibration(), {}, parse_prior(prior));
    ASSERT_EQ(std::count(slow_net.constants.begin(), slow_net.constants.end(), "h100-sxm.network"), 1)
        << slow_net.choice;
    EXPECT_NEAR(slow_net.cal.get("h100-sxm.network"), 0.5, 0.02) << prior;
    EXPECT_NEAR(slow_net.cal.get("h100-sxm.sustained"), 0.6, 0.01) << prior;
    EXPECT_LT(slow_net.loo_mape_pct, 0.5) << prior;
  }
}

// A leave-one-out fold that cannot determine every constant fits the longest prefix it can
// (sustained first): without the one long-sequence run, two runs of 1,024 tokens cannot tell
// attention from sustained, so that run is predicted from sustained fitted on the other two.
TEST(Calibrate, LeaveOneOutFoldsFitTheLongestPrefixTheyDetermine) {
  Calibration truth = default_calibration();
  truth.set("h100-sxm.sustained=0.7");
  truth.set("h100-sxm.attention=0.6");
  std::vector<MeasuredRun> rs = {test::measured_run("gpt3-1.3b", "eos", 8, 1, 8, 64, 1024),
                                 test::measured_run("gpt3-1.3b", "eos", 16, 1, 8, 128, 1024),
                                 test::measured_run("gpt3-1.3b", "eos", 8, 1, 1, 8, 32768)};
  const std::vector<double> t = predict_runs(rs, truth);
  for (size_t i = 0; i < rs.size(); ++i) rs[i].step_s = t[i];
  const CalibrateResult r = calibrate(rs, default_calibration(), {"attention", "sustained"});
  ASSERT_EQ(r.left_out.size(), 3u);
  const std::vector<MeasuredRun> short_runs = {rs[0], rs[1]};
  EXPECT_NE(undetermined(short_runs, default_calibration(), {"h100-sxm.sustained", "h100-sxm.attention"}), "");
  const Prior prior = CalibrationPrior{}.of(default_calibration(), {"h100-sxm.sustained"}, find_device("h100-sxm"));
  const Calibration fold = fit_constants(short_runs, default_calibration(), {"h100-sxm.sustained"}, 40, prior).cal;
  EXPECT_DOUBLE_EQ(r.left_out[2], predict_runs({rs[2]}, fold)[0]);
  // ... and is off by what attention alone would have fixed: the long run's attention is 0.6.
  EXPECT_GT(std::fabs(r.left_out[2] / rs[2].step_s - 1), 0.05);
}

TEST(Calibrate, AttentionIsFittedApartFromSustainedOnRunsOfSeveralSequenceLengths) {
  // One model on one GPU count at 1k to 32k tokens per sequence (the same tokens per step):
  // attention's share of the step grows with the sequence, so the runs separate the attention
  // kernel's rate from the rest of the compute. A machine whose attention runs at 0.6 of the
  // model's figure (e.g. a position bias inside the kernel) and sustains 0.68: the automatic
  // choice takes attention before network and bw_efficiency and recovers both.
  Calibration truth = default_calibration();
  truth.set("h100-sxm.sustained=0.68");
  truth.set("h100-sxm.attention=0.6");
  std::vector<MeasuredRun> rs;
  for (int64_t s : {1024, 4096, 16384, 32768})
    rs.push_back(test::measured_run("gpt3-1.3b", "eos", 8, 1, 32768 / s, 8 * 32768 / s, s));
  const std::vector<double> t = predict_runs(rs, truth);
  for (size_t i = 0; i < rs.size(); ++i) rs[i].step_s = t[i];
  const CalibrateResult r = calibrate(rs, default_calibration(), {});
  ASSERT_GE(r.constants.size(), 2u);
  EXPECT_EQ(r.constants[1], "h100-sxm.attention");
  EXPECT_NEAR(r.cal.get("h100-sxm.sustained"), 0.68, 0.01);
  EXPECT_NEAR(r.cal.get("h100-sxm.attention"), 0.6, 0.01);
  EXPECT_LT(r.fit_mape_pct, 0.2);
  EXPECT_LT(r.loo_mape_pct, 0.5) << fmt::format("{}", fmt::join(r.constants, ","));
  // What tells them apart: each run's step falls with either rate by the share of the step it
  // scales (d log step / d log rate = -share): sustained scales all compute, attention included (at
  // most the whole step), attention its own share, which grows with the sequence.
  const auto sens = sensitivities(rs, truth, {"h100-sxm.sustained", "h100-sxm.attention"});
  ASSERT_EQ(sens.size(), rs.size());
  for (size_t i = 0; i < rs.size(); ++i) {
    EXPECT_LT(sens[i][0], 0) << i;
    EXPECT_LT(sens[i][1], 0) << i;
    EXPECT_GE(sens[i][0], -1.0 - 1e-9) << i;
    EXPECT_LT(sens[i][0], sens[i][1]) << i;
    if (i > 0) {
      EXPECT_LT(sens[i][1], sens[i - 1][1] - 0.05) << i;
    }
  }
  EXPECT_TRUE(r.converged);
  // The fitter says when it stopped at its sweep cap: one sweep from the shipped constants has not
  // reached this optimum (the two constants' valley needs the pair directions' later sweeps).
  const FitResult capped = fit_constants(rs, default_calibration(), r.constants, 1);
  EXPECT_EQ(capped.sweeps, 1);
  EXPECT_FALSE(capped.converged);
  const FitResult full = fit_constants(rs, default_calibration(), r.constants);
  EXPECT_TRUE(full.converged);
  EXPECT_GT(full.sweeps, 1);
  // sustained alone cannot absorb it: the runs' errors drift with the sequence length.
  const CalibrateResult alone = calibrate(rs, default_calibration(), {"sustained"});
  EXPECT_GT(alone.loo_mape_pct, 5);
  EXPECT_TRUE(alone.converged);  // one constant: a sweep that gains under the tolerance ends it
  // Runs of one sequence length cannot tell attention from sustained: refused with the reason.
  std::vector<MeasuredRun> same = {test::measured_run("gpt3-1.3b", "eos", 8, 1, 4, 64, 2048),
                                   test::measured_run("gpt3-1.3b", "eos", 16, 1, 4, 128, 2048),
                                   test::measured_run("gpt3-1.3b", "eos", 8, 1, 8, 64, 2048)};
  for (MeasuredRun& m : same) m.step_s = predict_runs({m}, truth)[0];
  try {
    calibrate(same, default_calibration(), {"sustained", "attention"});
    FAIL() << "attention and sustained from runs of one sequence length";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("h100-sxm.attention"), std::string::npos) << e.what();
  }
  EXPECT_NE(calibrate(same, default_calibration(), {}).choice.find("attention not fitted: these 3 runs cannot tell"),
            std::string::npos);
  // A 13B model at 512 and 2048 tokens: the angle test would separate attention (a few percent of
  // the step) from sustained, but its share moves by only a few points between the runs, so the
  // automatic choice leaves it out: a fit would trade one against the other on the runs' noise.
  std::vector<MeasuredRun> large = {test::measured_run("gpt3-13b", "eos", 64, 8, 4, 512, 512),
                                    test::measured_run("gpt3-13b", "eos", 64, 8, 2, 512, 2048),
                                    test::measured_run("gpt3-13b", "eos", 64, 8, 1, 512, 2048)};
  for (MeasuredRun& m : large) m.step_s = predict_runs({m}, truth)[0];
  EXPECT_TRUE(undetermined(large, default_calibration(), {"h100-sxm.sustained", "h100-sxm.attention"}).empty());
  const CalibrateResult few = calibrate(large, default_calibration(), {});
  EXPECT_EQ(std::count(few.constants.begin(), few.constants.end(), "h100-sxm.attention"), 0);
  EXPECT_NE(few.choice.find("attention not fitted: attention's share of these runs' steps differs by 6.0 points"),
            std::string::npos) << few.choice;
}

// The prior (plan/fit.hpp Prior, plan/calibrate.hpp CalibrationPrior): its term, what it does to
// three noisy runs of a machine the starting constants describe, and that runs which agree still
// move a constant as far as they say.
TEST(Calibrate, ThePriorHoldsNoiseBackAndLetsRunsThatAgreeThrough) {
  // The term: Gaussian within one width, linear beyond (a Huber penalty), times 100 noise / groups
  // (its width and noise here are any values, not the defaults).
  Calibration at = default_calibration();
  const double center = at.get("h100-sxm.sustained");
  const Prior p{{center}, {0.05}, 0.04};
  at.set("h100-sxm.sustained", center * std::exp(0.025));  // half a width: z^2 / 2 = 0.125
  EXPECT_NEAR(prior_penalty_pct(p, {"h100-sxm.sustained"}, at, 4), 100 * 0.04 / 4 * 0.125, 1e-9);
  at.set("h100-sxm.sustained", center * std::exp(-0.15));  // three widths: 3 - 1/2
  EXPECT_NEAR(prior_penalty_pct(p, {"h100-sxm.sustained"}, at, 4), 100 * 0.04 / 4 * 2.5, 1e-9);
  EXPECT_EQ(prior_penalty_pct(Prior{}, {"h100-sxm.sustained"}, at, 4), 0);
  // Its widths: narrow for sustained where the family's sustained was fitted to published runs, wide
  // for the rest and elsewhere; --prior overrides them.
  const CalibrationPrior def;
  EXPECT_EQ(def.sd("sustained", find_device("h100-sxm")), 0.06);
  EXPECT_EQ(def.sd("attention", find_device("a100-80g")), 1.0);
  EXPECT_EQ(def.sd("network", find_device("a100-80g")), 1.0);
  EXPECT_EQ(def.sd("sustained", find_device("mi250x-gcd")), 1.0);
  const CalibrationPrior given = parse_prior("attention=0.1,noise=0.02");
  EXPECT_EQ(given.sd("attention", find_device("h100-sxm")), 0.1);
  EXPECT_EQ(given.sd("sustained", find_device("h100-sxm")), 0.06);
  EXPECT_EQ(given.noise, 0.02);
  EXPECT_FALSE(parse_prior("off").on);
  // What the report and the file print reads back as the same prior.
  const std::string printed = def.describe(find_device("h100-sxm"));
  EXPECT_EQ(printed, "sustained=0.06,bw_efficiency=1,network=1,attention=1,noise=0.037");
  EXPECT_EQ(parse_prior(printed).describe(find_device("h100-sxm")), printed);
  EXPECT_EQ(parse_prior(printed).describe(find_device("mi250x-gcd")), printed);
  for (auto [bad, why] : std::initializer_list<std::pair<const char*, const char*>>{
           {"speed=0.1", "item 'speed=0.1': 'speed' is neither a machine constant"},
           {"sustained=-1", "item 'sustained=-1': '-1' is not a number > 0"},
           {"sustained=0", "'0' is not a number > 0"},
           {"noise=nan", "'nan' is not a number > 0"},
           {"sustained=0.1x", "'0.1x' is not a number > 0"},
           {"sustained= 0.1", "' 0.1' is not a number > 0"},
           {"sustained", "item 'sustained': not NAME=VALUE"},
           {"sustained=0.1,", "item '': an empty item"},
           {"sustained=0.1,sustained=0.2", "item 'sustained=0.2': sustained is given twice"},
           {"noise=2", "noise is a fraction"},
           {"=0.1", "item '=0.1': an empty name"},
           {"off,noise=0.1", "item 'off': not NAME=VALUE"},
           {"off=1", "'off' stands alone"}}) {
    try {
      parse_prior(bad);
      FAIL() << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(fmt::format("--prior {}: ", bad)), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  }
  // A machine the shipped constants describe, measured with 3% noise on three runs of 1k, 8k and
  // 32k tokens: without the prior, sustained and attention fit the noise (two constants, three
  // runs) and move away from the truth; with it they stay nearer, and the machine's other runs
  // (2k, 4k, 16k tokens, no noise) are predicted better.
  auto runs = [](std::initializer_list<int64_t> seqs) {
    std::vector<MeasuredRun> out;
    for (int64_t s : seqs) out.push_back(test::measured_run("gpt3-1.3b", "eos", 8, 1, 32768 / s, 8 * 32768 / s, s));
    const std::vector<double> t = predict_runs(out, default_calibration());
    for (size_t i = 0; i < out.size(); ++i) out[i].step_s = t[i];
    return out;
  };
  std::vector<MeasuredRun> three = runs({1024, 8192, 32768});
  three[0].step_s *= 1.03, three[1].step_s *= 0.97, three[2].step_s *= 1.03;
  const std::vector<MeasuredRun> rest = runs({2048, 4096, 16384});
  // Runs of one source, as a CSV's rows are: calibrate weighs each run as its own group.
  for (MeasuredRun& m : three) m.group = "one source";
  const std::vector<std::string> both = {"sustained", "attention"};
  const CalibrateResult plain = calibrate(three, default_calibration(), both, parse_prior("off"));
  const CalibrateResult held = calibrate(three, default_calibration(), both);
  // The fit minimised the MAPE plus the prior's term with one group per run.
  std::vector<MeasuredRun> own = three;
  for (MeasuredRun& m : own) m.group = m.label;
  const FitResult again = fit_constants(own, default_calibration(), held.constants, 40,
                                        def.of(default_calibration(), held.constants, find_device("h100-sxm")));
  EXPECT_NEAR(again.objective_pct,
              held.fit_mape_pct + prior_penalty_pct(def.of(default_calibration(), held.constants, find_device("h100-sxm")),
                                                    held.constants, held.cal, three.size()), 1e-9);
  EXPECT_EQ(again.cal.get("h100-sxm.sustained"), held.cal.get("h100-sxm.sustained"));
  auto moved = [](const CalibrateResult& r, const char* c) {
    return std::fabs(std::log(r.cal.get(c) / default_calibration().get(c)));
  };
  EXPECT_LT(moved(held, "h100-sxm.sustained"), moved(plain, "h100-sxm.sustained"));
  EXPECT_LT(moved(held, "h100-sxm.attention"), moved(plain, "h100-sxm.attention"));
  const double plain_rest = mape_pct(rest, predict_runs(rest, plain.cal));
  const double held_rest = mape_pct(rest, predict_runs(rest, held.cal));
  EXPECT_LT(held_rest, plain_rest);
  EXPECT_EQ(held.prior, printed);
  EXPECT_EQ(plain.prior, "off");
  // Runs that agree: a machine 20% slower than the shipped sustained (3.7 widths) is recovered,
  // since beyond one width the prior pulls no harder (RecoversTheMachine... recovers 0.55 with it).
  Calibration slow = default_calibration();
  slow.set("h100-sxm.sustained", 0.8 * center);
  std::vector<MeasuredRun> agree = runs({1024, 8192, 32768});
  const std::vector<double> t = predict_runs(agree, slow);
  for (size_t i = 0; i < agree.size(); ++i) agree[i].step_s = t[i];
  const CalibrateResult recovered = calibrate(agree, default_calibration(), {"sustained"});
  EXPECT_NEAR(recovered.cal.get("h100-sxm.sustained"), 0.8 * center, 0.002);
}

// The prior is centred on the constants the predictions start from, however they were given: a
// family's override ("hopper.sustained" for every Hopper device) or the device's.
TEST(Calibrate, AFamilysStartAndADevicesStartGiveOneCalibration) {
  std::vector<MeasuredRun> rs = measured(default_calibration());
  rs[0].step_s *= 1.04, rs[1].step_s *= 0.98, rs[2].step_s *= 1.05, rs[3].step_s *= 0.97;
  Calibration by_family = default_calibration(), by_device = default_calibration();
  by_family.set("hopper.sustained", 0.6);
  by_device.set("h100-sxm.sustained", 0.6);
  EXPECT_EQ(by_family.get("h100-sxm.sustained"), 0.6);  // what the predictions use
  const CalibrateResult f = calibrate(rs, by_family, {"sustained"}), d = calibrate(rs, by_device, {"sustained"});
  EXPECT_EQ(f.before, d.before);
  EXPECT_DOUBLE_EQ(f.cal.get("h100-sxm.sustained"), d.cal.get("h100-sxm.sustained"));
  EXPECT_EQ(f.left_out, d.left_out);
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
