// Helper for tests/parallel/mpi/fault_test.sh (not a gtest): every rank loops over all-reduces
// on the world group with a watchdog running.
//   fault_probe kill  V   rank V kills itself with SIGKILL (as `kill -9` would) at iteration 20
//   fault_probe stall V   rank V sleeps 600 s before iteration 20; the others' watchdog (timeout
//                         2 s) reports "rank r waits in op k of group world" and ends the job
#include <mpi.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/check.hpp"
#include "parallel/comm.hpp"
#include "parallel/mpi_group.hpp"
#include "parallel/watchdog.hpp"

using namespace exatrain::parallel;

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  if (argc != 3) {
    std::fprintf(stderr, "usage: fault_probe kill|stall VICTIM_RANK\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  std::string mode = argv[1];
  int victim = std::atoi(argv[2]), rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  Watchdog watchdog(rank, mode == "stall" ? 2.0 : 60.0, /*abort_on_stall=*/true);
  MpiGroup world(MPI_COMM_WORLD, "world", nullptr, &watchdog);
  std::vector<float> buf(1024, 1.0f);
  for (int it = 0; it < 1000; it++) {
    if (rank == victim && it == 20) {
      if (mode == "kill") {
        std::fprintf(stderr, "fault_probe: rank %d kills itself (SIGKILL)\n", rank);
        std::fflush(stderr);
        EXA_SYSCHECK(::kill(::getpid(), SIGKILL) == 0, "kill");
      } else {
        std::fprintf(stderr, "fault_probe: rank %d stalls\n", rank);
        std::fflush(stderr);
        ::sleep(600);
      }
    }
    world.all_reduce_sum(buf.data(), static_cast<int64_t>(buf.size()));
    for (float& x : buf) x = 1.0f;
    ::usleep(5000);
  }
  MPI_Finalize();
  std::fprintf(stderr, "fault_probe: rank %d finished without noticing the fault\n", rank);
  return 1;
}
