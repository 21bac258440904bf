// `exatrain calibrate INPUT... --out FILE [--fit sustained,attention,network,bw_efficiency] [--prior off|LIST]`:
// fits the machine's few constants (plan/calibrate.hpp, with its prior) to measured steps: exatrain run directories
// (metrics.jsonl + job.toml) or CSV files in the format of bench/validation/published_runs.csv.
// Prints every run's measured and predicted step (shipped constants, fitted, left out) and writes
// the calibration file that predict, plan and validate take with --calibration FILE.
#include <filesystem>

#include <fmt/format.h>

#include "cli/commands.hpp"
#include "core/check.hpp"
#include "core/fileio.hpp"
#include "plan/calibrate.hpp"
#include "report/report.hpp"

namespace exatrain::cli {
namespace {
std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size() && !s.empty()) {
    const size_t comma = s.find(',', start);
    out.push_back(s.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}
}  // namespace

void add_calibrate_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("calibrate", "fit this machine's constants to measured steps (run directories or a "
                                              "published-runs CSV)");
  auto inputs = std::make_shared<std::vector<std::string>>();
  auto out = std::make_shared<std::string>();
  auto fit = std::make_shared<std::string>();
  auto base = std::make_shared<std::string>();
  cmd->add_option("inputs", *inputs, "run directories (metrics.jsonl + job.toml) or CSV files of measured runs")
      ->required();
  cmd->add_option("--out", *out, "the calibration file to write (TOML)")->required();
  cmd->add_option("--fit", *fit, "constants to fit, comma-separated: sustained, attention, network, bw_efficiency "
                                 "(default: sustained; attention where the runs determine it and its share of their steps "
                                 "differs by 10 points or more; network and bw_efficiency while one lowers the "
                                 "leave-one-out MAPE by 0.1 point or more)");
  cmd->add_option("--calibration", *base, "start from this calibration file instead of the shipped constants");
  auto prior_text = std::make_shared<std::string>("");
  cmd->add_option("--prior", *prior_text, "the fit's prior around the starting constants: 'off', or NAME=SD,... (the "
                                          "width of a constant's prior, log units) and noise=F (docs/planner.md; "
                                          "default: sustained=0.06 on A100 and Hopper devices, every other width 1.0; "
                                          "noise=0.037)");
  auto cal = std::make_shared<std::vector<std::string>>();
  cmd->add_option("--cal", *cal, "override a constant before fitting, name=value (as validate --cal)");
  cmd->callback([inputs, out, fit, base, cal, prior_text] {
    const plan::CalibrationPrior prior = plan::parse_prior(*prior_text);
    std::vector<plan::MeasuredRun> runs;
    std::vector<std::string> skipped;
    for (const std::string& in : *inputs) {
      if (std::filesystem::is_directory(in)) runs.push_back(report::measured_run(in));
      else if (std::filesystem::is_regular_file(in)) {
        for (auto& r : plan::measured_runs_from_csv(in, skipped)) runs.push_back(std::move(r));
      } else {
        throw Error(fmt::format("{}: neither a run directory (metrics.jsonl + job.toml) nor a CSV file", in));
      }
    }
    for (const auto& s : skipped) fmt::print("skipped {}\n", s);
    if (runs.empty()) throw Error("no usable measured runs in the inputs (see the skipped lines above)");
    plan::Calibration start = base->empty() ? plan::default_calibration() : plan::load_calibration(*base);
    for (const auto& a : *cal) start.set(a);
    const plan::CalibrateResult r = plan::calibrate(runs, start, split_list(*fit), prior);
    fmt::print("{:<48} {:>10} {:>10} {:>10} {:>10}\n", "run", "measured", "shipped", "fitted", "left out");
    for (size_t i = 0; i < runs.size(); ++i)
      fmt::print("{:<48.48} {:>10.4g} {:>10.4g} {:>10.4g} {:>10}\n", runs[i].label, runs[i].step_s, r.before[i], r.fitted[i],
                 r.left_out.empty() ? "-" : fmt::format("{:.4g}", r.left_out[i]));
    for (const std::string& c : r.constants)
      fmt::print("{} = {:.4g} (shipped {:.4g})\n", c, r.cal.get(c), start.get(c));
    if (!r.choice.empty()) fmt::print("note: {}\n", r.choice);
    fmt::print("prior: {}\n", r.prior);
    if (!r.at_bound.empty()) fmt::print("warning: {}\n", r.at_bound);
    if (!r.converged)
      fmt::print("warning: the fit stopped at its sweep cap while still improving: the constants above are its best "
                 "so far, not a converged optimum (fewer constants, e.g. --fit sustained, or more varied runs help)\n");
    fmt::print("MAPE over {} run{}: shipped {:.2f}%, fitted {:.2f}%, leave-one-out {}\n", runs.size(),
               runs.size() == 1 ? "" : "s", r.before_mape_pct,
               r.fit_mape_pct, r.loo_mape_pct < 0 ? "- (one run)" : fmt::format("{:.2f}%", r.loo_mape_pct));
    write_file_atomic(*out, plan::calibration_toml(r, runs));
    fmt::print("wrote {}\n", *out);
  });
}
}  // namespace exatrain::cli
