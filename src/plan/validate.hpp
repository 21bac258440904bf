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
};

struct SourceStats { std::string source; int rows = 0; double mape_pct = 0, bias_pct = 0; };
struct GroupRank { std::string group; int rows = 0; double rho = 0; };

struct MemoryResult {
  RunCase run;
  double predicted_gib = 0;
  bool predicted_fits = true;
};

struct ValidationReport {
  std::vector<CaseResult> results;
  std::vector<MemoryResult> memory;
  double memory_mape_pct = 0;
  int oom_rows = 0, oom_predicted = 0;
  std::vector<RunCase> skipped;
  std::vector<SourceStats> sources;
  std::vector<GroupRank> groups;
  double mape_pct = 0;
  double mean_rho = 0;
};

ValidationReport validate_runs(const std::string& csv_path,
                               const Calibration& cal = default_calibration());
std::string format_report(const ValidationReport& rep, bool per_row);

// Spearman's rank correlation (average ranks for ties).
double spearman(const std::vector<double>& a, const std::vector<double>& b);

}  // namespace exatrain::plan
