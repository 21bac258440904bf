// `exatrain train` on several MPI ranks (mpirun -np N exatrain train job.toml, or srun): the
// distributed trainer (parallel/distributed_trainer.hpp) driven by the job's [parallel] section.
// Rank 0 prepares the dataset, writes metrics.jsonl (with every rank's time breakdown under the
// planner's breakdown_s names) and the progress lines; every rank reads its replica's data.
#pragma once
#include <string>

#include "core/check.hpp"
#include "job/job.hpp"
#include "train/session.hpp"

namespace exatrain {

// An error that every rank of a job detects alike (the job file and its --set values, the plan,
// a checkpoint that rank 0 verified for all, a non-finite loss): error_line() prints it once, from
// rank 0, and the other ranks exit with the same status silently.
struct EveryRankError : Error {
  using Error::Error;
};

// Runs f(); an exatrain::Error it throws becomes an EveryRankError.
template <class F>
auto on_every_rank(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const EveryRankError&) {
    throw;
  } catch (const Error& e) {
    throw EveryRankError(e.what());
  }
}

// The line the CLI prints on stderr for an error ("" = nothing). One process: "exatrain: error:
// WHAT". Several ranks (the launcher's environment says so, or MPI is running): an EveryRankError
// on rank 0 only; any other error, which this rank alone may have hit (e.g. a data shard missing
// on its node), everywhere and naming the rank: "exatrain: error: rank R of N: WHAT".
std::string error_line(const Error& e);

// True when the run needs the distributed trainer: launched on several MPI ranks (Open MPI,
// PMI/Slurm environment), or [parallel] gpus or a degree above 1.
bool wants_distributed(const Job& job);

// Initialises MPI (MPI_THREAD_FUNNELED) when needed and runs the job. On ranks other than 0 the
// result's run_dir is empty (nothing to report there). Call finalize_mpi() before exiting.
TrainRunResult run_distributed_training(const Job& job, const TrainRunOptions& options);
void finalize_mpi();

}  // namespace exatrain
