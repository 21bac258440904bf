// fp16 loss scaling on many ranks (train/loss_scaler.hpp, docs/precision.md "Loss scaling"):
//   a. one rank overflows: at step 3 world rank r's share of the gradient norm reads as +inf
//      (TrainerOptions::inject_overflow_*: as if only that rank's gradients, e.g. its ZeRO shard
//      or its pipeline stage, held an inf), for r = 0 and r = 1 in turn. Every rank must skip that
//      step: its parameters and optimizer state (every state slice it holds) unchanged bit for
//      bit, its step count unchanged, its scale halved; the other steps applied. The losses equal
//      the single-rank fp16 Trainer's with the same step skipped (1e-5 relative: the sums' order).
//   b. a real overflow everywhere: an initial scale of 2^40 overflows the first steps' fp16 dY;
//      every rank skips the same steps with the same scales, and the state is unchanged across each.
// Layouts of 2 ranks: dp 2 under ZeRO 0, 1, 2 and 3, tp 2, pp 2; of 4: dp2 x tp2 under ZeRO 3,
// dp2 x pp2 under ZeRO 1, tp2 x pp2, dp 4 under ZeRO 2. Run as `mpirun -np N dist_fp16` (N = 2, 4);
// exits non-zero on any mismatch.
#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "backend/backend.hpp"
#include "dist_common.hpp"
#include "train/trainer.hpp"

using namespace exatrain;
using dist_test::Config;

