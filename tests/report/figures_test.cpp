// The figures of report/figures.hpp (stacked bars, timelines) and the comparison of runs
// (report/compare.hpp): geometry proportional to the values, the legend, errors for bad input,
// and the comparison's largest relative loss difference.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <regex>

#include "core/check.hpp"
#include "report/compare.hpp"
#include "report/figures.hpp"
#include "report/metrics.hpp"
#include "../test_util/temp_dir.hpp"

using namespace exatrain;
using namespace exatrain::report;

namespace {
// The width attributes of every <rect ... fill="COLOUR"> but the legend's 10 x 10 squares: the
// segments of one part, or the boxes of one colour.
std::vector<double> widths_of(const std::string& svg, const std::string& colour) {
  std::vector<double> w;
  std::regex rect("<rect x=\"[^\"]+\" y=\"[^\"]+\" width=\"([0-9.]+)\" height=\"([^\"]+)\" fill=\"" + colour + "\"");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), rect); it != std::sregex_iterator(); ++it)
    if ((*it)[2] != "10") w.push_back(std::stod((*it)[1]));
  return w;
}
size_t count(const std::string& s, const std::string& part) {
  size_t n = 0;
  for (size_t p = s.find(part); p != std::string::npos; p = s.find(part, p + 1)) ++n;
  return n;
}
}  // namespace

TEST(BarFigure, SegmentsAreProportionalToTheirValues) {
  BarPanel p{"t", "s", {"compute", "comm", "idle"}, {{"a", {3, 1, 0}, "4 s"}, {"b", {6, 0, 2}, "8 s"}}, 0, ""};
  const std::string svg = bar_panels_svg({p});
  const auto compute = widths_of(svg, palette(0)), comm = widths_of(svg, palette(1)), idle = widths_of(svg, palette(2));
  ASSERT_EQ(compute.size(), 2u);
  ASSERT_EQ(comm.size(), 1u);  // a zero segment is not drawn
  ASSERT_EQ(idle.size(), 1u);
  EXPECT_NEAR(compute[1] / compute[0], 2.0, 1e-3);
  EXPECT_NEAR(compute[0] / comm[0], 3.0, 1e-3);
  EXPECT_NEAR(idle[0] / comm[0], 2.0, 1e-3);
  EXPECT_NE(svg.find(">8 s<"), std::string::npos);
  EXPECT_NE(svg.find("<svg xmlns=\"http://www.w3.org/2000/svg\""), std::string::npos);
}

TEST(BarFigure, LegendLeavesOutPartsThatAreZeroEverywhereAndDrawsTheLimit) {
  BarPanel p{"memory", "GiB", {"params", "unused", "activations"}, {{"x", {1, 0, 2}, ""}}, 80, "device 80 GiB"};
  const std::string svg = bar_panels_svg({p});
  EXPECT_NE(svg.find(">params<"), std::string::npos);
  EXPECT_NE(svg.find(">activations<"), std::string::npos);
  EXPECT_EQ(svg.find(">unused<"), std::string::npos);
  EXPECT_NE(svg.find(">device 80 GiB<"), std::string::npos);
  EXPECT_EQ(count(svg, "stroke-dasharray=\"5 3\""), 2u);  // the limit line and its legend key
}

TEST(BarFigure, LongLabelsWidenTheFigureInsteadOfLeavingIt) {
  const std::string label(200, 'x');
  BarPanel p{"t", "s", {"a"}, {{label, {1}, ""}}, 0, ""};
  std::smatch m;
  const std::string svg = bar_panels_svg({p}, 960);
  ASSERT_TRUE(std::regex_search(svg, m, std::regex("width=\"([0-9.]+)\" height")));
  EXPECT_GT(std::stod(m[1]), 200 * 6.6 + 420);
}

TEST(BarFigure, BadValuesAreErrorsNamingTheBar) {
  BarPanel wrong{"t", "s", {"a", "b"}, {{"bar1", {1}, ""}}, 0, ""};
  EXPECT_THROW(bar_panels_svg({wrong}), Error);
  BarPanel negative{"t", "s", {"a"}, {{"bar2", {-1}, ""}}, 0, ""};
  try {
    bar_panels_svg({negative});
    FAIL() << "accepted a negative value";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bar2"), std::string::npos) << e.what();
  }
  BarPanel nan{"t", "s", {"a"}, {{"bar3", {std::nan("")}, ""}}, 0, ""};
  EXPECT_THROW(bar_panels_svg({nan}), Error);
}

