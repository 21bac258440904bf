// Compressed momentum ([comm] compress = "momentum", docs/compression.md "The Adam
// question") in training under mpirun (2 and 4 ranks), ZeRO 0, AdamW, 2 dense warm-up steps then
// the variance frozen, 6 steps, 1000-float buckets:
//   * density 1 (top-k sends every element of the local momenta): the run equals dense AdamW with
//     the same frozen variance within fp32 rounding (every loss and weight), so the momentum path
//     computes AdamW's m = b1 m + (1 - b1) g from the ranks' local momenta;
//   * top-k 5%, temporal 5% (refresh every 3 steps), sign, DGC 5% (its velocity as AdamW's m): the replicas hold the same weights bit
//     for bit; the losses stay within 2% of the dense run's and differ from them; every step's dp
//     gradient bytes (the ledger) equal those of the same compressor on the gradient (the same
//     collectives of the same sizes), the warm-up steps' equal the dense run's, and the compressed
//     steps' are below a margin of dense; the error feedback keeps what was not sent of the momentum
//     (residual_norm > 0; 0 at density 1, where everything is sent);
//   * top-k 5% and DGC 5% packed (values = "sign", indices = "golomb", small_pieces = "sign"):
//     identical replicas, losses within 2% of dense, every compressed step under a fifth of the
//     same compressor's plain pairs' bytes;
//   * ZeRO 1 with compress = "momentum" is refused when the run is built, naming the key.
// Exits non-zero on any failure.
#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>

#include <fmt/format.h>

#include "core/check.hpp"
#include "dist_common.hpp"
#include "train/trainer.hpp"

using namespace exatrain;
using dist_test::Config;

