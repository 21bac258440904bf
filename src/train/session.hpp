// `exatrain train`: one job file -> a training run in RUN_DIR (metrics.jsonl, checkpoints/,
// report.svg). Validates the whole job up front, resumes from a checkpoint when asked, trains
// with periodic validation and atomic checkpoints, and handles non-finite losses by policy.
#pragma once
#include <cstdio>
#include <string>
#include <vector>

#include "job/job.hpp"

namespace exatrain {

struct TrainRunOptions {
  std::string resume;    // "" | "none": fresh; "auto": newest valid checkpoint; else a checkpoint dir
  int interactive = -1;  // progress bar: 1 yes, 0 plain lines, -1 when stdout is a terminal
  std::FILE* out = stdout;
  int64_t stop_after_steps = -1;  // stop early (still checkpointing) after this many steps of this run
  int64_t inject_nan_at_step = -1;  // test hook: the loss of this step reads as NaN
  std::string trace;     // multi-rank runs: Chrome/Perfetto trace of the first 3 steps to this file
};

struct TrainRunResult {
  int64_t first_step = 0;    // the optimizer step the run started from (0, or the checkpoint's)
  int64_t final_step = 0;
  double last_loss = 0;
  double last_val_loss = 0;  // NaN when no evaluation ran
  int64_t skipped_steps = 0; // non-finite steps skipped (nan_policy = "skip")
  std::string run_dir, last_checkpoint, dataset_dir;
};

TrainRunResult run_training(const Job& job, const TrainRunOptions& options);

// What the single-rank CPU trainer needs of a job beyond the file's own rules (one rank, fp32,
// batch arithmetic, steps), one line per problem. `train` passes it to load_job so that these
// are reported together with the file's problems.
void check_single_rank_job(const Job& job, std::vector<std::string>& errors);

// The dataset directory a job trains on: train.data, or the bundled corpus prepared once into a
// cache directory ($EXATRAIN_CACHE, default <repo>/data-cache) — prepared on first use.
std::string resolve_dataset(const Job& job, std::FILE* log);

}  // namespace exatrain
