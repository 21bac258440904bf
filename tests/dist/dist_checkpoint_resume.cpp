// Topology-independent checkpoints on 4 ranks: a run saved at tp2 x pp2 (sequence parallel)
// resumes at dp4 (ZeRO 1), and runs saved at dp4 (ZeRO 3, ZeRO 2) resume at tp2 x pp2; in all cases
// the 5 steps after the resume have the losses of an uninterrupted 10-step run (1e-5 relative)
// and end on its weights. Exits non-zero on any mismatch.
#include <mpi.h>
#include <omp.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>

#include <fmt/format.h>

#include "backend/backend.hpp"
#include "dist_common.hpp"
#include "parallel/distributed_trainer.hpp"
#include "parallel/setup.hpp"
#include "train/dist_checkpoint.hpp"

using namespace exatrain;
using namespace exatrain::parallel;
using dist_test::Config;

namespace {

struct Run {
  Job job;
  std::unique_ptr<ParallelRuntime> rt;
  std::unique_ptr<dist_test::SyntheticSource> src;
  std::unique_ptr<DistributedTrainer> trainer;
};

Run make_run(Backend& be, const Config& c, int steps, int world) {
  Run r;
  r.job = dist_test::job_for(c, steps);
  r.rt = std::make_unique<ParallelRuntime>(MPI_COMM_WORLD, runtime_plan_from_job(r.job, world));
  r.src = std::make_unique<dist_test::SyntheticSource>(r.job.model.vocab, r.rt->dp().rank(), r.rt->dp().size());
  DistOptions o;
  o.model = r.job.model;
  o.train = r.job.train;
  r.trainer = std::make_unique<DistributedTrainer>(be, *r.rt, o, *r.src);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  const dist_test::World mpi = dist_test::start_mpi(argc, argv);
  const int world = mpi.size, rank = mpi.rank;
  auto backend = make_cpu_backend(1);
  const int steps = 10, half = 5;
  Config tp_pp;  // global batch 4 = 1 x 4 micro-batches x dp 1
  tp_pp.tp = 2, tp_pp.pp = 2, tp_pp.sp = true;
  Config dp4;    // global batch 4 = 1 x 1 micro-batch x dp 4
  dp4.dp = 4, dp4.micro_batches = 1;
  const dist_test::Reference ref = dist_test::run_single_rank(dist_test::job_for(tp_pp, steps));

  // A directory every rank sees (the checkpoint is written by rank 0, read by all).
  char tmpl[] = "/tmp/exatrain-dist-ckpt-XXXXXX";
  std::string root;
  if (rank == 0) root = mkdtemp(tmpl);
  int len = int(root.size());
  MPI_Bcast(&len, 1, MPI_INT, 0, MPI_COMM_WORLD);
  root.resize(size_t(len));
  MPI_Bcast(root.data(), len, MPI_CHAR, 0, MPI_COMM_WORLD);

  int failures = 0;
  struct Case { Config save, resume; int save_zero, resume_zero; };
  const Case cases[] = {{tp_pp, dp4, 0, 1}, {dp4, tp_pp, 3, 0}, {dp4, tp_pp, 2, 0}};
  int case_index = 0;
  for (Case cs : cases) {
    cs.save.zero = cs.save_zero, cs.resume.zero = cs.resume_zero;
    const std::string dir_root = fmt::format("{}/case{}", root, case_index++);
    std::string saved;
    {
      Run a = make_run(*backend, cs.save, steps, world);
      for (int s = 0; s < half; s++) a.trainer->train_step();
      TrainerExtras ex;
      ex.data_cursor_json = fmt::format("{{\"position\": {}}}", a.src->position());
      saved = save_distributed_checkpoint(*a.trainer, MPI_COMM_WORLD, dir_root, ex, 2);
    }
    int n = int(saved.size());
    MPI_Bcast(&n, 1, MPI_INT, 0, MPI_COMM_WORLD);
    saved.resize(size_t(n));
    MPI_Bcast(saved.data(), n, MPI_CHAR, 0, MPI_COMM_WORLD);

    Run b = make_run(*backend, cs.resume, steps, world);
    TrainerExtras ex = load_distributed_checkpoint(*b.trainer, saved);
    b.src->seek(uint64_t(std::stoull(ex.data_cursor_json.substr(ex.data_cursor_json.find(':') + 1))));
    double worst = 0;
    std::string trace;
    for (int s = half; s < steps; s++) {
      const double loss = b.trainer->train_step().loss;
      worst = std::max(worst, std::abs(loss - ref.losses[size_t(s)]) / ref.losses[size_t(s)]);
      trace += fmt::format(" {:.6f}/{:.6f}", loss, ref.losses[size_t(s)]);
    }
    b.trainer->gather_full_params();
    double w = 0;
    for (int c = 0; c < b.trainer->chunks(); c++) w = std::max(w, dist_test::max_weight_diff(b.trainer->chunk(c), ref));
    double mine[2] = {worst, w}, all[2];
    MPI_Allreduce(mine, all, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    const bool ok = all[0] <= 1e-5 && all[1] <= 1e-4 && b.trainer->step() == steps;
    failures += !ok;
    if (rank == 0)
      std::printf("%s saved at [%s] step %d, resumed at [%s]: steps 6-10 loss rel diff %.2e, weight diff %.2e vs "
                  "an uninterrupted run; losses (resumed/uninterrupted)%s\n",
                  ok ? "OK  " : "FAIL", cs.save.name().c_str(), half, cs.resume.name().c_str(), all[0], all[1],
                  trace.c_str());
    std::fflush(stdout);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) std::filesystem::remove_all(root);
  MPI_Finalize();
  return failures == 0 ? 0 : 1;
}
