// Throughput of the distributed trainer on a small GPT, with the measured time breakdown next to
// the planner's prediction for the `local` machine (the same plan). Run under mpirun; one line per
// run, printed by rank 0. bench_dist.sh runs 1 rank x 2 threads against 2 ranks x 1 thread
// (dp2, tp2, pp2) side by side. The prediction's device is cpu-local (one core per rank), or
// cpu-local-2c for 1 rank x 2 threads (catalog/devices.toml).
//   mpirun -np 2 build/bench/parallel/bench_dist --tp 2 [--pp 1 --dp 1 --threads 1 --steps 8]
#include <mpi.h>
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include <fmt/format.h>

#include "backend/backend.hpp"
#include "job/parse.hpp"
#include "plan/resolve.hpp"
#include "train/trainer.hpp"
#include "plan/predict.hpp"

using namespace exatrain;

namespace {
// Pseudo-random tokens (throughput does not depend on the text); dp ranks read disjoint sequences.
class HashTokens final : public TokenSource {
 public:
  HashTokens(int64_t vocab, int64_t r, int64_t n) : vocab_(vocab), r_(r), n_(n) {}
  void next_batch(int64_t B, int64_t T, int32_t* in, int32_t* tg) override {
    for (int64_t b = 0; b < B; b++)
      for (int64_t t = 0; t <= T; t++) {
        uint64_t x = (pos_ + uint64_t(r_ * B + b)) * 0x9E3779B97F4A7C15ull + uint64_t(t) * 0xBF58476D1CE4E5B9ull;
        x ^= x >> 29;
        const int32_t tok = int32_t(x % uint64_t(vocab_));
        if (t < T) in[b * T + t] = tok;
        if (t > 0) tg[b * T + t - 1] = tok;
      }
    pos_ += uint64_t(B * n_);
  }
  uint64_t position() const override { return pos_; }
  void seek(uint64_t p) override { pos_ = p; }

 private:
  int64_t vocab_, r_, n_;
  uint64_t pos_ = 0;
};
}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  int tp = 1, pp = 1, dp = 1, threads = 1, steps = 8, warmup = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const int v = std::atoi(argv[i + 1]);
    if (k == "--tp") tp = v;
    else if (k == "--pp") pp = v;
    else if (k == "--dp") dp = v;
    else if (k == "--threads") threads = v;
    else if (k == "--steps") steps = v;
    else if (k == "--warmup") warmup = v;
  }
  {  // the runtime's communicators are freed before MPI_Finalize
  Job job;
  job.source = "bench_dist";
  ModelSpec& m = job.model;
  m.layers = 4, m.hidden = 256, m.heads = 8, m.kv_heads = 8, m.ffn_hidden = 1024, m.seq_len = 128, m.vocab = 4096;
  ParallelSpec& p = job.parallel;
  p.gpus = world, p.tp = tp, p.pp = pp, p.dp = dp, p.cp = 1, p.vp = 1, p.zero = 0, p.micro_batch = 2;
  p.global_batch = 8, p.recompute = Recompute::none, p.seq_parallel = false, p.schedule = Schedule::one_f_one_b;
  job.train.steps = warmup + steps;
  job.train.precision = Precision::fp32;
  const plan::Plan rplan = plan::plan_from_job(job, world);
  auto backend = make_cpu_backend(threads);
  omp_set_num_threads(threads);
  parallel::ParallelRuntime rt(MPI_COMM_WORLD,
                               parallel::MeshShape{int(rplan.tp), int(rplan.cp), int(rplan.dp), int(rplan.pp)}, *backend);
  HashTokens data(m.vocab, rt.dp().rank(), rt.dp().size());
  TrainerOptions o = trainer_options(job, rplan);
  o.peak_gflops = 1;
  Trainer trainer(*backend, rt, o, data);
  const char* names[] = {"compute", "tp_comm", "pp_comm", "pp_bubble", "dp_comm", "optimizer"};
  std::vector<double> secs;
  std::vector<std::vector<double>> parts(6);  // per component, one value per measured step
  for (int s = 0; s < warmup + steps; s++) {
    MPI_Barrier(MPI_COMM_WORLD);
    const StepMetrics r = trainer.train_step();
    if (s < warmup) continue;
    secs.push_back(r.seconds);
    for (int k = 0; k < 6; k++)
      parts[size_t(k)].push_back(r.breakdown_s.count(names[k]) ? r.breakdown_s.at(names[k]) : 0.0);
  }
  // Medians, like the step time: one step slowed by another job on the shared cores must not
  // move a component (a mean did: compute above the whole median step). Then the slowest rank's
  // step time and each component's largest per-rank median.
  auto median_of = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  double median = median_of(secs), slowest = 0;
  MPI_Allreduce(&median, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  std::vector<double> mid(6), worst(6);
  for (int k = 0; k < 6; k++) mid[size_t(k)] = median_of(parts[size_t(k)]);
  MPI_Reduce(mid.data(), worst.data(), 6, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
  if (rank == 0) {
    MachineSpec local = parse_job("[machine]\npreset = \"local\"\n", "local machine", {}).machine;
    // The local machine's device is one core (one rank per core). One rank running 2 threads has
    // both cores: the catalog's cpu-local-2c device (its measured 2-thread GEMM rate and memory).
    if (world == 1 && threads == 2) local.device = "cpu-local-2c";
    plan::Plan pl = plan::resolve_plan(p, Precision::fp32);
    const plan::Prediction pred = plan::predict(m, local, pl);
    const plan::Breakdown& b = pred.breakdown;
    const double predicted[6] = {b.compute, b.tp_comm, b.pp_comm, b.pp_bubble, b.dp_comm, b.optimizer};
    const double tokens = double(p.global_batch * m.seq_len);
    std::printf("%d rank(s) x %d thread(s) tp%d pp%d dp%d [%s] | step %.4f s (predicted %.4f) | %.0f tokens/s (predicted %.0f) |",
                world, threads, tp, pp, dp, local.device.c_str(), slowest, pred.step_time_s, tokens / slowest,
                pred.tokens_per_s);
    for (int k = 0; k < 6; k++) std::printf(" %s %.4f/%.4f", names[k], worst[size_t(k)], predicted[k]);
    std::printf("   (measured/predicted s)\n");
  }
  }
  MPI_Finalize();
  return 0;
}
