// The [comm] compressors in training under mpirun (2 and 4 ranks; also on the guarded backend):
// for every compressor (topk with each collective, dgc, blocktopk, temporal, powersgd, sign) under
// ZeRO 0, 1 and 2, and with tensor and pipeline parallelism (5 steps each, 1000-float buckets):
//   * the first loss equals the dense run's bit for bit (it is computed before any reduction), the
//     later ones differ (the compressor is used) by less than 2%;
//   * the data-parallel replicas hold the same weights, bit for bit (every rank decodes the same
//     sum: a compressor that gave ranks different bits would let them drift apart);
//   * the step's data-parallel gradient bytes (the ledger's dp kinds but ZeRO's weight all-gather)
//     are below the dense identity's by the compressor's margin, the dense warm-up steps equal it,
//     and the compressor reports its figures (density, residual norm);
//   * ZeRO 3 with a compressor is refused before anything is built, naming [comm] and the reason.
// 2 ranks: ZeRO 0, 1, 2; 4 ranks: ZeRO 0, dp2 x tp2 (sp, ZeRO 1), dp2 x pp2; guarded: ZeRO 0 and 2 on
// 2 ranks. About 20 s per world size on an idle 2-core machine. Exits non-zero on any failure.
#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>

#include <fmt/format.h>

#include "core/check.hpp"
#include "dist_common.hpp"
#include "parallel/compressors.hpp"
#include "train/trainer.hpp"

using namespace exatrain;
using dist_test::Config;

namespace {

using dist_test::all_ok;
using dist_test::dp_gradient_bytes;

struct Case {
  std::string name;
  CommSpec comm;
  double margin;          // compressed gradient bytes < margin x dense
  std::string optimizer;  // "" = the job's (AdamW; DGC: plain SGD)
};

std::vector<Case> cases() {
  auto spec = [](const std::string& c, double density) {
    CommSpec s;
    s.compressor = c;
    s.density = density;
    s.min_compress = 64;  // the tiny model's norms and biases go dense, its matrices are compressed
    return s;
  };
  std::vector<Case> out;
  out.push_back({"topk allgather", spec("topk", 0.05), 0.5, ""});
  CommSpec split = spec("topk", 0.05);
  split.collective = "split_reduce", split.selection = "sample", split.sample_fraction = 0.2;
  out.push_back({"topk split_reduce sampled", split, 0.5, ""});
  CommSpec dgc = spec("dgc", 0.05);
  dgc.warmup = "exponential", dgc.warmup_steps = 3;
  out.push_back({"dgc", dgc, 0.9, ""});  // its warm-up still sends 25% .. 5%
  CommSpec blocks = spec("blocktopk", 0.05);
  blocks.block_size = 16;
  out.push_back({"blocktopk", blocks, 0.5, ""});
  CommSpec temporal = spec("temporal", 0.05);
  temporal.refresh_every = 3;
  out.push_back({"temporal", temporal, 0.5, ""});
  CommSpec psgd = spec("powersgd", 1);
  psgd.rank = 2, psgd.warmup_steps = 1;
  out.push_back({"powersgd", psgd, 0.6, ""});
  out.push_back({"sign", spec("sign", 1), 0.35, ""});
  return out;
}

constexpr int kSteps = 5;

struct Trace {
  std::vector<double> losses;
  std::vector<std::map<std::string, int64_t>> bytes;
  std::map<std::string, double> stats;  // the last step's compressor figures
  std::vector<float> params;            // this rank's first chunk after the last step
};

Trace train(Backend& be, const Job& job) {
  Trace t;
  dist_test::DistRun run = dist_test::make_run(be, job, [](TrainerOptions& o) {
    o.bucket_floats = 1000;  // several buckets, cutting entries (PowerSGD's partial rows)
  });
  for (int s = 0; s < kSteps; s++) {
    const StepMetrics m = run.trainer->train_step();
    t.losses.push_back(m.loss);
    t.bytes.push_back(m.bytes);
    t.stats = m.compression;
  }
  t.params = dist_test::host_params(run.trainer->chunk(0));
  return t;
}

// The job of a case: DGC trains plain SGD (its momentum correction is the momentum).
Job job_of(const Config& cfg, const Case& c) {
  Job job = dist_test::job_for(cfg, kSteps);
  job.train.comm = c.comm;
  if (c.comm.compressor == "dgc") job.train.optimizer = "sgd", job.train.sgd.momentum = 0, job.train.lr = 0.05;
  if (!c.optimizer.empty()) job.train.optimizer = c.optimizer;
  return job;
}

// One configuration with one compressor against the dense run of the same optimizer (cached).
int one(Backend& be, int rank, const Config& cfg, const Case& c, std::map<std::string, Trace>& dense_runs) {
  const Job job = job_of(cfg, c);
  Job dense = job;
  dense.train.comm = CommSpec{};
  const std::string key = cfg.name() + " " + dense.train.optimizer;
  if (!dense_runs.count(key)) dense_runs[key] = train(be, dense);
  const Trace& d = dense_runs[key];
  const Trace t = train(be, job);
  const std::vector<double> losses[2] = {d.losses, t.losses};
  const std::vector<std::map<std::string, int64_t>> bytes[2] = {d.bytes, t.bytes};
  std::map<std::string, double> stats = t.stats;
  const std::vector<float>& params = t.params;
  std::string problems;
  if (losses[1][0] != losses[0][0]) problems += " the first loss differs from the dense run's;";
  double worst = 0;
  bool differs = false;
  for (int s = 1; s < kSteps; s++) {
    worst = dist_test::worst_of(worst, dist_test::rel_diff(losses[1][size_t(s)], losses[0][size_t(s)]));
    differs = differs || losses[1][size_t(s)] != losses[0][size_t(s)];
  }
  if (!(worst < 0.02)) problems += fmt::format(" a loss {:.2g} from the dense run's (> 2%, or not finite);", worst);
  if (!differs) problems += " the losses equal the dense run's (the compressor was not used);";
  // Replicas: every rank of a pure data-parallel world holds the same weights.
  if (cfg.tp == 1 && cfg.pp == 1) {
    std::vector<float> first = params;
    MPI_Bcast(first.data(), int(first.size()), MPI_FLOAT, 0, MPI_COMM_WORLD);
    if (std::memcmp(first.data(), params.data(), 4 * params.size()) != 0) problems += " the replicas' weights differ;";
  }
  const int64_t dense_b = dp_gradient_bytes(bytes[0].back()), comp_b = dp_gradient_bytes(bytes[1].back());
  if (!(dense_b > 0 && double(comp_b) < c.margin * double(dense_b)))
    problems += fmt::format(" gradient bytes {} not below {} x the dense {};", comp_b, c.margin, dense_b);
  if (c.comm.warmup == "dense" && c.comm.warmup_steps > 0 && dp_gradient_bytes(bytes[1][0]) != dp_gradient_bytes(bytes[0][0]))
    problems += " a dense warm-up step sent other bytes than the dense run;";
  if (!stats.count("density") || !stats.count("residual_norm") || !(stats["residual_norm"] > 0))
    problems += " no compressor figures (density, residual_norm);";
  if (!problems.empty()) std::printf("rank %d %s %s:%s\n", rank, cfg.name().c_str(), c.name.c_str(), problems.c_str());
  const bool ok = all_ok(problems.empty());
  if (rank == 0)
    std::printf("%s %s %s: losses %.4f -> %.4f (dense %.4f -> %.4f); dp gradient bytes %lld vs %lld dense (%.1fx "
                "fewer); density %.4f, residual norm %.3g\n",
                ok ? "OK  " : "FAIL", cfg.name().c_str(), c.name.c_str(), losses[1].front(), losses[1].back(),
                losses[0].front(), losses[0].back(), (long long)comp_b, (long long)dense_b,
                comp_b > 0 ? double(dense_b) / double(comp_b) : 0.0, stats["density"], stats["residual_norm"]);
  return !ok;
}

int zero3_refused(Backend& be, int world, int rank) {
  Config cfg;
  cfg.dp = world, cfg.zero = 3;
  Job job = dist_test::job_for(cfg, 2);
  job.train.comm.compressor = "topk";
  std::string err;
  try {
    dist_test::make_run(be, job);
  } catch (const Error& e) {
    err = e.what();
  }
  const bool ok = all_ok(err.find("[comm] compressor = \"topk\" with [parallel] zero = 3: ZeRO 3 reduce-scatters every "
                                  "unit's gradients as backward makes them, outside the compressor slot") != std::string::npos);
  if (rank == 0) std::printf("%s np%d zero 3 with a compressor refused: %s\n", ok ? "OK  " : "FAIL", world, err.c_str());
  return !ok;
}

}  // namespace

