// metrics.jsonl reading/writing, the summary's numbers, and the SVG report.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/check.hpp"
#include "job/parse.hpp"
#include "report/metrics.hpp"
#include "report/report.hpp"
#include "report/svg_chart.hpp"

using namespace exatrain;
using namespace exatrain::report;

namespace {
std::string fresh_dir(const std::string& name) {
  std::string d = testing::TempDir() + "/" + name;
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}
size_t count(const std::string& s, const std::string& part) {
  size_t n = 0;
  for (size_t p = s.find(part); p != std::string::npos; p = s.find(part, p + 1)) ++n;
  return n;
}
}  // namespace

TEST(SvgChart, NiceTicksAreRoundAndCoverTheRange) {
  EXPECT_EQ(nice_ticks(0, 10, 5), (std::vector<double>{0, 2, 4, 6, 8, 10}));
  auto f = nice_ticks(0.13, 0.91, 4);
  std::vector<double> want{0.2, 0.4, 0.6, 0.8};
  ASSERT_EQ(f.size(), want.size());
  for (size_t i = 0; i < f.size(); ++i) EXPECT_NEAR(f[i], want[i], 1e-12);
  auto t = nice_ticks(1, 200, 6);
  EXPECT_EQ(t.front(), 50);
  EXPECT_EQ(t.back(), 200);
}

// A metrics file is untrusted: a range at the edge of a double (found by fuzz/metrics_fuzz.cpp:
// 1e308 twice made the step 0 and the tick index an integer overflow) gets its two ends.
TEST(SvgChart, NiceTicksOfADegenerateRangeAreItsEnds) {
  EXPECT_EQ(nice_ticks(1e308, 1e308), (std::vector<double>{1e308, 1e308}));
  EXPECT_EQ(nice_ticks(-1.7e308, 1.7e308), (std::vector<double>{-1.7e308, 1.7e308}));
  EXPECT_EQ(nice_ticks(1e20, 1e20 + 1e5), (std::vector<double>{1e20, 1e20 + 1e5}));
  EXPECT_TRUE(nice_ticks(-INFINITY, 1).empty());
  EXPECT_TRUE(nice_ticks(0, NAN).empty());
}

TEST(SvgChart, PointsWithANonFiniteCoordinateAreNotDrawn) {
  Chart c;
  c.title = "t";
  c.series.push_back({"s", "#000", {1, INFINITY, 3}, {1, 2, NAN}, true, ""});
  const std::string g = chart_group(c, 0, 0, 600, 300);
  EXPECT_EQ(count(g, "<circle"), 1u) << g;
  EXPECT_EQ(g.find("nan"), std::string::npos) << g;
  EXPECT_EQ(g.find("inf"), std::string::npos) << g;
}

TEST(SvgChart, ALogXAxisSpacesDecadesEquallyAndDropsNonPositiveX) {
  Chart c;
  c.log_x = true;
  c.series.push_back({"bytes", "#000", {0, 1e3, 1e4, 1e5}, {1, 2, 3, 4}, false, ""});
  const std::string g = chart_group(c, 0, 0, 600, 300);
  // Plot width 600 - 70 - 150 = 380 from x = 70: 1e3, 1e4, 1e5 at 70, 260, 450; x = 0 is not drawn.
  EXPECT_NE(g.find("points=\"70.0,"), std::string::npos) << g;
  EXPECT_NE(g.find(" 260.0,"), std::string::npos) << g;
  EXPECT_NE(g.find(" 450.0,"), std::string::npos) << g;
  EXPECT_NE(g.find(">1e+04<"), std::string::npos) << g;  // ticks at whole decades, labelled in data units
  EXPECT_EQ(g.find(">3162<"), std::string::npos) << g;
}

TEST(Metrics, WriteThenReadRoundTripsAndAppends) {
  std::string d = fresh_dir("metrics_rt");
  {
    MetricsWriter w(d + "/metrics.jsonl");
    w.write({{"step", 1}, {"loss", 5.5}});
  }
  {
    MetricsWriter w(d + "/metrics.jsonl");  // a resumed run appends
    w.write({{"step", 2}, {"loss", 4.5}});
  }
  auto r = read_metrics(d + "/metrics.jsonl");
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[1]["step"], 2);
  EXPECT_DOUBLE_EQ(r[1]["loss"].get<double>(), 4.5);
}

