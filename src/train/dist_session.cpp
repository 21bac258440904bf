#include "train/dist_session.hpp"
#include "train/state_io.hpp"

#include <mpi.h>
#include <omp.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "backend/backend.hpp"
#include "core/check.hpp"
#include "core/fileio.hpp"
#include "data/loader.hpp"
#include "data/token_source.hpp"
#include "job/parse.hpp"
#include "parallel/distributed_trainer.hpp"
#include "parallel/setup.hpp"
#include "parallel/trace.hpp"
#include "plan/io.hpp"
#include "plan/search.hpp"
#include "checkpoint/checkpoint.hpp"
#include "data/manifest.hpp"
#include "train/dist_checkpoint.hpp"
#include "train/resume_check.hpp"
#include "train/every_rank.hpp"
#include "train/machine_peak.hpp"
#include "report/metrics.hpp"
#include "report/progress.hpp"

namespace exatrain {
namespace {

namespace fs = std::filesystem;

const char* kBreakdownNames[] = {"compute", "tp_comm", "pp_comm", "pp_bubble", "dp_comm", "optimizer"};
constexpr int kBreakdown = 6;

// [parallel] fields left "auto" (or omitted) on several ranks: the planner's best plan for this
// world size on the `local` machine (catalog/clusters/local.toml) fills them, and rank 0 prints
// it. Context parallelism is fixed to 1 (the trainer does not run it). Every rank searches (the
// search is deterministic), so no plan needs to be sent around. dp alone omitted is no search:
// the contract's default, world / (tp * cp * pp), which runtime_plan_from_job infers (and whose
// equation it prints when it does not divide).
void resolve_auto_parallel(Job& job, int world, std::FILE* log) {
  ParallelSpec& p = job.parallel;
  const bool any_auto = !p.tp || !p.pp || !p.cp || !p.vp || !p.zero || !p.micro_batch || !p.recompute ||
                        !p.seq_parallel || !p.schedule;
  if (!any_auto) return;
  // A gpus the user wrote must still be the world size ([parallel] gpus defaults to it here).
  EXA_CHECK(!job.origins.count("parallel.gpus") || p.gpus == world,
            "{}: [parallel] gpus = {} but the job runs on {} MPI ranks", job_origin(job, {"parallel.gpus"}), p.gpus,
            world);
  ParallelSpec fixed = p;
  fixed.gpus = world;
  if (!fixed.cp) fixed.cp = 1;
  const MachineSpec local = parse_job("[machine]\npreset = \"local\"\n", "local machine", {}).machine;
  const plan::SearchResult res = plan::search_plans(job.model, local, fixed, job.train.precision, 200);
  // The best plan this runtime can execute: the planner also models what Megatron can do and we
  // cannot yet (context parallelism, replicated kv heads).
  auto runnable = [&](const plan::Plan& c) { return c.cp == 1 && job.model.kv_heads % c.tp == 0; };
  const plan::Prediction* best = nullptr;
  for (const auto& c : res.top)
    if (runnable(c.plan)) { best = &c; break; }
  if (!best) {
    // Say which equation the fields that are set break: the plan with every unset field at its
    // most permissive value (tp, pp, cp, vp 1, dp = world / (tp pp cp), micro_batch 1, ZeRO 0).
    ParallelSpec probe = fixed;
    for (auto* d : {&probe.tp, &probe.pp, &probe.cp, &probe.vp, &probe.micro_batch, &probe.zero}) if (!*d) *d = 1;
    if (!fixed.zero) probe.zero = 0;
    if (!probe.recompute) probe.recompute = Recompute::none;
    std::string why;
    try {
      why = plan::plan_error(job.model, plan::resolve_plan(probe, job.train.precision));
    } catch (const Error& e) {
      why = e.what();
    }
    EXA_CHECK(why.empty(), "{}: [parallel] the fields that are set cannot make a plan for {} ranks (unset ones at "
              "their smallest values): {}", job_origin(job, {"parallel.tp", "parallel.pp", "parallel.dp", "parallel.cp",
              "parallel.vp", "parallel.micro_batch", "parallel.global_batch", "parallel.layers_per_stage"}), world, why);
  }
  EXA_CHECK(best != nullptr, "{}: [parallel] has \"auto\" fields, and the planner found no plan for {} ranks on "
            "the local machine that this runtime can run with the fields that are set ({} plans searched, {} fit: "
            "`exatrain plan` on the job with --set parallel.gpus={} shows why); set the degrees explicitly",
            job_origin(job, {"parallel.tp", "parallel.pp", "parallel.dp", "parallel.zero", "parallel.micro_batch",
                             "parallel.global_batch"}),
            world, res.searched, res.top.size(), world);
  const plan::Plan& b = best->plan;
  p.layers_per_stage = b.layers_per_stage;
  p.gpus = world;
  p.tp = b.tp, p.pp = b.pp, p.dp = b.dp, p.cp = b.cp, p.vp = b.vp, p.zero = b.zero, p.micro_batch = b.micro_batch;
  p.recompute = b.recompute, p.seq_parallel = b.seq_parallel, p.schedule = b.schedule;
  if (log) {
    fmt::print(log, "[parallel] auto: the planner's best plan for {} ranks on the local machine ({} plans searched): "
               "{} (predicted {:.4g} s per step)\n", world, res.searched, plan::plan_summary(b),
               best->step_time_s);
    std::fflush(log);
  }
}

}  // namespace

bool wants_distributed(const Job& job) {
  if (world_rank_size().second > 1) return true;  // launched on several ranks
  const ParallelSpec& p = job.parallel;
  // Omitted (or "auto") degrees on one rank mean 1: the single-rank trainer.
  auto above_one = [](const std::optional<int64_t>& v) { return v && *v > 1; };
  return p.gpus > 1 || above_one(p.tp) || above_one(p.pp) || above_one(p.dp) || above_one(p.vp) ||
         above_one(p.zero);
}

void finalize_mpi() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (init && !fin) MPI_Finalize();
}

