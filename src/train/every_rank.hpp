// Errors and verdicts of a multi-rank job, said once. A problem every rank detects alike (the job
// file and its --set values, the plan, a checkpoint rank 0 verified for all, a non-finite loss) is
// an EveryRankError: printed by rank 0 only, the other ranks exit with the same status silently.
// Any other error may be one rank's alone (e.g. its node lacks the data) and names the rank.
// A check of shared state (the run directory, a checkpoint's checksums) runs on rank 0 alone and
// its verdict is broadcast (on_rank0_for_all), so the ranks neither race nor repeat the work.
#pragma once
#include <functional>
#include <string>
#include <utility>

#include <mpi.h>

#include "core/check.hpp"
#include "parallel/watchdog.hpp"

namespace exatrain {

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

// {world rank, world size}: from MPI while it runs, else from the launcher's environment (the
// job file is read before MPI_Init); {0, 1} for a process started without a launcher.
std::pair<int, int> world_rank_size();

// The line the CLI prints on stderr for an error ("" = nothing). One process: "exatrain: error:
// WHAT". Several ranks (the launcher's environment says so, or MPI is running): an EveryRankError
// on rank 0 only, any other error on its rank as "exatrain: error: rank R of N: WHAT".
std::string error_line(const Error& e);

// After error_line was printed: an EveryRankError under a running MPI ends MPI on every rank
// (MPI_Finalize synchronises them), so that no silent rank exits before rank 0 has printed the
// message: mpirun aborts the job at the first non-zero exit and would kill rank 0 mid-way.
// Nothing for other errors (a rank's own: the others may be inside a collective).
void leave_together(const Error& e);

// Rank 0's string on every rank (a path, an error message); the watchdog `wd` (may be null)
// reports a rank that never arrives.
void broadcast_from_rank0(std::string& s, MPI_Comm world, parallel::Watchdog* wd, const char* what);

// Collective: rank 0 runs check(); the error it throws, if any, is thrown on every rank as an
// EveryRankError with rank 0's message.
void on_rank0_for_all(MPI_Comm world, parallel::Watchdog* wd, const char* what, const std::function<void()>& check);

// Collective: every rank runs work(); if it throws on any rank, every rank throws an
// EveryRankError with the message of the lowest such rank ("rank R: WHAT" when several ranks
// run), so no rank waits forever for one that failed (a full disk during a checkpoint write).
void on_all_ranks_or_none(MPI_Comm world, parallel::Watchdog* wd, const char* what, const std::function<void()>& work);

}  // namespace exatrain