int main(int argc, char** argv) {
  const dist_test::World mpi = dist_test::start_mpi(argc, argv);
  std::unique_ptr<Backend> be = dist_test::test_backend(argc, argv);
  int failures = 0;
  // 2 ranks: ZeRO 0, 1 and 2 (ZeRO 0 and 2 on the guarded backend, whose every op is a few
  // mprotect calls: the all-reduce and the reduce-scatter paths); 4 ranks: ZeRO 0, tp and pp.
  const bool guarded = std::string(be->name()) == "cpu-guarded";
  std::vector<Config> configs;
  for (int zero : {0, 1, 2}) {
    if ((mpi.size == 4 || guarded) && zero == 1) continue;
    if (mpi.size == 4 && zero == 2) continue;
    Config c;
    c.dp = mpi.size, c.zero = zero;
    configs.push_back(c);
  }
  if (mpi.size == 4) {
    Config tp;  // dp 2 x tp 2 with sequence parallelism, ZeRO 1
    tp.dp = 2, tp.tp = 2, tp.sp = true, tp.zero = 1;
    Config pp;  // dp 2 x pp 2, 1F1B, the tied embedding's two copies
    pp.dp = 2, pp.pp = 2, pp.zero = 0;
    configs.push_back(tp);
    configs.push_back(pp);
  }
  std::map<std::string, Trace> dense_runs;
  for (const Config& cfg : configs)
    for (const Case& c : cases()) failures += one(*be, mpi.rank, cfg, c, dense_runs);
  // Every other optimizer takes the compressed sum under ZeRO 0 like AdamW: the element-wise Lion,
  // and the ones that need whole tensors (LAMB, Adafactor, Muon, Shampoo, SOAP; K-FAC, whose
  // factors come from the layers' inputs and output gradients, not from the reduction), which
  // under ZeRO 1 are refused with a compressor (tests/job/comm_keys_test.cpp).
  if (!guarded) {
    Config z0;
    z0.dp = mpi.size;
    for (const char* optimizer : {"lion", "lamb", "adafactor", "muon", "shampoo", "soap", "kfac"}) {
      Case c{fmt::format("topk with {}", optimizer), cases()[0].comm, 0.5, optimizer};
      failures += one(*be, mpi.rank, z0, c, dense_runs);
    }
  }
  failures += zero3_refused(*be, mpi.size, mpi.rank);
  if (mpi.rank == 0) std::printf("%d failures (backend %s)\n", failures, be->name());
  MPI_Finalize();
  return failures == 0 && mpi.size >= 2 ? 0 : 1;
}
