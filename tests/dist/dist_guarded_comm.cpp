// The guarded CPU backend under mpirun (one process per rank): MPI reads and writes device
// memory inside begin_host_access / end_host_access (an all-reduce over a buffer that spans
// several pages at an offset, and a send/receive between ranks), and the results are right;
// after the scopes end the pages are guarded again. With --stray, rank 1 reads device memory
// outside any op after MPI_Init (whose SIGSEGV handler ours replaces and chains to): the test
// (dist_guarded_comm_stray, CMakeLists.txt) expects the guarded backend's message naming the
// allocation.
#include <mpi.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "backend/backend.hpp"

using namespace exatrain;

namespace {

int fail(int rank, const char* what) {
  std::fprintf(stderr, "rank %d: %s\n", rank, what);
  MPI_Abort(MPI_COMM_WORLD, 1);
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0, rank = 0, size = 1;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  auto be = make_backend("cpu-guarded", 1, 0);
  const int64_t n = 5000, offset = 300;  // [offset, offset + n) spans several pages
  DeviceBuffer buf(*be, n + offset, "comm buffer");
  be->fill(buf.data(), -1.0f, n + offset);
  be->fill(buf.data() + offset, float(rank + 1), n);

  const int64_t t = be->begin_host_access(buf.data() + offset, sizeof(float) * size_t(n));
  MPI_Allreduce(MPI_IN_PLACE, buf.data() + offset, int(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  be->end_host_access(t);
  std::vector<float> h(size_t(n + offset));
  be->download(h.data(), buf.data(), sizeof(float) * h.size());
  const float want = float(size * (size + 1) / 2);
  for (int64_t i = 0; i < n + offset; i++)
    if (h[size_t(i)] != (i < offset ? -1.0f : want)) return fail(rank, "all-reduce result wrong");

  if (size >= 2 && rank < 2) {  // ranks 0 and 1 swap the first 1000 floats
    DeviceBuffer recv(*be, 1000, "receive buffer");
    const int peer = 1 - rank;
    const int64_t ts = be->begin_host_access(buf.data(), 4000), tr = be->begin_host_access(recv.data(), 4000);
    MPI_Sendrecv(buf.data(), 1000, MPI_FLOAT, peer, 7, recv.data(), 1000, MPI_FLOAT, peer, 7,
                 MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    be->end_host_access(tr);
    be->end_host_access(ts);
    std::vector<float> r(1000);
    be->download(r.data(), recv.data(), 4000);
    for (int64_t i = 0; i < 1000; i++)
      if (r[size_t(i)] != (i < offset ? -1.0f : want)) return fail(rank, "send/receive result wrong");
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (argc > 1 && std::strcmp(argv[1], "--stray") == 0 && rank == (size > 1 ? 1 : 0)) {
    const volatile float* p = buf.data() + offset;  // outside any op: must die with the message
    std::printf("read %f\n", double(*p));
    return fail(rank, "a stray read of device memory did not fault");
  }
  if (rank == 0) std::printf("dist_guarded_comm: %d ranks ok\n", size);
  buf.reset();
  MPI_Finalize();
  return 0;
}