TEST(Metrics, TornLastLineIsSkippedButCorruptionElsewhereIsNamed) {
  std::string d = fresh_dir("metrics_torn");
  std::ofstream(d + "/metrics.jsonl") << "{\"step\":1,\"loss\":3}\n{\"step\":2,\"lo";
  EXPECT_EQ(read_metrics(d + "/metrics.jsonl").size(), 1u);
  std::ofstream(d + "/metrics.jsonl") << "{\"step\":1,\"loss\":3}\ngarbage\n{\"step\":2,\"loss\":2}\n";
  try {
    read_metrics(d + "/metrics.jsonl");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("metrics.jsonl:2: not a JSON object"), std::string::npos) << e.what();
  }
}

// Found by fuzz_metrics (fuzz/regressions/metrics/): a whole line whose number is beyond a double
// made nlohmann::json throw out_of_range, which the CLI printed as "internal error"; also as the
// last line (it is not torn: it parsed to the end).
TEST(Metrics, NumberBeyondADoubleIsAClearError) {
  std::string d = fresh_dir("metrics_overflow");
  for (const char* text : {"{\"step\":1,\"loss\":1e400}\n{\"step\":2,\"loss\":1.0}\n", "{\"step\":1,\"loss\":1e400}\n"}) {
    std::ofstream(d + "/metrics.jsonl") << text;
    try {
      read_metrics(d + "/metrics.jsonl");
      FAIL() << text;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("metrics.jsonl:1: not a metrics record: [json.exception.out_of_range.406] "
                                           "number overflow parsing '1e400'"),
                std::string::npos)
          << e.what();
    }
  }
}

