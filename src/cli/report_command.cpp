// `exatrain report RUN_DIR [--calibration FILE]`: the loss/throughput plot (SVG) and a one-screen summary,
// with the measured step next to the planner's (calibrated) prediction.
// `exatrain report RUN_A RUN_B ... --out FILE.svg`: the runs compared (report/compare.hpp).
#include <fmt/format.h>

#include "cli/commands.hpp"
#include "core/check.hpp"
#include "report/compare.hpp"
#include "report/report.hpp"

namespace exatrain::cli {
void add_report_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("report", "draw RUN_DIR/report.svg and print a summary of a run; with several "
                                           "runs, compare them (--out FILE.svg)");
  auto dirs = std::make_shared<std::vector<std::string>>();
  auto out = std::make_shared<std::string>();
  cmd->add_option("run_dir", *dirs, "the run directory (holds metrics.jsonl); several: compare them")->required();
  cmd->add_option("--out", *out, "with several runs: where to write the comparison plot (SVG)");
  auto calibration = std::make_shared<std::string>();
  cmd->add_option("--calibration", *calibration, "one run: predict its step with this calibration file of `exatrain "
                                                 "calibrate` (this machine's constants)");
  cmd->callback([dirs, out, calibration] {
    EXA_CHECK(calibration->empty() || (dirs->size() == 1 && out->empty()),
              "report: --calibration {} with {} run director{}{}: the calibration is for one run's measured-vs-predicted "
              "table (report RUN_DIR --calibration FILE); a comparison (--out) has no prediction", *calibration,
              dirs->size(), dirs->size() == 1 ? "y" : "ies", out->empty() ? "" : " and --out " + *out);
    if (dirs->size() == 1 && out->empty()) {
      auto s = report::write_report(dirs->front(), *calibration);
      fmt::print("{}", report::format_summary(s, dirs->front()));
      return;
    }
    EXA_CHECK(!out->empty(), "report: {} run directories given: name the comparison plot with --out FILE.svg",
              dirs->size());
    fmt::print("{}", report::compare_runs(*dirs, *out).table);
  });
}
}  // namespace exatrain::cli