TrainRunResult run_distributed_training(const Job& job_in, const TrainRunOptions& opt) {
  int init = 0;
  MPI_Initialized(&init);
  if (!init) {
    int provided = 0;
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
  }
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  Job job = job_in;
  if (job.train.precision != Precision::fp32)
    throw EveryRankError(fmt::format("{}: [train] precision = \"{}\": the CPU backend trains in \"fp32\" only",
                                     job_origin(job, {"train.precision"}), to_string(job.train.precision)));
  TrainRunResult result;
  result.last_val_loss = std::numeric_limits<double>::quiet_NaN();
  // Rank 0 prepares the bundled corpus once; the others open it after the barrier.
  std::FILE* log = rank == 0 ? opt.out : nullptr;
  if (rank == 0) result.dataset_dir = resolve_dataset(job, log);
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank != 0) {
    std::FILE* devnull = std::fopen("/dev/null", "w");
    EXA_SYSCHECK(devnull != nullptr, "fopen /dev/null");
    result.dataset_dir = resolve_dataset(job, devnull);
    std::fclose(devnull);
  }
  // Probe the vocabulary (the plan's checks need it), then resolve the plan.
  {
    data::LoaderOptions lo;
    lo.seq_len = job.model.seq_len;
    lo.seed = job.train.seed;
    lo.verify_checksums = false;
    data::TokenLoader probe(result.dataset_dir, lo);
    if (job.model.vocab_from_data) job.model.vocab = probe.vocab_size();
  }
  // From here on, until the trainer exists, every check depends on the job alone: same on every rank.
  // [parallel] gpus omitted: the ranks the job was launched on (a gpus the job sets must match).
  if (!job.origins.count("parallel.gpus")) job.parallel.gpus = world;
  const parallel::RuntimePlan plan = on_every_rank([&] {
    resolve_auto_parallel(job, world, rank == 0 ? opt.out : nullptr);
    return parallel::runtime_plan_from_job(job, world);
  });
  if (!job.parallel.dp) job.parallel.dp = plan.mesh.dp;  // inferred: the run's job.toml says which
  parallel::RuntimeOptions ropt;
  ropt.watchdog_timeout_s = job.parallel.watchdog_timeout_s;  // 0: no watchdog thread
  parallel::ParallelRuntime rt(MPI_COMM_WORLD, plan, ropt);
  data::LoaderOptions lo;
  lo.seq_len = job.model.seq_len;
  lo.seed = job.train.seed;
  lo.dp_rank = rt.dp().rank();
  lo.dp_size = rt.dp().size();
  lo.step_windows = job.parallel.global_batch;  // epochs end between steps: the single rank's order
  data::TokenLoader loader(result.dataset_dir, lo);
  LoaderSource source(loader);
  const int threads = job.train.threads > 0 ? int(job.train.threads) : std::max(1, omp_get_num_procs() / world);
  std::unique_ptr<Backend> backend = make_cpu_backend(threads);
  parallel::DistOptions dopt;
  dopt.model = job.model;
  dopt.train = job.train;
  dopt.layers_per_stage = job.parallel.layers_per_stage;
  dopt.skip_nonfinite = job.train.nan_policy == "skip";
  dopt.inject_nan_at_step = opt.inject_nan_at_step;
  std::unique_ptr<parallel::DistributedTrainer> trainer_ptr =
      on_every_rank([&] { return std::make_unique<parallel::DistributedTrainer>(*backend, rt, dopt, source); });
  parallel::DistributedTrainer& trainer = *trainer_ptr;
  // MFU as the single-rank trainer: achieved model FLOP/s per rank (the world's model FLOPs of a
  // step / ranks / seconds) over the measured sgemm peak of `threads` threads (train/machine_peak),
  // measured by rank 0 alone while the others wait (cached per CPU model and thread count).
  double world_flops = 0;
  {
    const double mine = trainer.local_flops_per_step();
    MPI_Allreduce(&mine, &world_flops, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  }
  const double peak_gflops = rank == 0 ? cached_sgemm_peak_gflops(*backend, threads) : 0.0;
  MPI_Barrier(MPI_COMM_WORLD);
  // Validation batch i as the single-rank run numbers it: a loader without the dp split (the
  // trainer's evaluate() hands the batches out over the replicas itself).
  data::LoaderOptions vo = lo;
  vo.dp_rank = 0, vo.dp_size = 1, vo.verify_checksums = false;
  const data::TokenLoader val_loader(result.dataset_dir, vo);
  auto val_batch = [&](int64_t i, int32_t* tokens, int32_t* targets) {
    val_loader.val_batch(i, tokens, targets, plan.micro_batch);
  };

  // Resume: rank 0 picks the checkpoint (newest complete one for "auto"), every rank loads its
  // slices of it: the checkpoint may come from any topology (train/dist_checkpoint.hpp).
  const std::string ckpt_root = job.train.run_dir + "/checkpoints";
  const bool resuming = !opt.resume.empty() && opt.resume != "none";
  // Rank 0 verifies the checkpoint's checksums (resolve_resume); its verdict, the directory or the
  // error, goes to every rank, so a bad checkpoint ends every rank with rank 0's message.
  std::string resume_dir;
  on_rank0_for_all(MPI_COMM_WORLD, rt.watchdog(), "MPI_Bcast (resume verdict)", [&] {
    if (auto ref = checkpoint::resolve_resume(opt.resume, ckpt_root, opt.out)) resume_dir = ref->dir;
  });
  broadcast_from_rank0(resume_dir, MPI_COMM_WORLD, rt.watchdog(), "MPI_Bcast (resume directory)");
  TrainerExtras extras;
  extras.job_toml = job_to_toml(job);
  extras.tokenizer_type = loader.manifest().tokenizer_type;
  extras.tokenizer_model = data::read_dataset_tokenizer_model(result.dataset_dir);  // checksum checked
  if (!resume_dir.empty()) {
    // Rank 0's resolve_resume verified the checksums; the others check sizes only.
    on_every_rank([&] { check_same_model(checkpoint::CheckpointReader(resume_dir, checkpoint::Verify::sizes), job.model); });
    const TrainerExtras saved = load_distributed_checkpoint(trainer, MPI_COMM_WORLD, resume_dir, true);
    on_every_rank([&] { restore_trainer_state(resume_dir, trainer.step(), saved, job, loader); });
    if (rank == 0) fmt::print(opt.out, "resumed from {} (step {})\n", resume_dir, trainer.step());
  }
  result.first_step = trainer.step();

  std::unique_ptr<report::MetricsWriter> metrics;
  std::unique_ptr<report::Progress> progress;
  // Rank 0 writes the trace after step 3: find out now, not after training started, that it cannot.
  if (!opt.trace.empty())
    on_rank0_for_all(MPI_COMM_WORLD, rt.watchdog(), "MPI_Bcast (trace path verdict)",
                     [&] { parallel::check_trace_writable(opt.trace); });
  on_rank0_for_all(MPI_COMM_WORLD, rt.watchdog(), "MPI_Bcast (run_dir verdict)", [&] {
    EXA_CHECK(resuming || !fs::exists(job.train.run_dir + "/metrics.jsonl"),
              "{}: [train] run_dir = \"{}\" already holds a run (metrics.jsonl); expected a new directory: pass "
              "--resume auto to continue it, or --set train.run_dir=OTHER", job_origin(job, {"train.run_dir"}),
              job.train.run_dir);
    make_directories(job.train.run_dir, fmt::format("{}: [train] run_dir", job_origin(job, {"train.run_dir"})));
  });
  if (rank == 0) {
    write_file_atomic(job.train.run_dir + "/job.toml", extras.job_toml);
    if (resuming) report::drop_metrics_after(job.train.run_dir + "/metrics.jsonl", result.first_step);
    metrics = std::make_unique<report::MetricsWriter>(job.train.run_dir + "/metrics.jsonl");
    progress = std::make_unique<report::Progress>(job.train.steps, opt.out, opt.interactive);
    const parallel::MeshShape& s = plan.mesh;
    fmt::print(opt.out, "training on {} MPI ranks (tp {}{} x pp {} (vp {}, {}) x dp {}, zero {}, recompute {}) x {} "
               "thread(s): {} params on rank 0, {} steps of {} x {} tokens ({} micro-batch(es) of {} per pipeline)\n",
               world, s.tp, plan.seq_parallel ? " +sp" : "", s.pp, plan.pipeline.vp,
               parallel::to_string(plan.pipeline.schedule), s.dp, plan.zero, to_string(plan.recompute), threads,
               trainer.params_on_rank(), job.train.steps, job.parallel.global_batch, job.model.seq_len,
               plan.micro_batches, plan.micro_batch);
    std::fflush(opt.out);
  }
  // Optional trace of the first steps of this run (every rank's timeline, one file by rank 0).
  std::vector<parallel::TraceEvent> events;
  const int64_t trace_steps = std::min<int64_t>(3, job.train.steps - trainer.step());
  if (!opt.trace.empty()) {
    MPI_Barrier(MPI_COMM_WORLD);
    trainer.trace_into(&events, MPI_Wtime());
  }
  int64_t steps_this_run = 0, consecutive_skips = 0;
  std::string last_checkpoint;  // on every rank (the messages above name it)
  while (trainer.step() < job.train.steps) {
    const parallel::DistStepMetrics m = trainer.train_step();
    if (!opt.trace.empty() && m.step - result.first_step == trace_steps) {
      trainer.trace_into(nullptr, 0);
      parallel::write_chrome_trace(MPI_COMM_WORLD, events, opt.trace);
      if (rank == 0) progress->note(fmt::format("trace of steps {}-{} of every rank: {} (ui.perfetto.dev)",
                                                result.first_step + 1, m.step, opt.trace));
    }
    if (m.skipped) {  // every rank skipped the same step (the loss and the norm are global)
      ++result.skipped_steps;
      if (rank == 0)
        progress->note(fmt::format("step {}: non-finite loss ({}) or gradient norm ({}); update skipped "
                                   "(train.nan_policy = \"skip\")", trainer.step() + 1, m.loss, m.grad_norm));
      if (++consecutive_skips >= 10)
        throw EveryRankError(fmt::format("train: 10 consecutive steps had a non-finite loss; stopping (the last "
                                         "checkpoint is {})", last_checkpoint.empty() ? "none" : last_checkpoint));
      continue;
    }
    if (m.nonfinite)  // every rank stops here, with the same message
      throw EveryRankError(fmt::format("train: step {}: the loss is {} and the gradient norm {} (non-finite); "
                                       "stopped before the update (train.nan_policy = \"stop\"; \"skip\" skips such "
                                       "steps). Last checkpoint: {}", m.step + 1, m.loss, m.grad_norm,
                                       last_checkpoint.empty() ? "none" : last_checkpoint));
    consecutive_skips = 0;
    ++steps_this_run;
    const double mfu = peak_gflops > 0 ? world_flops / double(world) / m.seconds / 1e9 / peak_gflops : 0.0;
    double mine[kBreakdown];
    for (int k = 0; k < kBreakdown; k++) {
      auto it = m.breakdown_s.find(kBreakdownNames[k]);
      mine[k] = it == m.breakdown_s.end() ? 0.0 : it->second;
    }
    std::vector<double> all(size_t(kBreakdown * world));
    {
      parallel::WatchdogScope watch(rt.watchdog(), "world", m.step, "MPI_Gather (time breakdown)");
      MPI_Gather(mine, kBreakdown, MPI_DOUBLE, all.data(), kBreakdown, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    }
    result.last_loss = m.loss;
    if (rank == 0) {
      nlohmann::json per_rank = nlohmann::json::array();
      for (int r = 0; r < world; r++) {
        nlohmann::json b;
        for (int k = 0; k < kBreakdown; k++) b[kBreakdownNames[k]] = all[size_t(r * kBreakdown + k)];
        per_rank.push_back(b);
      }
      metrics->write({{"step", m.step}, {"loss", m.loss}, {"grad_norm", m.grad_norm}, {"lr", m.lr},
                      {"tokens_per_s", m.tokens_per_s}, {"mfu", mfu}, {"seconds", m.seconds}, {"ranks", world},
                      {"breakdown_s_per_rank", per_rank}});
      if (m.step % job.train.log_every == 0 || m.step == job.train.steps)
        progress->update({m.step, m.loss, m.lr, m.grad_norm, m.tokens_per_s, mfu, m.seconds});
    }
    const bool last = m.step == job.train.steps || steps_this_run == opt.stop_after_steps;
    if ((job.train.eval_every > 0 && m.step % job.train.eval_every == 0) || last) {
      result.last_val_loss = trainer.evaluate(job.train.eval_batches, val_batch);
      if (rank == 0) {
        metrics->write({{"step", m.step}, {"val_loss", result.last_val_loss}});
        progress->note(fmt::format("step {}: val_loss {:.4f}", m.step, result.last_val_loss));
      }
    }
    if ((job.train.checkpoint_every > 0 && m.step % job.train.checkpoint_every == 0) || last) {
      extras.data_cursor_json = loader.cursor_json();  // the global position: the same on every rank
      const std::string dir = save_distributed_checkpoint(trainer, MPI_COMM_WORLD, ckpt_root, extras,
                                                          job.train.keep_checkpoints);
      last_checkpoint = dir;  // rank 0's name, on every rank (the stop messages name it)
      broadcast_from_rank0(last_checkpoint, MPI_COMM_WORLD, rt.watchdog(), "MPI_Bcast (checkpoint name)");
      if (rank == 0) {
        result.last_checkpoint = dir;
        progress->note(fmt::format("checkpoint saved: {}", dir));
      }
    }
    if (last) break;
  }
  if (rank == 0) {
    progress->finish();
    result.run_dir = job.train.run_dir;
  }
  result.final_step = trainer.step();
  return result;
}

}  // namespace exatrain