TEST(Report, SummaryNumbersAndSvgSeries) {
  std::string d = fresh_dir("report_run");
  {
    MetricsWriter w(d + "/metrics.jsonl");
    for (int s = 1; s <= 10; ++s) {
      // Step 1 is slow (warm-up) and must not enter the medians.
      w.write({{"step", s}, {"loss", 10.0 - s}, {"grad_norm", 1.0}, {"lr", 1e-3},
               {"tokens_per_s", s == 1 ? 1.0 : 100.0 * s}, {"mfu", s == 1 ? 0.0 : 0.01 * s}});
      if (s % 5 == 0) w.write({{"step", s}, {"val_loss", s == 5 ? 4.0 : 4.5}});
    }
  }
  RunSummary s = write_report(d);
  EXPECT_EQ(s.steps, 10);
  EXPECT_DOUBLE_EQ(s.first_loss, 9.0);
  EXPECT_DOUBLE_EQ(s.last_loss, 0.0);
  EXPECT_DOUBLE_EQ(s.best_val_loss, 4.0);
  EXPECT_EQ(s.best_val_step, 5);
  EXPECT_DOUBLE_EQ(s.median_tokens_per_s, 600.0);  // median of 200..1000
  EXPECT_NEAR(s.median_mfu, 0.06, 1e-12);
  std::ifstream in(s.svg_path);
  std::string svg((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_EQ(count(svg, "<polyline"), 4u);  // train loss, val loss, tokens/s, MFU
  EXPECT_EQ(count(svg, "<circle"), 2u);    // the two validation points
  std::string text = format_summary(s, d);
  EXPECT_NE(text.find("best val loss     4.0000 (step 5)"), std::string::npos) << text;
}

TEST(Report, MissingOrEmptyMetricsAreClearErrors) {
  std::string d = fresh_dir("report_empty");
  try {
    write_report(d);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot open metrics file"), std::string::npos) << e.what();
  }
  std::ofstream(d + "/metrics.jsonl") << "{\"step\":5,\"val_loss\":3}\n";
  try {
    write_report(d);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("has no training-step records"), std::string::npos) << e.what();
  }
}

// The step the prediction column shows, parsed from the table ("    step   MEASURED   PREDICTED").
double predicted_step(const std::string& table) {
  const size_t at = table.find("    step ");
  EXPECT_NE(at, std::string::npos) << table;
  std::istringstream row(table.substr(at));
  std::string name;
  double measured = 0, predicted = 0;
  row >> name >> measured >> predicted;
  return predicted;
}

TEST(Report, ACalibrationFileSetsThePredictionAndAnotherDevicesIsRefused) {
  std::string d = fresh_dir("report_calibrated");
  // A model whose step is mostly GEMMs (about 0.6 TFLOP a step), so that their rate shows.
  std::ofstream(d + "/job.toml") << "[model]\nlayers = 2\nhidden = 1024\nheads = 8\nseq_len = 512\nvocab = 256\n"
                                    "[machine]\npreset = \"local\"\ndevice = \"cpu-local-2c\"\n"
                                    "[parallel]\ngpus = 1\nglobal_batch = 8\nmicro_batch = 8\n"
                                    "[train]\nprecision = \"fp32\"\n";
  {
    MetricsWriter w(d + "/metrics.jsonl");
    for (int s = 1; s <= 3; ++s) w.write({{"step", s}, {"loss", 3.0}, {"seconds", 0.1}});
  }
  const auto records = read_metrics(d + "/metrics.jsonl");
  const std::string shipped = measured_vs_predicted(records, d);
  EXPECT_EQ(shipped.find("--calibration"), std::string::npos) << shipped;
  // Half the shipped sustained rate (cpu-local-2c's is 1): the GEMMs, most of this step, take twice as long.
  std::ofstream(d + "/half.toml") << "[device.cpu-local-2c]\nsustained = 0.5\n";
  const std::string calibrated = measured_vs_predicted(records, d, d + "/half.toml");
  EXPECT_NE(calibrated.find("`exatrain predict --calibration " + d + "/half.toml` of this run's job"), std::string::npos)
      << calibrated;
  EXPECT_EQ(calibrated.find("no prediction"), std::string::npos) << calibrated;
  EXPECT_GT(predicted_step(calibrated), 1.5 * predicted_step(shipped)) << shipped << calibrated;
  EXPECT_LE(predicted_step(calibrated), 2.0 * predicted_step(shipped)) << shipped << calibrated;
  // The same file through write_report, as `exatrain report RUN --calibration FILE` calls it.
  EXPECT_EQ(write_report(d, d + "/half.toml").comparison, calibrated);
  // A calibration of another machine would silently change nothing: refused, naming both devices.
  std::ofstream(d + "/h100.toml") << "[device.h100-sxm]\nsustained = 0.7\n";
  try {
    measured_vs_predicted(records, d, d + "/h100.toml");
    FAIL() << "a calibration of h100-sxm was used for a cpu-local-2c run";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(d + "/h100.toml calibrates h100-sxm, but this job runs on cpu-local-2c"),
              std::string::npos) << e.what();
  }
  // A missing file is an Error whatever the run: a job the planner can predict, one it cannot (no
  // bandwidth between its two ranks), and a run without a timed step (nothing to predict).
  const std::string job = "[model]\nlayers = 2\nhidden = 64\nheads = 4\nseq_len = 32\nvocab = 256\n"
                          "[parallel]\ngpus = 2\ndp = 2\nglobal_batch = 4\n[train]\nprecision = \"fp32\"\n";
  for (const std::string machine : {"", "[machine]\ndevice = \"cpu-local-2c\"\n"}) {
    if (!machine.empty()) std::ofstream(d + "/job.toml") << job << machine;
    for (const auto& recs : {records, std::vector<nlohmann::json>(records.begin(), records.begin() + 1)}) {
      try {
        measured_vs_predicted(recs, d, d + "/missing.toml");
        FAIL() << "a missing calibration file was ignored";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("calibration file " + d + "/missing.toml not found"), std::string::npos)
            << e.what();
      }
    }
  }
  // A job on a device the catalog does not know cannot be predicted: said in the table, as without a
  // calibration, not thrown.
  std::ofstream(d + "/job.toml") << job << "[machine]\ndevice = \"no-such-device\"\n";
  EXPECT_NE(measured_vs_predicted(records, d, d + "/half.toml").find("(no prediction: "), std::string::npos);
}

