// `exatrain train`: one job file -> a training run in RUN_DIR (metrics.jsonl, checkpoints/,
// report.svg), on 1..N MPI ranks alike (mpirun -np N, srun, or none: one rank). THE training loop:
// resolves the job once into its plan (plan/resolve.hpp), builds the runtime, the data loader and
// the Trainer, resumes from a checkpoint when asked, then per step: the NaN policy, metrics
// (rank 0: every rank's time breakdown under the planner's names), progress, periodic validation
// and atomic checkpoints (train/checkpoint_io.hpp, every rank its own slices).
//
// Owns (room train/): the run (this loop), the Trainer (trainer.hpp), the training checkpoint's
// tensors (checkpoint_io.hpp) and small files (state_io.hpp), multi-rank errors (every_rank.hpp),
// `sample`, the sgemm peak. May use: core/, job/, catalog/, plan/, backend/, model/, optim/,
// parallel/, data/, checkpoint/, report/ (every room but cli/), and MPI.
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
  std::string trace;     // Chrome/Perfetto trace of the first 3 steps of every rank to this file
};

struct TrainRunResult {
  int64_t first_step = 0;    // the optimizer step the run started from (0, or the checkpoint's)
  int64_t final_step = 0;
  double last_loss = 0;
  double last_val_loss = 0;  // NaN when no evaluation ran
  int64_t skipped_steps = 0; // non-finite steps skipped (nan_policy = "skip")
  // fp16 loss scaling: overflowing steps skipped in the whole run (a resumed run's count includes
  // the checkpoint's) and the loss scale the next step would use; 0 without loss scaling.
  int64_t overflow_skipped_steps = 0;
  double loss_scale = 0;
  std::string run_dir, last_checkpoint, dataset_dir;
};

// Initialises MPI (MPI_THREAD_FUNNELED) when it is not yet, and runs the job. On ranks other than
// 0 the result's run_dir is empty (nothing to report there). Call finalize_mpi() before exiting.
TrainRunResult run_training(const Job& job, const TrainRunOptions& options);
// MPI_Init_thread (FUNNELED, checked) unless MPI runs already; returns {world size, rank}.
std::pair<int, int> init_mpi();
void finalize_mpi();

// What `train` needs of a job beyond the file's own rules, on the ranks this process was started
// with (plan::training_job_problems), one line per problem: `train` passes it to load_job so that
// these are reported together with the file's problems.
void check_training_job(const Job& job, std::vector<std::string>& errors);

// The bundled corpus (corpus/README.md) is prepared with this vocabulary for the jobs that name no
// [train] data (the default job's).
inline constexpr uint32_t kBundledVocab = 4096;

// The dataset directory a job trains on: train.data, or the bundled corpus prepared once into a
// cache directory ($EXATRAIN_CACHE, default <repo>/data-cache) — prepared on first use.
std::string resolve_dataset(const Job& job, std::FILE* log);

}  // namespace exatrain
