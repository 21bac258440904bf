// Validation against published training runs (../shared/validation/published_runs.csv): predict
// every row that states enough, compare the step time, report errors per source and the rank
// correlation within groups of runs of one model on one GPU count.
#pragma once
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "job/job.hpp"
#include "plan/plan.hpp"
#include "plan/predict.hpp"

namespace exatrain::plan {

// One CSV row as text, by column name.
using CsvRow = std::map<std::string, std::string>;
// RFC-4180 CSV (quoted fields, doubled quotes, commas and newlines inside quotes).
std::vector<CsvRow> read_csv(const std::string& path);

// A row turned into planner inputs, or why it cannot be (a missing cell is never guessed).
struct RunCase {
  int row = 0;  // 1-based data row
  std::string source, model_name;
  ModelSpec model;
  MachineSpec machine;
  Plan plan;
  double measured_step_s = 0;
  std::string measured_basis;  // "step_time_s" | "hardware TFLOP/s" | "model TFLOP/s" | "MFU"
  std::string skip_reason;     // empty when usable
  std::string assumption;      // what was assumed where the row is silent (printed with --rows)
  // Memory validation points from the notes: peak memory per GPU (GiB; the BLOOM rows' nvidia-smi
  // "GB" read as GiB), or an out-of-memory failure. A row may carry only these.
  std::optional<double> measured_memory_gib;
  bool measured_oom = false;
  bool memory_only = false;  // no time measurement
};
RunCase case_from_row(const CsvRow& row, int index);

struct CaseResult {
  RunCase run;
  double predicted_step_s = 0;
  double error = 0;  // (predicted - measured) / measured
  // Predicted by the constants fitted WITHOUT this row's source (leave-one-source-out).
  double held_out_step_s = 0;
  double held_out_error = 0;
};

struct SourceStats {
  std::string source;
  int rows = 0;
  double mape_pct = 0, bias_pct = 0;                    // in-sample (the shipped constants)
  double held_out_mape_pct = 0, held_out_bias_pct = 0;  // fitted on the other sources
  std::string held_out_constants;                       // "a100.sustained=0.84 ..." of that fit
};
struct GroupRank { std::string group; int rows = 0; double rho = 0, held_out_rho = 0; };

struct MemoryResult {
  RunCase run;
  double predicted_gib = 0;  // the peak a monitor reports (Memory::peak), against the measured peak
  bool predicted_fits = true;
  // With the fragmentation fitted on the other sources' measured peaks (the GiB), and the
  // fragmentation_at_capacity fitted on their fit calls (fits).
  double held_out_gib = 0;
  bool held_out_fits = true;
  double held_out_needed_gib = 0;  // what the run needs with the held-out fragmentation_at_capacity
  double needed_gib = 0;   // what the run needs (Memory::total), which `predicted_fits` compares
  double counted_gib = 0;  // the most loaded rank's memory without the allocator's share
  double device_gib = 0;   // the device's memory
};
// Memory figures over the rows with a measured peak or an out-of-memory failure, and the calls on
// every other row with a measured step: those runs ran, so the right call is "fits".
struct MemoryStats {
  double mape_pct = 0;
  int points = 0, within_15 = 0;  // rows with a measured peak; of them predicted within 15%
  int oom_rows = 0, oom_predicted = 0;  // out-of-memory runs; of them predicted not to fit
  int fit_rows = 0, fit_predicted = 0;  // runs with a measured peak (they ran); of them predicted to fit
  int ran_rows = 0, ran_predicted = 0;  // runs with a step time only (they ran); of them predicted to fit
  // All the fit / does-not-fit calls: the right ones, and how many.
  int calls_right() const { return oom_predicted + fit_predicted + ran_predicted; }
  int calls() const { return oom_rows + fit_rows + ran_rows; }
};

struct ValidationReport {
  std::vector<CaseResult> results;
  // Every row with a memory figure (a measured peak or an out-of-memory failure) or a measured step.
  std::vector<MemoryResult> memory;
  MemoryStats memory_stats, memory_held_out;
  // "source: fragmentation=x fragmentation_at_capacity=y" (each fitted on the other sources)
  std::vector<std::string> memory_folds;
  std::vector<RunCase> skipped;
  std::vector<SourceStats> sources;
  std::vector<GroupRank> groups;
  double mape_pct = 0, held_out_mape_pct = 0;  // over all rows
  double worst_held_out_pct = 0;                // the worst source, held out
  double mean_rho = 0, held_out_rho = 0;
  std::vector<std::string> fitted;  // the constants refitted for each held-out source
  Calibration all_data_fit;         // the same fit on every source (what the catalog should hold)
  double all_data_fit_pct = 0;      // its objective (mean of the sources' MAPE)
  // The fits that stopped at fit_constants' sweep cap while still improving ("all sources", or the
  // held-out source's name): their constants are the best found, not a converged optimum.
  std::vector<std::string> unconverged;
};

// The constants `validate` fits (each fold of leave-one-source-out, and the all-data fit the
// catalog holds): one `sustained` per device family with rows, and the model's global fitted
// constants (docs/planner.md "Calibrated constants").
std::vector<std::string> validation_fit_constants(const std::vector<RunCase>& cases);

struct ValidateOptions {
  bool held_out = true;  // run leave-one-source-out (and the all-data fit)
};
ValidationReport validate_runs(const std::string& csv_path,
                               const Calibration& cal = default_calibration(),
                               const ValidateOptions& options = {});
std::string format_report(const ValidationReport& rep, bool per_row);
// format_report's per-row part (--rows): every row's prediction, the assumptions, the skipped rows
// with their reasons, the memory of every run with a memory figure or called too big, every
// group's ranking.
std::string format_rows(const ValidationReport& rep);
// The report of runs from sources no constant was fitted to (bench/validation/never_fitted_runs.csv),
// predicted with the constants as given (validate_runs with held_out = false): per source and over
// all rows, the ranking and the memory calls. Last line: `never_fitted_mape_pct=<x>
// never_fitted_worst_source_pct=<y> rows=<n>`.
std::string format_never_fitted(const ValidationReport& rep, const std::string& path);
// Every row as JSON: the inputs, measured and predicted (in-sample and held out) step, the
// breakdown; the skipped rows with their reasons; the summary figures.
nlohmann::json report_json(const ValidationReport& rep, const Calibration& cal);

// Spearman's rank correlation (average ranks for ties).
double spearman(const std::vector<double>& a, const std::vector<double>& b);

}  // namespace exatrain::plan