TEST(Report, MeasuredNextToPredictedUsesTheSlowestRankAndThePlanner) {
  std::string d = fresh_dir("report_breakdown");
  std::ofstream(d + "/job.toml") << "[model]\nlayers = 2\nhidden = 64\nheads = 4\nseq_len = 32\nvocab = 256\n"
                                    "[machine]\npreset = \"local\"\n[parallel]\ngpus = 2\ndp = 2\nglobal_batch = 4\n"
                                    "[train]\nprecision = \"fp32\"\n";
  {
    MetricsWriter w(d + "/metrics.jsonl");
    for (int s = 1; s <= 4; ++s)
      w.write({{"step", s}, {"loss", 3.0}, {"seconds", 0.1 * s},
               {"breakdown_s_per_rank", {{{"compute", 0.01 * s}, {"dp_comm", 0.5}}, {{"compute", 0.02 * s}, {"dp_comm", 0.25}}}}});
  }
  std::string t = measured_vs_predicted(read_metrics(d + "/metrics.jsonl"), d);
  // Steps 2..4: slowest rank's compute 0.04, 0.06, 0.08 -> median 0.06; dp_comm 0.5; step median 0.3.
  EXPECT_NE(t.find("compute        0.0600"), std::string::npos) << t;
  EXPECT_NE(t.find("dp_comm        0.5000"), std::string::npos) << t;
  EXPECT_NE(t.find("step           0.3000"), std::string::npos) << t;
  EXPECT_EQ(t.find("no prediction"), std::string::npos) << t;  // the planner predicted this job
  // No [machine]: this machine (the local cluster), so the planner predicts.
  const std::string two_ranks = "[model]\nlayers = 2\nhidden = 64\nheads = 4\nseq_len = 32\nvocab = 256\n"
                                "[parallel]\ngpus = 2\ndp = 2\nglobal_batch = 4\n[train]\nprecision = \"fp32\"\n";
  std::ofstream(d + "/job.toml") << two_ranks;
  t = measured_vs_predicted(read_metrics(d + "/metrics.jsonl"), d);
  EXPECT_EQ(t.find("no prediction"), std::string::npos) << t;
  // A machine without bandwidth between the two ranks: no (infinite) prediction but the reason.
  std::ofstream(d + "/job.toml") << two_ranks << "[machine]\ndevice = \"cpu-local\"\n";
  t = measured_vs_predicted(read_metrics(d + "/metrics.jsonl"), d);
  EXPECT_EQ(t.find("inf"), std::string::npos) << t;
  EXPECT_NE(t.find("(no prediction: " + d + "/job.toml: machine.inter_node_bw_gbs = 0"), std::string::npos) << t;
  std::ofstream(d + "/job.toml") << "[model]\nhidden = 64\nheads = 4\n[machine]\ndevice = \"no-such-device\"\n";
  t = measured_vs_predicted(read_metrics(d + "/metrics.jsonl"), d);
  EXPECT_NE(t.find("no prediction"), std::string::npos) << t;
}

TEST(Report, ARunIsPredictedAsThisTrainerRanIt) {
  // A job that plans Megatron's overlapped pipeline sends: this trainer's block, so the prediction
  // next to the measured step is the job's without them, and a line says so.
  std::string d = fresh_dir("report_as_run");
  const std::string job = "[model]\nlayers = 4\nhidden = 64\nheads = 4\nseq_len = 32\nvocab = 256\n"
                          "[machine]\npreset = \"local\"\n[parallel]\ngpus = 2\npp = 2\nvp = 2\nglobal_batch = 4\n"
                          "[train]\nprecision = \"fp32\"\n";
  {
    MetricsWriter w(d + "/metrics.jsonl");
    for (int s = 1; s <= 3; ++s) w.write({{"step", s}, {"loss", 3.0}, {"seconds", 0.1}, {"breakdown_s_per_rank", {{{"pp_comm", 0.01}}}}});
  }
  const auto records = read_metrics(d + "/metrics.jsonl");
  std::ofstream(d + "/job.toml") << job;
  const std::string as_run = measured_vs_predicted(records, d);
  EXPECT_EQ(as_run.find("not as planned"), std::string::npos) << as_run;
  std::ofstream(d + "/job.toml") << std::string(job).insert(job.find("global_batch"), "overlap_p2p_comm = true\n");
  const std::string planned = measured_vs_predicted(records, d);
  const std::string note = "    (predicted as this trainer ran it, not as planned: overlap_p2p_comm = true: this "
                           "trainer's pipeline messages are non-blocking MPI sends and receives, which MPI moves only "
                           "inside its calls (weak progress, no progress thread): counted exposed)\n";
  std::string expected = as_run + note;
  const std::string job_header = "of this run's job)";
  expected.replace(expected.find(job_header), job_header.size(), "of this run's job, as this trainer ran it (below))");
  EXPECT_EQ(planned, expected);
  // The measured run `calibrate` fits to has the same plan.
  EXPECT_FALSE(measured_run(d).plan.overlap_p2p_comm);
  EXPECT_TRUE(load_job(d + "/job.toml").parallel.overlap_p2p_comm);  // which the job plans
}

