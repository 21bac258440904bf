// The sparse collectives (parallel/sparse_collectives.hpp) against dense MPI_Allreduce, side by side
// in one run (run under mpirun; bench/comm/collectives.py runs 2, 4 and 8 ranks):
//   dense          Group::all_reduce_sum of n floats (MPI_Allreduce)
//   allgather      all-gather of every rank's k = density n (index, value) pairs, summed into n
//   allgather_packed  the same pairs packed (parallel/pair_codec.hpp): the values rounded to signs with
//                  one magnitude, Rice-coded gaps, encoded and decoded on the host inside the timing
//   split_reduce   Ok-Topk-style split and reduce, each region's ceil(k / P) largest all-gathered
//   shared_index   the values at a common index set of k, one all-reduce of k floats, into n
//   topk_e2e       the topk compressor end to end on a dense bucket of n (the gradient copied in,
//                  selection (radix, three passes), error feedback, the all-gather of pairs, the result
//                  written back): what the planner's break-even models (--e2e, n up to --e2e-max)
// For message sizes n (--sizes, floats) and densities (--densities). Per case: the median over
// --reps repetitions (after one warm-up) of the slowest rank's time, its ratio to dense, the
// bytes rank 0 sent (the ledger: exact, by the ring convention) and their ratio to dense, and the
// planner's prediction (plan::compression_cost_flat on the `local` machine, catalog/clusters/
// local.toml): the collective's time and its break-even density (pred_be: of the collective alone
// for the collective rows, of the whole compressor for topk_e2e). --json FILE writes every row.
// Pairs: k distinct indices per rank, one drawn in each of k equal strata (seeded per rank).
//
// The heap keeps large blocks (mallopt below): Open MPI 4.1's MPI_Allreduce allocates a temporary
// buffer of the message's size on every call, and glibc serves a block over 32 MiB (its largest
// dynamic mmap threshold) with fresh mmap'ed pages that are faulted in and unmapped each time. On
// this VM that made the dense all-reduce of 16M floats 10x slower than of 4M (0.3 GB/s instead of
// 3-5, in a plain C MPI_Allreduce loop too, on shared memory and on TCP alike; gone with
// MALLOC_MMAP_THRESHOLD_ set), a baseline no tuned training process sees. The trainer's gradient
// buckets (ZeRO 0 and 2: 1 MiB) are far below the threshold; ZeRO 1's one reduce-scatter of the
// whole gradient is not, above 8M parameters (not measured here).
#include <malloc.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/backend.hpp"
#include "catalog/device.hpp"
#include "core/splitmix.hpp"
#include "parallel/compressors.hpp"
#include "parallel/mpi_group.hpp"
#include "parallel/sparse_collectives.hpp"
#include "plan/compression.hpp"

using namespace exatrain;
using namespace exatrain::parallel;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::vector<double> parse_list(const char* s) {
  std::vector<double> out;
  for (const char* p = s; *p;) {
    char* end = nullptr;
    out.push_back(std::strtod(p, &end));
    p = *end == ',' ? end + 1 : end;
  }
  return out;
}

struct Options {
  std::vector<double> sizes = {1 << 20, 1 << 22, 1 << 24, 1 << 26}, densities = {0.001, 0.003, 0.01, 0.03, 0.1};
  int reps = 5;
  bool e2e = false;
  double e2e_max = 1 << 24;
  std::string json;
};

// The slowest rank's time of `op` per repetition, after one warm-up; the bytes rank 0 sent once.
double timed(Group& g, CommLedger& ledger, int reps, const std::function<void()>& op, int64_t* bytes) {
  std::vector<double> t;
  for (int r = 0; r <= reps; r++) {
    ledger.reset();
    g.barrier();
    const double t0 = MPI_Wtime();
    op();
    double dt = MPI_Wtime() - t0, slowest = 0;
    MPI_Allreduce(&dt, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (r > 0) t.push_back(slowest);
    if (r == 0) *bytes = ledger.total_bytes();
  }
  return median(t);
}

// The planner's time of the collective alone, as this benchmark times it: the wire (comm_s) and
// the collective's own decoding (decode_s: the zero fill, the scatters, the codec), without the
// compressor's selection and error feedback.
double collective_s(const plan::CompressionCost& c) { return c.comm_s + c.decode_s; }

// The planner's break-even density of the collective alone against the dense all-reduce's time:
// bisection in log density.
double comm_break_even(CommSpec spec, const MachineSpec& m, const Device& d, double n, int p) {
  auto excess = [&](double density) {
    spec.density = density;
    const plan::CompressionCost c = plan::compression_cost_flat(spec, m, d, n, p, 1);
    return collective_s(c) - c.dense_s;
  };
  if (excess(1e-7) >= 0) return 0;
  if (excess(1.0) < 0) return 1;
  double lo = 1e-7, hi = 1;
  for (int i = 0; i < 60; i++) (excess(std::sqrt(lo * hi)) < 0 ? lo : hi) = std::sqrt(lo * hi);
  return lo;
}

}  // namespace

