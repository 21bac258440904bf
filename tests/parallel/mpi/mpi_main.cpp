// gtest main for tests under mpirun: every rank runs every test; the process exits non-zero if
// any rank failed (mpirun then reports failure), so ctest sees one verdict for the whole job.
#include <gtest/gtest.h>
#include <mpi.h>

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  // Only rank 0 prints progress; failures are printed by the rank that sees them.
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int failed = RUN_ALL_TESTS() != 0;
  int any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (failed) {
    for (const auto* suite = ::testing::UnitTest::GetInstance(); suite;) {
      std::fprintf(stderr, "rank %d: %d test(s) failed\n", rank, suite->failed_test_count());
      break;
    }
  }
  MPI_Finalize();
  return any_failed;
}
