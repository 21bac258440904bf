// `exatrain report RUN_DIR`: reads RUN_DIR/metrics.jsonl, draws RUN_DIR/report.svg (loss and
// validation loss, throughput and MFU against the step) and returns a one-screen summary.
//
// Owns (room report/): metrics.jsonl (metrics.hpp), the progress display (progress.hpp), the SVG
// charts and this report with measured time next to the planner's prediction.
// May use: core/, job/, plan/.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "plan/fit.hpp"

namespace exatrain::report {

struct RunSummary {
  int64_t steps = 0;             // training-step records
  double first_loss = 0, last_loss = 0;
  double best_val_loss = 0;      // NaN when there were no evaluations
  int64_t best_val_step = -1;
  double median_tokens_per_s = 0, median_mfu = 0;
  // fp16 loss scaling (records with "skipped_steps"): the run's skipped steps and the loss scale of
  // its first and last record; skipped_steps -1 when the run had no loss scaling.
  int64_t skipped_steps = -1;
  double first_loss_scale = 0, last_loss_scale = 0;
  std::string svg_path;
  std::string comparison;  // measured_vs_predicted(), filled by write_report
};

RunSummary summarize(const std::vector<nlohmann::json>& records);

// Writes the SVG next to the metrics and returns the summary (svg_path set). `calibration`: a
// calibration file of `exatrain calibrate` for the prediction (measured_vs_predicted); "" the shipped
// constants.
RunSummary write_report(const std::string& run_dir, const std::string& calibration = "");

// Measured time per step next to the planner's prediction for the run's own job (RUN_DIR/job.toml
// on its [machine]): medians over the steps after the first, per part of the planner's
// breakdown_s (distributed runs record every rank's; the slowest rank's is shown). Returns a
// text table; a job the planner cannot predict says why instead. With `calibration` (a file of
// `exatrain calibrate`) the prediction uses its constants, as `predict --calibration` does; Error
// (from plan/calibrate.hpp) when the file cannot be read or calibrates another device than the job's.
std::string measured_vs_predicted(const std::vector<nlohmann::json>& records, const std::string& run_dir,
                                  const std::string& calibration = "");

// The run as a measured step for `exatrain calibrate` (plan/fit.hpp): its job.toml resolved as the
// trainer ran it and the median seconds per step after the first. Error naming the file when the
// run has no timed step or its job cannot be planned.
plan::MeasuredRun measured_run(const std::string& run_dir);

// The one-screen text a person reads after a run.
std::string format_summary(const RunSummary& s, const std::string& run_dir);

}  // namespace exatrain::report
