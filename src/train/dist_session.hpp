// `exatrain train` on several MPI ranks (mpirun -np N exatrain train job.toml, or srun): the
// distributed trainer (parallel/distributed_trainer.hpp) driven by the job's [parallel] section.
// Rank 0 prepares the dataset, writes metrics.jsonl (with every rank's time breakdown under the
// planner's breakdown_s names) and the progress lines; every rank reads its replica's data.
#pragma once
#include "job/job.hpp"
#include "train/session.hpp"

namespace exatrain {

// True when the run needs the distributed trainer: launched on several MPI ranks (Open MPI,
// PMI/Slurm environment), or [parallel] gpus or a degree above 1.
bool wants_distributed(const Job& job);

// Initialises MPI (MPI_THREAD_FUNNELED) when needed and runs the job. On ranks other than 0 the
// result's run_dir is empty (nothing to report there). Call finalize_mpi() before exiting.
TrainRunResult run_distributed_training(const Job& job, const TrainRunOptions& options);
void finalize_mpi();

}  // namespace exatrain