TEST(TimelineFigure, OneBoxPerSlotPlacedByTime) {
  TimelineChart c{"pp 2", "time", {"rank 0", "rank 1"},
                  {{{0, 1, "0", 0}, {3, 5, "0", 1}}, {{1, 2, "0", 0}, {2, 4, "0", 1}}}, {"forward", "backward"}};
  const std::string svg = timeline_svg(c, 1000);
  const auto fwd = widths_of(svg, palette(0)), bwd = widths_of(svg, palette(1));
  ASSERT_EQ(fwd.size(), 2u);
  ASSERT_EQ(bwd.size(), 2u);
  EXPECT_NEAR(bwd[0] / fwd[0], 2.0, 1e-3);  // a backward of 2 units against a forward of 1
  EXPECT_NE(svg.find(">rank 1<"), std::string::npos);
  EXPECT_NE(svg.find(">backward<"), std::string::npos);
}

TEST(TimelineFigure, InconsistentInputIsAnError) {
  TimelineChart lanes{"t", "x", {"a"}, {{}, {}}, {"f"}};
  EXPECT_THROW(timeline_svg(lanes), Error);
  TimelineChart backwards{"t", "x", {"a"}, {{{2, 1, "b", 0}}}, {"f"}};
  EXPECT_THROW(timeline_svg(backwards), Error);
  TimelineChart colour{"t", "x", {"a"}, {{{0, 1, "c", 3}}}, {"f"}};
  EXPECT_THROW(timeline_svg(colour), Error);
}

TEST(CompareRuns, LargestRelativeLossDifferenceOverCommonSteps) {
  TempDir dir;
  for (const char* run : {"a", "b", "c"}) std::filesystem::create_directories(dir / run);
  {
    MetricsWriter a(dir / "a/metrics.jsonl"), b(dir / "b/metrics.jsonl"), c(dir / "c/metrics.jsonl");
    for (int step = 1; step <= 4; ++step) {
      a.write({{"step", step}, {"loss", 8.0 - step}, {"tokens_per_s", 100.0}});
      b.write({{"step", step}, {"loss", (8.0 - step) * (step == 3 ? 1.001 : 1.0)}, {"tokens_per_s", 50.0}});
      if (step > 2) c.write({{"step", step}, {"loss", 8.0 - step}});
    }
    a.write({{"step", 4}, {"val_loss", 4.5}});
  }
  const RunComparison r = compare_runs({dir / "a", dir / "b", dir / "c"}, dir / "out/cmp.svg");
  ASSERT_EQ(r.max_rel_loss_diff.size(), 3u);
  EXPECT_EQ(r.max_rel_loss_diff[0], 0.0);
  EXPECT_NEAR(r.max_rel_loss_diff[1], 0.001, 1e-12);  // step 3: 5 * 1.001 against 5
  EXPECT_EQ(r.max_rel_loss_diff[2], 0.0);
  EXPECT_EQ(r.common_steps[1], 4);
  EXPECT_EQ(r.common_steps[2], 2);  // c starts at step 3
  EXPECT_NE(r.table.find("0.001 over 4 common steps"), std::string::npos) << r.table;
  std::ifstream svg(dir / "out/cmp.svg");  // the plot's directory is created
  EXPECT_TRUE(svg.good());
}

TEST(CompareRuns, ARunWithoutStepsIsNamed) {
  TempDir dir;
  std::filesystem::create_directories(dir / "empty");
  { MetricsWriter w(dir / "empty/metrics.jsonl"); w.write({{"step", 1}, {"val_loss", 3.0}}); }
  try {
    compare_runs({dir / "empty"}, dir / "cmp.svg");
    FAIL() << "accepted a run without step records";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("empty/metrics.jsonl has no training-step records"), std::string::npos)
        << e.what();
  }
}