namespace {

constexpr int kSteps = 6, kWarmup = 2;

using dist_test::all_ok;
using dist_test::dp_gradient_bytes;

struct Trace {
  std::vector<double> losses;
  std::vector<int64_t> bytes;           // per step
  std::map<std::string, double> stats;  // the last step's compressor figures
  std::vector<float> params;
};

Trace train(Backend& be, const Job& job) {
  Trace t;
  dist_test::DistRun run = dist_test::make_run(be, job, [](TrainerOptions& o) { o.bucket_floats = 1000; });
  for (int s = 0; s < kSteps; s++) {
    const StepMetrics m = run.trainer->train_step();
    t.losses.push_back(m.loss);
    t.bytes.push_back(dp_gradient_bytes(m.bytes));
    t.stats = m.compression;
  }
  t.params = dist_test::host_params(run.trainer->chunk(0));
  return t;
}

// AdamW with the variance frozen after the dense warm-up; compressor "none" is the dense reference.
Job job_with(int dp, const std::string& compressor, double density, const std::string& compress) {
  Config cfg;
  cfg.dp = dp;
  Job job = dist_test::job_for(cfg, kSteps);
  CommSpec& c = job.train.comm;
  c.compressor = compressor, c.density = density, c.compress = compress;
  c.min_compress = 64;  // the tiny model's norms and biases dense, its matrices compressed
  c.warmup_steps = kWarmup, c.adam_variance = "freeze";
  c.refresh_every = 3;
  return job;
}

// Largest |a - b| / (1 + |b|) over the weights, the maximum over the ranks.
double worst_weight(const std::vector<float>& a, const std::vector<float>& b) {
  double w = a.size() == b.size() ? 0 : INFINITY;
  for (size_t i = 0; i < a.size() && i < b.size(); i++)
    w = dist_test::worst_of(w, std::fabs(double(a[i]) - double(b[i])) / (1 + std::fabs(double(b[i]))));
  double all = 0;
  MPI_Allreduce(&w, &all, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return all;
}

int density_one(Backend& be, int dp, int rank, const Trace& dense) {
  const Trace t = train(be, job_with(dp, "topk", 1.0, "momentum"));
  const double loss = dist_test::worst_over_ranks(t.losses, dense.losses), weight = worst_weight(t.params, dense.params);
  const double residual = t.stats.count("residual_norm") ? t.stats.at("residual_norm") : -1;
  // The control: the same 6 steps without the freeze move the weights far more than the tolerance
  // (the comparison can tell a wrong momentum or an updated v from rounding).
  Job unfrozen = job_with(dp, "none", 1.0, "gradient");
  unfrozen.train.comm.adam_variance = "update";
  const double control = worst_weight(train(be, unfrozen).params, dense.params);
  const bool ok = loss < 1e-5 && weight < 1e-5 && control > 1e-3 && residual == 0 && t.bytes.back() > dense.bytes.back();
  return dist_test::report(ok, fmt::format("np{} topk density 1 momentum = dense AdamW with frozen v: losses within "
                                           "{:.2g}, weights within {:.2g} (both < 1e-5; v not frozen: {:.2g} > 1e-3), "
                                           "residual norm {}, bytes {} (pairs: more than dense {})", dp, loss, weight,
                                           control, residual, t.bytes.back(), dense.bytes.back()), rank);
}

// What every compressed run must show: the replicas' weights the same bits, and the losses within
// 2% of the dense run's. Returns the problems found ("" when none).
std::string replicas_and_losses(const Trace& m, const Trace& dense) {
  std::string problems;
  std::vector<float> first = m.params;
  MPI_Bcast(first.data(), int(first.size()), MPI_FLOAT, 0, MPI_COMM_WORLD);
  if (std::memcmp(first.data(), m.params.data(), 4 * m.params.size()) != 0) problems += " the replicas' weights differ;";
  const double worst = dist_test::worst_over_ranks(m.losses, dense.losses);
  if (!(worst < 0.02)) problems += fmt::format(" a loss {:.2g} from the dense run's;", worst);
  return problems;
}

// *momentum (when given): the momentum run's trace, which packed() compares its bytes with.
int compressed(Backend& be, int dp, int rank, const Trace& dense, const std::string& compressor, double margin,
               Trace* momentum = nullptr) {
  const Trace m = train(be, job_with(dp, compressor, 0.05, "momentum"));
  if (momentum) *momentum = m;
  const Trace g = train(be, job_with(dp, compressor, 0.05, "gradient"));
  std::string problems = replicas_and_losses(m, dense);
  if (m.losses.back() == dense.losses.back()) problems += " the last loss equals the dense run's;";
  for (int s = 0; s < kSteps; s++) {
    const int64_t want = s < kWarmup ? dense.bytes[size_t(s)] : g.bytes[size_t(s)];
    if (m.bytes[size_t(s)] != want)
      problems += fmt::format(" step {} sent {} bytes, expected {};", s + 1, m.bytes[size_t(s)], want);
  }
  if (!(double(m.bytes.back()) < margin * double(dense.bytes.back())))
    problems += fmt::format(" {} bytes not below {} x dense {};", m.bytes.back(), margin, dense.bytes.back());
  const double residual = m.stats.count("residual_norm") ? m.stats.at("residual_norm") : 0;
  if (!(residual > 0)) problems += " no error-feedback residual;";
  if (!problems.empty()) std::printf("rank %d %s:%s\n", rank, compressor.c_str(), problems.c_str());
  return dist_test::report(all_ok(problems.empty()),
                           fmt::format("np{} {} 5% momentum: losses {:.4f} -> {:.4f} (dense {:.4f}), bytes {} per step "
                                       "(gradient mode {}, dense {}), residual norm {:.3g}", dp, compressor,
                                       m.losses.front(), m.losses.back(), dense.losses.back(), m.bytes.back(),
                                       g.bytes.back(), dense.bytes.back(), residual), rank);
}

// topk or dgc at 5% of the momentum packed (signs with one magnitude per piece, Rice-coded gaps) and the
// small pieces as signs: the replicas stay identical, the losses close to dense, and every
// compressed step sends under a fifth of plain topk's bytes (about 6 bits a pair against 64; the
// norms and biases 1 bit each instead of an fp32 all-reduce).
// plain: the same compressor's run with plain pairs (compressed()'s momentum run).
int packed(Backend& be, int dp, int rank, const Trace& dense, const std::string& compressor, const Trace& plain) {
  Job job = job_with(dp, compressor, 0.05, "momentum");
  job.train.comm.values = "sign", job.train.comm.indices = "golomb", job.train.comm.small_pieces = "sign";
  const Trace m = train(be, job);
  std::string problems = replicas_and_losses(m, dense);
  if (m.losses.back() == plain.losses.back()) problems += " the last loss equals the plain pairs';";
  for (int s = kWarmup; s < kSteps; s++)
    if (!(5 * m.bytes[size_t(s)] < plain.bytes[size_t(s)]))
      problems += fmt::format(" step {} sent {} bytes, plain pairs {};", s + 1, m.bytes[size_t(s)], plain.bytes[size_t(s)]);
  const double residual = m.stats.count("residual_norm") ? m.stats.at("residual_norm") : 0;
  if (!(residual > 0)) problems += " no error-feedback residual;";
  if (!problems.empty()) std::printf("rank %d %s packed:%s\n", rank, compressor.c_str(), problems.c_str());
  return dist_test::report(all_ok(problems.empty()),
                           fmt::format("np{} {} 5% momentum packed (sign, golomb, small pieces sign): losses {:.4f} -> "
                                       "{:.4f} (dense {:.4f}), bytes {} per step (plain pairs {}, dense {})", dp,
                                       compressor, m.losses.front(), m.losses.back(), dense.losses.back(),
                                       m.bytes.back(), plain.bytes.back(), dense.bytes.back()), rank);
}

int zero1_refused(Backend& be, int dp, int rank) {
  Job job = job_with(dp, "topk", 0.05, "momentum");
  job.parallel.zero = 1;
  const std::string err = dist_test::refusal(be, job);
  const bool ok = all_ok(err.find("[comm] compress = \"momentum\" with [parallel] zero = 1") != std::string::npos);
  return dist_test::report(ok, fmt::format("np{} compress = \"momentum\" with ZeRO 1 refused: {}", dp, err), rank);
}

}  // namespace

int main(int argc, char** argv) {
  const dist_test::World mpi = dist_test::start_mpi(argc, argv);
  std::unique_ptr<Backend> be = dist_test::test_backend(argc, argv);
  int failures = 0;
  const Trace dense = train(*be, job_with(mpi.size, "none", 1.0, "gradient"));
  failures += density_one(*be, mpi.size, mpi.rank, dense);
  Trace topk, dgc;
  failures += compressed(*be, mpi.size, mpi.rank, dense, "topk", 0.5, &topk);
  failures += compressed(*be, mpi.size, mpi.rank, dense, "temporal", 0.5);
  failures += compressed(*be, mpi.size, mpi.rank, dense, "sign", 0.35);
  failures += compressed(*be, mpi.size, mpi.rank, dense, "dgc", 0.5, &dgc);
  failures += packed(*be, mpi.size, mpi.rank, dense, "topk", topk);
  failures += packed(*be, mpi.size, mpi.rank, dense, "dgc", dgc);
  failures += zero1_refused(*be, mpi.size, mpi.rank);
  if (mpi.rank == 0) std::printf("%d failures (backend %s)\n", failures, be->name());
  MPI_Finalize();
  return failures == 0 && mpi.size >= 2 ? 0 : 1;
}
