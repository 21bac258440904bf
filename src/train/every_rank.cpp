#include "train/every_rank.hpp"

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <utility>

#include <fmt/format.h>

#include "parallel/mesh.hpp"

namespace exatrain {
namespace {

int env_int(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : 0;
}

// Op indices of these broadcasts for the watchdog's reports; every rank makes them in the same order.
int64_t g_ops = 0;

}  // namespace

std::pair<int, int> world_rank_size() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (init && !fin) {
    int rank = 0, size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    return {rank, size};
  }
  // Open MPI's mpirun, PMIx (srun --mpi=pmix, prterun) and PMI-2 launchers.
  const int size = std::max({env_int("OMPI_COMM_WORLD_SIZE"), env_int("PMIX_SIZE"), env_int("PMI_SIZE")});
  const int rank = std::max({env_int("OMPI_COMM_WORLD_RANK"), env_int("PMIX_RANK"), env_int("PMI_RANK")});
  return {rank, std::max(size, 1)};
}

std::string error_line(const Error& e) {
  const auto [rank, size] = world_rank_size();
  if (size <= 1) return fmt::format("exatrain: error: {}", e.what());
  if (dynamic_cast<const EveryRankError*>(&e)) return rank == 0 ? fmt::format("exatrain: error: {}", e.what()) : "";
  return fmt::format("exatrain: error: rank {} of {}: {}", rank, size, e.what());
}

void leave_together(const Error& e) {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (init && !fin && dynamic_cast<const EveryRankError*>(&e)) MPI_Finalize();
}

void broadcast_from_rank0(std::string& s, MPI_Comm world, parallel::Watchdog* wd, const char* what) {
  parallel::WatchdogScope watch(wd, "world", ++g_ops, what);
  int64_t n = int64_t(s.size());
  parallel::mpi_check(MPI_Bcast(&n, 1, MPI_INT64_T, 0, world), what);
  EXA_CHECK(n < INT_MAX, "{}: a string of {} bytes, over MPI's int counts", what, n);
  s.resize(size_t(n));
  parallel::mpi_check(MPI_Bcast(s.data(), int(n), MPI_CHAR, 0, world), what);
}

void on_rank0_for_all(MPI_Comm world, parallel::Watchdog* wd, const char* what, const std::function<void()>& check) {
  int rank = 0;
  MPI_Comm_rank(world, &rank);
  std::string error;
  if (rank == 0) try {
      check();
    } catch (const Error& e) {
      error = e.what();
    }
  broadcast_from_rank0(error, world, wd, what);
  if (!error.empty()) throw EveryRankError(error);
}

void on_all_ranks_or_none(MPI_Comm world, parallel::Watchdog* wd, const char* what, const std::function<void()>& work) {
  int rank = 0, size = 1;
  MPI_Comm_rank(world, &rank);
  MPI_Comm_size(world, &size);
  std::string error;
  try {
    work();
  } catch (const Error& e) {
    error = e.what();
  }
  int mine = error.empty() ? INT_MAX : rank, first = INT_MAX;
  {
    parallel::WatchdogScope watch(wd, "world", ++g_ops, what);
    parallel::mpi_check(MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, world), what);
  }
  if (first == INT_MAX) return;
  if (size > 1 && rank == first) error = fmt::format("rank {}: {}", rank, error);
  parallel::WatchdogScope watch(wd, "world", ++g_ops, what);
  int64_t n = int64_t(error.size());
  parallel::mpi_check(MPI_Bcast(&n, 1, MPI_INT64_T, first, world), what);
  error.resize(size_t(n));
  parallel::mpi_check(MPI_Bcast(error.data(), int(n), MPI_CHAR, first, world), what);
  throw EveryRankError(error);
}

}  // namespace exatrain