namespace {

// Every state slice this rank saves (parameters and optimizer state), as bytes. Each element has
// one saver among its replicas, so the ranks' snapshots together cover the whole state; the rest
// of a rank's arena is its replicas' (or, for mixed precision's sharded masters under ZeRO 1/2,
// not kept at all: parallel/master_shards.hpp).
std::string snapshot(Trainer& tr) {
  std::string out;
  for (const parallel::StateSlice& s : tr.state_slices()) {
    if (!s.saver) continue;
    std::vector<float> h(size_t(s.end - s.begin));
    tr.backend().download(h.data(), s.data, h.size() * sizeof(float));
    out.append(reinterpret_cast<const char*>(h.data()), h.size() * sizeof(float));
  }
  return out;
}

// The single-rank fp16 Trainer on the same job, step `inject_at` overflowing; its losses (NaN at
// skipped steps).
std::vector<double> single_rank_losses(const Job& job, int iterations, int64_t inject_at) {
  auto backend = make_cpu_backend(1);
  TrainerOptions o = dist_test::single_rank_options(job);
  o.inject_overflow_at_step = inject_at, o.inject_overflow_rank = 0;
  dist_test::SyntheticSource src(job.model.vocab, 0, 1);
  auto rt = parallel::ParallelRuntime::local(*backend);
  Trainer trainer(*backend, *rt, o, src);
  std::vector<double> out;
  for (int i = 0; i < iterations; i++) {
    const StepMetrics m = trainer.train_step();
    out.push_back(m.skipped ? std::nan("") : m.loss);
  }
  return out;
}

// One run of `iterations` train_step calls; per call, the checks of a skipped or applied step on
// this rank. Returns this rank's mismatches; fills the losses (NaN where skipped) and the scales.
int run_checked(Trainer& tr, int iterations, std::vector<double>& losses, std::vector<double>& scales,
                const std::function<bool(int)>& expect_skip) {
  int bad = 0;
  for (int i = 0; i < iterations; i++) {
    const std::string before = snapshot(tr);
    const double scale = tr.loss_scaler().scale();
    const int64_t step = tr.step();
    const StepMetrics m = tr.train_step();
    scales.push_back(m.loss_scale);
    losses.push_back(m.overflow ? std::nan("") : m.loss);
    if (m.loss_scale != scale) bad++;
    if (expect_skip && m.overflow != expect_skip(i)) bad++;
    if (m.overflow) {
      const bool same = snapshot(tr) == before;
      if (!same || !m.skipped || tr.step() != step || tr.loss_scaler().scale() != scale / 2) bad++;
    } else if (m.nonfinite || tr.step() != step + 1 || snapshot(tr) == before) {
      bad++;
    }
  }
  return bad;
}

// The same vector on every rank (bit for bit): 0 mismatches, else 1.
int differs_over_ranks(const std::vector<double>& v) {
  std::vector<double> lo(v.size()), hi(v.size());
  std::vector<double> w(v.size());
  for (size_t i = 0; i < v.size(); i++) w[i] = std::isnan(v[i]) ? -1.0 : v[i];
  MPI_Allreduce(w.data(), lo.data(), int(w.size()), MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(w.data(), hi.data(), int(w.size()), MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return lo == hi ? 0 : 1;
}

// The worst relative difference of a[i] against b[i] over every rank; a step skipped in both (NaN
// in both) agrees, one skipped in one only is +inf.
double worst_loss_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double worst = a.size() == b.size() ? 0.0 : INFINITY;
  for (size_t i = 0; i < a.size() && i < b.size(); i++)
    if (!(std::isnan(a[i]) && std::isnan(b[i]))) worst = dist_test::worst_of(worst, dist_test::rel_diff(a[i], b[i]));
  double all = 0;
  MPI_Allreduce(&worst, &all, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return all;
}

}  // namespace

int main(int argc, char** argv) {
  const dist_test::World mpi = dist_test::start_mpi(argc, argv);
  const int world = mpi.size, rank = mpi.rank;
  std::vector<Config> configs;
  auto c = [&](int dp, int tp, int pp, int zero) {
    Config x;
    x.dp = dp, x.tp = tp, x.pp = pp, x.zero = zero;
    if (dp * tp * pp == world) configs.push_back(x);
  };
  c(2, 1, 1, 0), c(2, 1, 1, 1), c(2, 1, 1, 2), c(2, 1, 1, 3), c(1, 2, 1, 0), c(1, 1, 2, 0);
  c(2, 2, 1, 3), c(2, 1, 2, 1), c(1, 2, 2, 0), c(4, 1, 1, 2);  // 4 ranks
  const int iterations = 6, inject_at = 3;
  auto backend = make_cpu_backend(1);
  int failures = 0;
  for (const Config& cfg : configs) {
    Job job = dist_test::job_for(cfg, iterations);
    job.train.precision = Precision::fp16;
    // Every overflow backs off (GradScaler's rule), so one overflow shows in the scale; the
    // default hysteresis of 2 is tested on one rank (loss_scaler_test, session_test).
    job.train.loss_scale.hysteresis = 1;
    // fp32 tp and pp messages: the 1e-5 comparison with one rank is of the skip logic alone (fp16
    // messages add their own rounding: 1.3e-5 at tp 2; test_parallel_mpi's TpHooksMpi and
    // PipelineMpi SixteenBit tests check the fp16 messages exactly).
    job.train.pipeline_dtype = job.train.tp_comm_dtype = "fp32";
    const std::vector<double> ref = single_rank_losses(job, iterations, inject_at);
    for (int r = 0; r < world; r++) {  // a. only world rank r overflows
      dist_test::DistRun run = dist_test::make_run(*backend, job, [&](TrainerOptions& o) {
        o.inject_overflow_at_step = inject_at, o.inject_overflow_rank = r;
      });
      std::vector<double> losses, scales;
      int bad = run_checked(*run.trainer, iterations, losses, scales, [&](int i) { return i == inject_at - 1; });
      if (run.trainer->loss_scaler().state() != LossScalerState{32768, iterations - inject_at, 1, 0}) bad++;
      int bad_all = 0;
      MPI_Allreduce(&bad, &bad_all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
      bad_all += differs_over_ranks(scales);
      const double w = worst_loss_diff(losses, ref);
      const bool ok = bad_all == 0 && w <= 1e-5;
      failures += dist_test::report(ok, fmt::format("np{} {:<36} fp16, only rank {} overflows at step {}: skipped on "
                                                    "every rank, state unchanged; loss rel diff {:.2e}, mismatches {}",
                                                    world, cfg.name(), r, inject_at, w, bad_all), rank);
    }
    // b. 2^40 overflows every rank's fp16 backward until the scale fits.
    Job big = job;
    big.train.loss_scale.initial = std::ldexp(1.0, 40);
    dist_test::DistRun run = dist_test::make_run(*backend, big);
    std::vector<double> losses, scales;
    int bad = run_checked(*run.trainer, 30, losses, scales, nullptr);
    const int64_t skipped = run.trainer->loss_scaler().state().skipped_steps;
    if (skipped < 3 || run.trainer->step() + skipped != 30) bad++;
    int bad_all = 0;
    MPI_Allreduce(&bad, &bad_all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    bad_all += differs_over_ranks(scales) + differs_over_ranks(losses);
    failures += dist_test::report(bad_all == 0, fmt::format("np{} {:<36} fp16 from 2^40: {} steps skipped alike on "
                                                            "every rank, final scale {}, mismatches {}", world,
                                                            cfg.name(), skipped, run.trainer->loss_scaler().scale(),
                                                            bad_all), rank);
  }
  if (rank == 0) std::printf("%d failures\n", failures);
  MPI_Finalize();
  return failures == 0 && !configs.empty() ? 0 : 1;
}
