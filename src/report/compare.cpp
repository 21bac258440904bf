#include "report/compare.hpp"

#include <cmath>
#include <filesystem>
#include <limits>
#include <map>

#include <fmt/format.h>

#include "core/check.hpp"
#include "core/fileio.hpp"
#include "report/figures.hpp"
#include "report/metrics.hpp"
#include "report/report.hpp"
#include "report/svg_chart.hpp"

namespace exatrain::report {
namespace {
struct RunCurves {
  std::map<int64_t, double> loss, val_loss, tokens_per_s;
};
RunCurves curves_of(const std::vector<nlohmann::json>& records) {
  RunCurves c;
  for (const auto& r : records) {
    if (!r.contains("step")) continue;
    const int64_t step = r["step"].get<int64_t>();
    if (r.contains("loss")) c.loss[step] = r["loss"].get<double>();
    if (r.contains("val_loss")) c.val_loss[step] = r["val_loss"].get<double>();
    if (r.contains("tokens_per_s")) c.tokens_per_s[step] = r["tokens_per_s"].get<double>();
  }
  return c;
}
// Largest relative difference of b's losses from a's over their common steps; NaN if none.
double max_rel_diff(const std::map<int64_t, double>& a, const std::map<int64_t, double>& b, int64_t& common) {
  double worst = 0;
  common = 0;
  for (const auto& [step, la] : a) {
    auto it = b.find(step);
    if (it == b.end()) continue;
    ++common;
    const double d = std::fabs(it->second - la) / std::max(std::fabs(la), 1e-30);
    worst = std::isfinite(d) ? std::max(worst, d) : std::numeric_limits<double>::infinity();
  }
  return common ? worst : std::numeric_limits<double>::quiet_NaN();
}
Series series_of(const std::map<int64_t, double>& points, const std::string& name, int i, bool markers) {
  static const char* kDashes[] = {"", "7 4", "2 3", "10 3 2 3", "4 2 4 6"};
  Series s{name, palette(i), {}, {}, markers, kDashes[i % 5]};
  for (const auto& [step, v] : points) s.xs.push_back(double(step)), s.ys.push_back(v);
  return s;
}
}  // namespace

RunComparison compare_runs(const std::vector<std::string>& run_dirs, const std::string& svg_path) {
  EXA_CHECK(!run_dirs.empty(), "report: expected at least one run directory");
  RunComparison out;
  out.svg_path = svg_path;
  std::vector<RunCurves> runs;
  Chart loss{"Training loss", "step", "cross-entropy (nats)", {}, false};
  Chart val{"Validation loss", "step", "cross-entropy (nats)", {}, false};
  Chart tps{"Throughput", "step", "tokens per second", {}, false};
  out.table = fmt::format("{:<28} {:>6} {:>10} {:>10} {:>14} {:>10}  {}\n", "run", "steps", "first loss",
                          "last loss", "best val loss", "tokens/s", "max rel. loss diff. from the first run");
  for (size_t i = 0; i < run_dirs.size(); ++i) {
    const std::string& dir = run_dirs[i];
    const std::vector<nlohmann::json> records = read_metrics(dir + "/metrics.jsonl");
    const RunSummary s = summarize(records);
    EXA_CHECK(s.steps > 0, "{}/metrics.jsonl has no training-step records (expected lines with \"step\" and "
                           "\"loss\")", dir);
    runs.push_back(curves_of(records));
    int64_t common = 0;
    const double diff = i == 0 ? 0.0 : max_rel_diff(runs.front().loss, runs.back().loss, common);
    out.max_rel_loss_diff.push_back(diff);
    out.common_steps.push_back(i == 0 ? int64_t(runs.front().loss.size()) : common);
    loss.series.push_back(series_of(runs.back().loss, dir, int(i), false));
    if (!runs.back().val_loss.empty()) val.series.push_back(series_of(runs.back().val_loss, dir, int(i), true));
    tps.series.push_back(series_of(runs.back().tokens_per_s, dir, int(i), false));
    const std::string best = std::isfinite(s.best_val_loss) ? fmt::format("{:.4f}", s.best_val_loss) : "-";
    const std::string d = i == 0 ? "(reference)"
                          : std::isnan(diff) ? "no common steps"
                                             : fmt::format("{:.2g} over {} common steps", diff, common);
    out.table += fmt::format("{:<28} {:>6} {:>10.4f} {:>10.4f} {:>14} {:>10.0f}  {}\n", dir, s.steps, s.first_loss,
                             s.last_loss, best, s.median_tokens_per_s, d);
  }
  std::vector<Chart> charts{loss};
  if (!val.series.empty()) charts.push_back(val);
  charts.push_back(tps);
  const std::filesystem::path dir = std::filesystem::path(svg_path).parent_path();
  std::error_code ec;
  if (!dir.empty()) std::filesystem::create_directories(dir, ec);  // a failure shows in the write
  write_file_atomic(svg_path, svg_document(charts, 980));
  out.table += fmt::format("plot: {}\n", svg_path);
  return out;
}

}  // namespace exatrain::report
