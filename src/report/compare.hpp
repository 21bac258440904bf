// `exatrain report RUN_A RUN_B ... --out FILE.svg`: several runs side by side — their loss
// curves drawn over each other (distinct dashes, so identical curves stay visible) and their
// throughput, plus a table with each run's figures and how far its losses are from the first
// run's at the same steps (the figure that says "data parallelism did not change the loss").
#pragma once
#include <string>
#include <vector>

namespace exatrain::report {

struct RunComparison {
  std::string table;             // the text a person reads
  std::string svg_path;
  // Largest |loss_r(step) - loss_0(step)| / |loss_0(step)| over the common steps of run r and the
  // first run, per run (0 for the first); NaN for a run with no step in common with the first.
  std::vector<double> max_rel_loss_diff;
  std::vector<int64_t> common_steps;
};

// Reads RUN/metrics.jsonl of every run (an error names the run without step records) and writes
// the SVG atomically to svg_path.
RunComparison compare_runs(const std::vector<std::string>& run_dirs, const std::string& svg_path);

}  // namespace exatrain::report
