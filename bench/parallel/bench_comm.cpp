// Bandwidth of each collective the runtime uses, through exatrain's Group (so the wrapper's
// overhead is included), on MPI_COMM_WORLD: all-reduce, reduce-scatter, all-gather and a
// point-to-point ping-pong, for message sizes from 4 KiB to --max-mib MiB. Prints, per size, the
// median time over --reps repetitions and two bandwidths in NCCL-tests' convention:
//   algbw = full buffer bytes / time
//   busbw = bytes each rank sends by the ring convention (the ledger's count) / time
// busbw is what the planner's intra_node_bw_gbs / inter_node_bw_gbs (one direction, per device)
// should be compared with for the `local` machine.
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "parallel/comm.hpp"
#include "parallel/mpi_group.hpp"

using namespace exatrain::parallel;

static double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int max_mib = 16, reps = 10;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--max-mib")) max_mib = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
  }
  CommLedger ledger;
  MpiGroup g(MPI_COMM_WORLD, "dp", &ledger, nullptr);
  int p = g.size(), me = g.rank();
  if (me == 0)
    std::printf("# %d ranks, median of %d reps\n%-15s %12s %12s %10s %10s\n", p, reps, "op",
                "bytes", "time_us", "algbw_GB/s", "busbw_GB/s");
  const char* ops[] = {"all_reduce", "reduce_scatter", "all_gather", "send_recv"};
  for (const char* op : ops) {
    for (int64_t bytes = 4096; bytes <= int64_t(max_mib) << 20; bytes *= 4) {
      int64_t n = bytes / 4;  // floats in the full buffer
      n -= n % p;             // equal shards
      std::vector<float> a(n, 1.0f), b(n, 0.0f);
      std::vector<double> t;
      int64_t sent = 0;
      for (int r = 0; r < reps + 1; r++) {  // first repetition warms up
        ledger.reset();
        g.barrier();
        double t0 = MPI_Wtime();
        std::string kind(op);
        if (kind == "all_reduce") g.all_reduce_sum(a.data(), n);
        else if (kind == "reduce_scatter") g.reduce_scatter_sum(a.data(), b.data(), n / p);
        else if (kind == "all_gather") g.all_gather(a.data(), b.data(), n / p);
        else if (p > 1) {  // ping-pong between ranks 0 and 1: one-way time = half the round trip
          if (me == 0) {
            g.send(a.data(), n, 1, 0);
            g.recv(b.data(), n, 1, 0);
          } else if (me == 1) {
            g.recv(b.data(), n, 0, 0);
            g.send(a.data(), n, 0, 0);
          }
        }
        double dt = MPI_Wtime() - t0;
        if (kind == "send_recv") dt /= 2;
        if (r > 0) t.push_back(dt);
        sent = ledger.bytes["dp_" + kind];
        if (kind == "send_recv") sent = ledger.bytes["dp_send"];  // one message each way
      }
      // The slowest rank defines the collective's time.
      double mine = median(t), slowest = 0;
      MPI_Reduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
      if (me == 0)
        std::printf("%-15s %12lld %12.1f %10.2f %10.2f\n", op, static_cast<long long>(4 * n),
                    slowest * 1e6, 4.0 * n / slowest / 1e9, sent / slowest / 1e9);
    }
  }
  MPI_Finalize();
  return 0;
}
