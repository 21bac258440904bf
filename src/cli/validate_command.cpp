// `exatrain validate [CSV] [--rows]`: predict every usable row of a published-runs file and report
// the step-time error per source, overall, and the ranking within groups. Last line:
// `mape_pct=<x> rows=<n>`.
#include <fmt/format.h>

#include "cli/commands.hpp"
#include "plan/validate.hpp"

namespace exatrain::cli {
void add_validate_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("validate", "compare the planner with published training runs");
  // Default: the vendored copy of the shared published-runs file (bench/validation/README.md).
  auto path = std::make_shared<std::string>(std::string(EXATRAIN_SOURCE_DIR) +
                                            "/bench/validation/published_runs.csv");
  auto rows = std::make_shared<bool>(false);
  cmd->add_option("csv", *path, "published runs (CSV; default bench/validation/published_runs.csv)");
  cmd->add_flag("--rows", *rows, "print every row's prediction and the skipped rows");
  auto cal = std::make_shared<std::vector<std::string>>();
  cmd->add_option("--cal", *cal, "override a calibration constant, name=value (for fitting)");
  cmd->callback([path, rows, cal] {
    plan::Calibration c = plan::default_calibration();
    for (const auto& a : *cal) c.set(a);
    fmt::print("{}", plan::format_report(plan::validate_runs(*path, c), *rows));
  });
}
}  // namespace exatrain::cli
