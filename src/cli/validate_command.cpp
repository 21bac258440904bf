// `exatrain validate [CSV] [--rows] [--json]`: predict every usable row of a published-runs file
// and report the step-time error per source, in-sample (the shipped constants) and held out (the
// constants refitted without that source: leave-one-source-out), the ranking within groups and
// the memory figures; its last line: `held_out_mape_pct=<x> worst_source_pct=<y> in_sample_mape_pct=<z>
// rows=<n>`. Then, with the default CSV (or --never-fitted FILE), the runs of sources no constant was
// fitted to, predicted with the same constants: last line `never_fitted_mape_pct=<x> ...`.
#include <filesystem>
#include <optional>

#include <fmt/format.h>

#include "cli/commands.hpp"
#include "plan/calibrate.hpp"
#include "plan/validate.hpp"

namespace exatrain::cli {
void add_validate_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("validate", "compare the planner with published training runs (held out by source)");
  // Default: the vendored copy of the shared published-runs file (bench/validation/README.md).
  auto path = std::make_shared<std::string>(std::string(EXATRAIN_SOURCE_DIR) +
                                            "/bench/validation/published_runs.csv");
  auto never_fitted = std::make_shared<std::string>();
  auto rows = std::make_shared<bool>(false);
  auto json = std::make_shared<bool>(false);
  auto in_sample = std::make_shared<bool>(false);
  cmd->add_option("csv", *path, "published runs (CSV; default bench/validation/published_runs.csv)");
  cmd->add_flag("--rows", *rows, "print every row's prediction, the skipped rows, every group's ranking and the memory (peak, need) of every run with a memory figure or called too big");
  cmd->add_flag("--json", *json, "print every row (inputs, measured, predicted, breakdown) and the figures as JSON");
  cmd->add_flag("--in-sample", *in_sample, "skip leave-one-source-out (no refits): the shipped constants only");
  cmd->add_option("--never-fitted", *never_fitted,
                  "runs from sources no constant was fitted to, predicted with the same constants (default: "
                  "bench/validation/never_fitted_runs.csv when the csv is the default; 'none': skip)");
  auto cal = std::make_shared<std::vector<std::string>>();
  cmd->add_option("--cal", *cal, "override a calibration constant, name=value (e.g. hopper.sustained=0.8)");
  auto calibration = std::make_shared<std::string>();
  cmd->add_option("--calibration", *calibration, "start from this calibration file (exatrain calibrate): in-sample "
                                                 "predictions use it, each held-out fit starts from it");
  cmd->callback([path, rows, json, in_sample, cal, calibration, never_fitted, default_path = *path] {
    plan::Calibration c = calibration->empty() ? plan::default_calibration() : plan::load_calibration(*calibration);
    for (const auto& a : *cal) c.set(a);
    const plan::ValidationReport rep = plan::validate_runs(*path, c, {.held_out = !*in_sample});
    std::string unseen = *never_fitted, shown = *never_fitted;  // shown: the path the report names
    std::error_code ec;  // the default CSV however it is named (`make validate` names it relative to the source)
    if (unseen.empty() && std::filesystem::equivalent(*path, default_path, ec)) {
      unseen = std::string(EXATRAIN_SOURCE_DIR) + "/bench/validation/never_fitted_runs.csv";
      shown = "bench/validation/never_fitted_runs.csv";
    }
    if (unseen == "none") unseen.clear();
    std::optional<plan::ValidationReport> nf;
    if (!unseen.empty()) nf = plan::validate_runs(unseen, c, {.held_out = false});
    if (*json) {
      nlohmann::json j = plan::report_json(rep, c);
      if (nf) j["never_fitted"] = {{"path", shown}, {"report", plan::report_json(*nf, c)}};
      fmt::print("{}\n", j.dump(1));
      return;
    }
    fmt::print("{}", plan::format_report(rep, *rows));
    if (nf) fmt::print("{}{}", *rows ? plan::format_rows(*nf) : std::string(), plan::format_never_fitted(*nf, shown));
  });
}
}  // namespace exatrain::cli
