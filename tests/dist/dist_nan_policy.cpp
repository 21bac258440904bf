// train.nan_policy on many ranks: a step whose loss reads as NaN (TrainerOptions::inject_nan_at_step)
//   skip: is skipped on every rank, and the run continues with the next batch exactly as the
//         single-rank Trainer with skip_nonfinite does (the same losses, 1e-5 relative, the same
//         steps skipped);
//   stop: comes back un-applied on every rank (nonfinite, not skipped, the step count unchanged),
//         so `exatrain train` stops everywhere with the same message.
// Run as `mpirun -np N dist_nan_policy`; exits non-zero on any mismatch.
#include <mpi.h>
#include <omp.h>

#include <cmath>
#include <cstdio>

#include "backend/backend.hpp"
#include "dist_common.hpp"
#include "train/trainer.hpp"

using namespace exatrain;
using namespace exatrain::parallel;
using dist_test::Config;

int main(int argc, char** argv) {
  const dist_test::World mpi = dist_test::start_mpi(argc, argv);
  const int world = mpi.size, rank = mpi.rank;
  std::vector<Config> configs;
  auto c = [&](int dp, int tp, int pp, int zero, bool untied) {
    Config x;
    x.dp = dp, x.tp = tp, x.pp = pp, x.zero = zero, x.untied = untied;
    if (dp * tp * pp == world) configs.push_back(x);
  };
  c(2, 1, 1, 3, false), c(1, 2, 1, 0, false), c(1, 1, 2, 1, false);
  c(2, 2, 1, 2, false), c(2, 1, 2, 3, true), c(1, 2, 2, 0, false);
  const int steps = 6, nan_step = 3;
  auto backend = make_cpu_backend(1);
  int failures = 0;
  for (const Config& cfg : configs) {
    const Job job = dist_test::job_for(cfg, steps);
    const dist_test::Reference ref = dist_test::run_single_rank(job, nan_step, true);
    for (bool skip : {true, false}) {
      dist_test::DistRun run = dist_test::make_run(*backend, job, [&](TrainerOptions& o) {
        o.skip_nonfinite = skip;
        o.inject_nan_at_step = nan_step;
      });
      Trainer& trainer = *run.trainer;
      double worst = 0;
      int bad = 0;  // wrong flags or step count on this rank
      for (int s = 0; s < steps; s++) {
        const StepMetrics m = trainer.train_step();
        const bool expect_nan = s == nan_step - 1;
        if (m.nonfinite != expect_nan) bad++;
        if (expect_nan) {
          if (m.skipped != skip || trainer.step() != nan_step - 1) bad++;
          if (!skip) break;  // "stop": the caller stops here
        } else {
          // +inf (a failure) where either loss is NaN: the step expected here is a finite one.
          worst = dist_test::worst_of(worst, dist_test::rel_diff(m.loss, ref.losses[size_t(s)]));
        }
      }
      if (skip && trainer.step() != steps - 1) bad++;  // one step of `steps` was skipped
      double w = 0;
      int bad_all = 0;
      MPI_Allreduce(&worst, &w, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      MPI_Allreduce(&bad, &bad_all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
      const bool ok = bad_all == 0 && w <= 1e-5;
      failures += !ok;
      if (rank == 0)
        std::printf("%s np%d %-50s nan_policy %s at step %d: loss rel diff %.2e, flag/step mismatches %d\n",
                    ok ? "OK  " : "FAIL", world, cfg.name().c_str(), skip ? "skip" : "stop", nan_step, w, bad_all);
      std::fflush(stdout);
    }
  }
  if (rank == 0) std::printf("%d failures\n", failures);
  MPI_Finalize();
  return failures == 0 && !configs.empty() ? 0 : 1;
}
