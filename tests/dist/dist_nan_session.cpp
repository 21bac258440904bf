// train.nan_policy through the `exatrain train` session on several ranks
// (run_training with TrainRunOptions::inject_nan_at_step = 3, 4 steps, a checkpoint
// every 2): "stop" ends every rank with the single-rank message (step, loss, policy, the last
// checkpoint); "skip" skips step 3 on every rank and still reaches step 4, with finite losses in
// metrics.jsonl for steps 1-4. Usage (from dist_train_cli.sh, in its work directory):
//   mpirun -np 2 dist_nan_session JOB.toml stop|skip
#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <string>

#include "core/check.hpp"
#include "job/parse.hpp"
#include "report/metrics.hpp"
#include "train/session.hpp"

using namespace exatrain;

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const std::string policy = argc > 2 ? argv[2] : "";
  const Job job = load_job(argv[1], {"train.run_dir=nan_" + policy, "train.nan_policy=" + policy,
                                     "train.eval_every=0", "train.checkpoint_every=2", "train.steps=4"});
  TrainRunOptions o;
  o.interactive = 0;
  o.inject_nan_at_step = 3;
  std::FILE* devnull = std::fopen("/dev/null", "w");
  o.out = devnull;
  int ok = 0;
  std::string what;
  try {
    const TrainRunResult r = run_training(job, o);
    what = "finished at step " + std::to_string(r.final_step) + ", skipped " + std::to_string(r.skipped_steps);
    ok = policy == "skip" && r.final_step == 4 && r.skipped_steps == 1;
    if (ok && rank == 0) {  // one record per applied step, all finite
      int n = 0;
      for (const auto& rec : report::read_metrics(job.train.run_dir + "/metrics.jsonl"))
        if (rec.contains("loss")) n += std::isfinite(rec["loss"].get<double>()) ? 1 : 100;
      ok = n == 4;
      what += ", finite loss records " + std::to_string(n);
    }
  } catch (const Error& e) {
    what = e.what();
    ok = policy == "stop" &&
         what.find("train: step 3: the loss is nan") != std::string::npos &&
         what.find("(train.nan_policy = \"stop\"; \"skip\" skips such steps). Last checkpoint: "
                   "nan_stop/checkpoints/step_00000002") != std::string::npos;
  }
  int all_ok = 0;
  MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  std::printf("%s rank %d nan_policy %s: %s\n", ok ? "OK  " : "FAIL", rank, policy.c_str(), what.c_str());
  std::fflush(stdout);
  std::fclose(devnull);
  MPI_Finalize();
  return all_ok ? 0 : 1;
}