// One message size: the dense all-reduce, then every density's collectives (and the compressor).
struct SizeBench {
  Backend& be;
  MpiGroup& g;
  CommLedger& ledger;
  const Options& o;
  const MachineSpec& local;
  const Device& device;
  nlohmann::json& rows;
  int64_t n = 0;
  double dense_s = 0;
  int64_t dense_bytes = 0;

  void row(double d, const std::string& method, double s, int64_t bytes, double pred_s, double pred_be) {
    if (g.rank() != 0) return;
    std::printf("%-6d %10lld %8.4g %-13s %11.5f %8.3f %13lld %8.1f %11.5f %10.4g\n", g.size(), (long long)n, d,
                method.c_str(), s, s / dense_s, (long long)bytes,
                double(dense_bytes) / double(std::max<int64_t>(bytes, 1)), pred_s, pred_be);
    rows.push_back({{"ranks", g.size()}, {"floats", n}, {"density", d}, {"method", method}, {"seconds", s},
                    {"dense_seconds", dense_s}, {"bytes", bytes}, {"dense_bytes", dense_bytes},
                    {"predicted_seconds", pred_s}, {"predicted_break_even", pred_be}});
  }

  void dense(DeviceBuffer& buf) {
    be.fill(buf.data(), 1.0f, n);
    dense_s = timed(g, ledger, o.reps, [&] { g.all_reduce_sum(buf.data(), n); }, &dense_bytes);
    CommSpec spec;
    spec.compressor = "topk";
    row(1.0, "dense", dense_s, dense_bytes, plan::compression_cost_flat(spec, local, device, double(n), g.size(), 1).dense_s,
        NAN);
  }

  // This rank's k pairs (one index per stratum of n / k, values in [-1, 1)) and a shared index set.
  void collectives(double d, float* out) {
    const int p = g.size(), me = g.rank();
    const int64_t k = std::max<int64_t>(1, int64_t(std::llround(d * double(n))));
    std::vector<int32_t> idx(static_cast<size_t>(k)), shared(static_cast<size_t>(k));
    std::vector<float> val(static_cast<size_t>(k));
    for (int64_t j = 0; j < k; j++) {
      const int64_t lo = j * n / k, width = (j + 1) * n / k - lo;
      const uint64_t r = splitmix64_mix(uint64_t(me) * 0x9e3779b97f4a7c15ull + uint64_t(j));
      idx[size_t(j)] = int32_t(lo + int64_t(r % uint64_t(width)));
      shared[size_t(j)] = int32_t(lo + int64_t(splitmix64_mix(uint64_t(j)) % uint64_t(width)));
      val[size_t(j)] = float(double(r >> 11) / 4503599627370496.0 - 1.0);
    }
    DeviceBuffer di(be, k), dv(be, k), ds(be, k), dsv(be, k);
    be.upload(di.data(), idx.data(), 4 * size_t(k));
    be.upload(dv.data(), val.data(), 4 * size_t(k));
    be.upload(ds.data(), shared.data(), 4 * size_t(k));
    const SparsePairs mine{reinterpret_cast<const int32_t*>(di.data()), dv.data(), k};
    Scratch scratch(be);
    for (const char* collective : {"allgather", "split_reduce"}) {
      CommSpec spec;
      spec.compressor = "topk", spec.density = d, spec.collective = collective;
      const plan::CompressionCost pred = plan::compression_cost_flat(spec, local, device, double(n), p, 1);
      int64_t bytes = 0;
      const double s = timed(g, ledger, o.reps, [&] {
        if (std::string(collective) == "allgather") allgather_pairs_sum(g, be, mine, n, out, scratch);
        else split_reduce_all(g, be, mine, n, (k + p - 1) / p, out, scratch);
      }, &bytes);
      row(d, collective, s, bytes, collective_s(pred), comm_break_even(spec, local, device, double(n), p));
    }
    {  // the same pairs packed: signs with one magnitude, Rice-coded gaps (about 9 bits a pair at 1%)
      const std::vector<PairSegment> whole = {{0, n}};
      std::vector<float> q = val;
      quantize_pairs(idx.data(), q.data(), k, whole, PairValues::sign);
      DeviceBuffer dq(be, k);
      be.upload(dq.data(), q.data(), 4 * size_t(k));
      const SparsePairs packed{mine.idx, dq.data(), k};
      CommSpec spec;
      spec.compressor = "topk", spec.density = d, spec.values = "sign", spec.indices = "golomb";
      const plan::CompressionCost pred = plan::compression_cost_flat(spec, local, device, double(n), p, 1);
      int64_t bytes = 0;
      const double s = timed(g, ledger, o.reps, [&] {
        allgather_packed_sum(g, be, packed, n, whole, {PairIndices::rice, PairValues::sign}, out, scratch);
      }, &bytes);
      row(d, "allgather_packed", s, bytes, collective_s(pred), comm_break_even(spec, local, device, double(n), p));
    }
    int64_t bytes = 0;
    const double s = timed(g, ledger, o.reps, [&] {
      be.upload(dsv.data(), val.data(), 4 * size_t(k));  // the values are summed in place
      shared_index_all_reduce(g, be, reinterpret_cast<const int32_t*>(ds.data()), dsv.data(), k, n, out);
    }, &bytes);
    CommSpec temporal;
    temporal.compressor = "temporal", temporal.density = d, temporal.refresh_every = 1000000;
    row(d, "shared_index", s, bytes, collective_s(plan::compression_cost_flat(temporal, local, device, double(n), p, 1)),
        comm_break_even(temporal, local, device, double(n), p));
  }

