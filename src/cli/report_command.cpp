// `exatrain report RUN_DIR`: the loss/throughput plot (SVG) and a one-screen summary.
#include <fmt/format.h>

#include "cli/commands.hpp"
#include "report/report.hpp"

namespace exatrain::cli {
void add_report_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("report", "draw RUN_DIR/report.svg and print a summary of a run");
  auto dir = std::make_shared<std::string>();
  cmd->add_option("run_dir", *dir, "the run directory (holds metrics.jsonl)")->required();
  cmd->callback([dir] {
    auto s = report::write_report(*dir);
    fmt::print("{}", report::format_summary(s, *dir));
  });
}
}  // namespace exatrain::cli