  // The topk compressor on a dense bucket of n: the gradient copied in, then start().
  void end_to_end(double d) {
    CommSpec spec;
    spec.compressor = "topk", spec.density = d, spec.min_compress = 0, spec.overlap_every = 0;
    std::shared_ptr<Compressor> c = make_compressor(spec, {1, 0, n});
    DeviceBuffer grad(be, n, "gradient");
    std::vector<float> h(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; i++) h[size_t(i)] = float(std::sin(0.001 * double(i) * (g.rank() + 1)));
    int step = 0;
    int64_t bytes = 0;
    const double s = timed(g, ledger, o.reps, [&] {
      be.upload(grad.data(), h.data(), 4 * size_t(n));
      BucketReduce b;
      b.begin = 0, b.end = n, b.n = n, b.data = b.out = grad.data();
      c->begin_step(++step);
      c->start(g, be, b);
    }, &bytes);
    const plan::CompressionCost pred = plan::compression_cost_flat(spec, local, device, double(n), g.size(), 1);
    row(d, "topk_e2e", s, bytes, pred.seconds(), pred.break_even_density.value_or(NAN));
  }
};

Options parse_options(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; i++) {
    const std::string a = argv[i];
    if (a == "--e2e") o.e2e = true;
    else if (i + 1 < argc && a == "--sizes") o.sizes = parse_list(argv[++i]);
    else if (i + 1 < argc && a == "--densities") o.densities = parse_list(argv[++i]);
    else if (i + 1 < argc && a == "--reps") o.reps = std::atoi(argv[++i]);
    else if (i + 1 < argc && a == "--e2e-max") o.e2e_max = std::atof(argv[++i]);
    else if (i + 1 < argc && a == "--json") o.json = argv[++i];
    else {
      std::fprintf(stderr, "usage: bench_sparse_collectives [--sizes N,..] [--densities D,..] [--reps R] [--e2e] "
                           "[--e2e-max N] [--json FILE]\n");
      std::exit(2);
    }
  }
  return o;
}

int main(int argc, char** argv) {
  // 1 GiB: large blocks come from the heap (above) and stay there between calls. Both are needed
  // (the threshold alone still trims the heap after each free); an older glibc refuses a threshold
  // over 32 MiB, and the dense baseline would be slow again: say so rather than measure it.
  if (mallopt(M_MMAP_THRESHOLD, 1 << 30) != 1 || mallopt(M_TRIM_THRESHOLD, 1 << 30) != 1)
    std::fprintf(stderr, "bench_sparse_collectives: warning: mallopt refused the 1 GiB mmap/trim thresholds; "
                         "the dense MPI_Allreduce of messages over 32 MiB may run at page-fault speed\n");
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  const Options o = parse_options(argc, argv);
  std::unique_ptr<Backend> be = make_cpu_backend(1);
  CommLedger ledger;
  MpiGroup g(MPI_COMM_WORLD, "dp", &ledger, nullptr, be.get());
  const MachineSpec local = find_cluster("local");
  const Device& device = find_device(local.device);
  nlohmann::json rows = nlohmann::json::array();
  if (g.rank() == 0)
    std::printf("# %d ranks on this machine; median of %d reps of the slowest rank; bytes: rank 0's ledger\n"
                "%-6s %10s %8s %-13s %11s %8s %13s %8s %11s %10s\n", g.size(), o.reps, "ranks", "floats", "density",
                "method", "time_s", "x_dense", "bytes_rank0", "x_bytes", "pred_s", "pred_be");
  for (double nd : o.sizes) {
    SizeBench b{*be, g, ledger, o, local, device, rows};
    b.n = int64_t(nd);
    DeviceBuffer dense(*be, b.n, "dense"), out(*be, b.n, "out");
    b.dense(dense);
    for (double d : o.densities) {
      b.collectives(d, out.data());
      if (o.e2e && nd <= o.e2e_max) b.end_to_end(d);
    }
  }
  if (g.rank() == 0 && !o.json.empty()) std::ofstream(o.json) << rows.dump(1) << "\n";
  MPI_Finalize();
  return 0;
}
