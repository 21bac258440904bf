#include "train/session.hpp"

#include <mpi.h>
#include <omp.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "backend/backend.hpp"
#include "checkpoint/checkpoint.hpp"
#include "core/check.hpp"
#include "core/fileio.hpp"
#include "core/paths.hpp"
#include "data/loader.hpp"
#include "data/manifest.hpp"
#include "data/prepare.hpp"
#include "data/token_source.hpp"
#include "job/parse.hpp"
#include "parallel/grad_sync.hpp"
#include "parallel/runtime.hpp"
#include "parallel/schedule.hpp"
#include "parallel/trace.hpp"
#include "plan/resolve.hpp"
#include "report/metrics.hpp"
#include "report/progress.hpp"
#include "train/checkpoint_io.hpp"
#include "train/every_rank.hpp"
#include "train/machine_peak.hpp"
#include "train/resume_check.hpp"
#include "train/state_io.hpp"
#include "train/trainer.hpp"

namespace exatrain {
namespace {

namespace fs = std::filesystem;

const char* kBreakdownNames[] = {"compute", "tp_comm", "pp_comm", "pp_bubble", "dp_comm", "optimizer"};
constexpr int kBreakdown = 6;

}  // namespace

std::pair<int, int> init_mpi() {
  int init = 0;
  MPI_Initialized(&init);
  if (!init) {
    int provided = 0;
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
    EXA_CHECK(provided >= MPI_THREAD_FUNNELED, "MPI provides thread level {}, the runtime needs FUNNELED ({})",
              provided, MPI_THREAD_FUNNELED);
  }
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return {world, rank};
}

namespace {

data::LoaderOptions loader_options(const Job& job) {
  data::LoaderOptions lo;
  lo.seq_len = job.model.seq_len;
  lo.seed = job.train.seed;
  lo.step_windows = job.parallel.global_batch;  // epochs end between steps: the order of any topology
  return lo;
}

// One training run on this rank. Members in construction order: data, plan, runtime, trainer.
class Session {
 public:
  Session(const Job& job, const TrainRunOptions& opt, int world, int rank)
      : job_(job), opt_(opt), world_(world), rank_(rank), log_(rank == 0 ? opt.out : nullptr) {}
  TrainRunResult run();

 private:
  void prepare_data();
  void build();
  void resume();
  void open_outputs();
  void loop();
  bool handle_nonfinite(const StepMetrics& m);
  void handle_overflow(const StepMetrics& m);
  void write_metrics(const StepMetrics& m);
  void evaluate(int64_t step);
  void checkpoint();

  Job job_;
  const TrainRunOptions& opt_;
  int world_, rank_;
  std::FILE* log_;  // rank 0's log (null elsewhere)
  TrainRunResult result_;
  plan::Plan plan_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<parallel::ParallelRuntime> rt_;
  std::unique_ptr<data::TokenLoader> loader_, val_loader_;
  std::unique_ptr<LoaderSource> source_;
  std::unique_ptr<Trainer> trainer_;
  TrainerExtras extras_;
  double world_flops_ = 0, peak_gflops_ = 0;
  int threads_ = 1;
  std::unique_ptr<report::MetricsWriter> metrics_;
  std::unique_ptr<report::Progress> progress_;
  std::string ckpt_root_;
  int64_t steps_this_run_ = 0, consecutive_skips_ = 0, consecutive_overflows_ = 0;
  int64_t fallbacks_seen_ = 0;  // optimizer_fallbacks (all ranks) at the last metrics line
};

// Rank 0 prepares the bundled corpus once; the others open it after the barrier. The model's
// vocabulary may come from the dataset's tokenizer.
void Session::prepare_data() {
  if (rank_ == 0) result_.dataset_dir = resolve_dataset(job_, log_);
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank_ != 0) {
    std::FILE* devnull = std::fopen("/dev/null", "w");
    EXA_SYSCHECK(devnull != nullptr, "fopen /dev/null");
    result_.dataset_dir = resolve_dataset(job_, devnull);
    std::fclose(devnull);
  }
  data::LoaderOptions probe_options = loader_options(job_);
  probe_options.verify_checksums = false;
  const data::TokenLoader probe(result_.dataset_dir, probe_options);
  const int64_t data_vocab = probe.vocab_size();
  if (job_.model.vocab_from_data) job_.model.vocab = data_vocab;
  EXA_CHECK(job_.model.vocab >= data_vocab,
            "{}: [model] vocab = {} is smaller than the vocabulary of the dataset's tokenizer ({}, in {}): "
            "token ids would fall outside the embedding; expected vocab >= {} (or omit it)",
            job_origin(job_, {"model.vocab"}), job_.model.vocab, data_vocab, result_.dataset_dir, data_vocab);
}

// The plan (resolved once), the runtime, this replica's loader, the backend and the trainer.
void Session::build() {
  plan_ = on_every_rank([&] { return plan::resolve_training_plan(job_, world_, log_); });
  threads_ = job_.train.threads > 0 ? int(job_.train.threads) : std::max(1, omp_get_num_procs() / world_);
  // [train] device / backend (job.hpp): "auto" is resolved here, where the GPUs are visible.
  backend_ = on_every_rank([&] { return make_backend(resolved_backend(job_.train, visible_cuda_devices()), threads_); });
  parallel::RuntimeOptions ropt;
  ropt.watchdog_timeout_s = job_.parallel.watchdog_timeout_s;  // 0: no watchdog thread
  const parallel::MeshShape shape{int(plan_.tp), int(plan_.cp), int(plan_.dp), int(plan_.pp)};
  rt_ = std::make_unique<parallel::ParallelRuntime>(MPI_COMM_WORLD, shape, *backend_, ropt);
  data::LoaderOptions lo = loader_options(job_);
  lo.dp_rank = rt_->dp().rank();
  lo.dp_size = rt_->dp().size();
  loader_ = std::make_unique<data::TokenLoader>(result_.dataset_dir, lo);
  EXA_CHECK(loader_->train_windows() >= uint64_t(plan_.micro_batch),
            "dataset {} has {} training sequences of {} tokens, fewer than one micro-batch ({})", result_.dataset_dir,
            loader_->train_windows(), job_.model.seq_len, plan_.micro_batch);
  // Validation batch i as one rank numbers it: a loader without the dp split (the trainer's
  // evaluate() hands the batches out over the replicas itself).
  lo.dp_rank = 0, lo.dp_size = 1, lo.verify_checksums = false;
  val_loader_ = std::make_unique<data::TokenLoader>(result_.dataset_dir, lo);
  source_ = std::make_unique<LoaderSource>(*loader_);
  TrainerOptions to = trainer_options(job_, plan_);
  to.inject_nan_at_step = opt_.inject_nan_at_step;
  trainer_ = on_every_rank([&] { return std::make_unique<Trainer>(*backend_, *rt_, to, *source_); });
  // MFU: achieved model FLOP/s per rank (the world's model FLOPs of a step / ranks / seconds) over
  // the measured sgemm peak of `threads` threads (train/machine_peak), measured by rank 0 alone
  // while the others wait (cached per CPU model and thread count).
  world_flops_ = rt_->world().sum(trainer_->local_flops_per_step());
  double peak[1] = {rank_ == 0 ? cached_sgemm_peak_gflops(*backend_, threads_) : 0.0};
  rt_->world().broadcast(peak, 1, parallel::DType::f64, 0);
  peak_gflops_ = peak[0];
  trainer_->set_peak_gflops(peak_gflops_);
  extras_.job_toml = job_to_toml(job_);
  extras_.tokenizer_type = loader_->manifest().tokenizer_type;
  extras_.tokenizer_model = data::read_dataset_tokenizer_model(result_.dataset_dir);  // checksum checked
}

// Rank 0 picks the checkpoint (newest complete one for "auto") and verifies its checksums; its
// verdict, the directory or the error, goes to every rank, which loads its slices of it: the
// checkpoint may come from any topology (train/checkpoint_io.hpp).
void Session::resume() {
  ckpt_root_ = job_.train.run_dir + "/checkpoints";
  std::string dir;
  on_rank0_for_all(MPI_COMM_WORLD, rt_->watchdog(), "MPI_Bcast (resume verdict)", [&] {
    if (auto ref = checkpoint::resolve_resume(opt_.resume, ckpt_root_, opt_.out)) dir = ref->dir;
  });
  broadcast_from_rank0(dir, MPI_COMM_WORLD, rt_->watchdog(), "MPI_Bcast (resume directory)");
  if (!dir.empty()) {
    // Rank 0's resolve_resume verified the checksums; the others check sizes only.
    on_every_rank([&] { check_same_model(checkpoint::CheckpointReader(dir, checkpoint::Verify::sizes), job_.model); });
    const TrainerExtras saved = load_checkpoint(*trainer_, MPI_COMM_WORLD, dir, true);
    // The step, the cursor and the counters against this job and dataset (train/resume_check.hpp).
    on_every_rank([&] { restore_trainer_state(dir, trainer_->step(), saved, job_, *loader_); });
    // fp16: the loss scaler continues where it was (an fp32/bf16 checkpoint has none: it starts
    // afresh; a non-fp16 run ignores a saved one, its masters being fp32 either way).
    if (saved.loss_scaler)
      on_every_rank([&] { trainer_->loss_scaler().restore(*saved.loss_scaler, dir + "/trainer_state.json"); });
    if (log_) fmt::print(log_, "resumed from {} (step {})\n", dir, trainer_->step());
    // The compressors' state (error-feedback residuals, DGC's velocity, PowerSGD's Q, temporal
    // index sets) is per rank and not checkpointed: it restarts empty, so the resumed run departs
    // from the uninterrupted one from the step after (docs/checkpoints.md, docs/compression.md).
    if (log_ && job_.train.comm.active())
      fmt::print(log_, "note: [comm] compressor = \"{}\": its state (error-feedback residuals, DGC velocity, "
                 "PowerSGD's Q, reused index sets) is not in checkpoints and restarts empty; this run continues "
                 "close to, not exactly as, the uninterrupted one\n", job_.train.comm.compressor);
  }
  result_.first_step = trainer_->step();
}

// A fresh run never mixes its metrics and checkpoints with an earlier run's.
void Session::open_outputs() {
  const bool resuming = !opt_.resume.empty() && opt_.resume != "none";
  // Rank 0 writes the trace after step 3: find out now, not after training started, that it cannot.
  if (!opt_.trace.empty())
    on_rank0_for_all(MPI_COMM_WORLD, rt_->watchdog(), "MPI_Bcast (trace path verdict)",
                     [&] { parallel::check_trace_writable(opt_.trace); });
  on_rank0_for_all(MPI_COMM_WORLD, rt_->watchdog(), "MPI_Bcast (run_dir verdict)", [&] {
    EXA_CHECK(resuming || !fs::exists(job_.train.run_dir + "/metrics.jsonl"),
              "{}: [train] run_dir = \"{}\" already holds a run (metrics.jsonl); expected a new directory: pass "
              "--resume auto to continue it, or --set train.run_dir=OTHER", job_origin(job_, {"train.run_dir"}),
              job_.train.run_dir);
  });
  if (rank_ != 0) return;
  write_file_atomic(job_.train.run_dir + "/job.toml", extras_.job_toml);
  if (resuming) report::drop_metrics_after(job_.train.run_dir + "/metrics.jsonl", result_.first_step);
  metrics_ = std::make_unique<report::MetricsWriter>(job_.train.run_dir + "/metrics.jsonl");
  progress_ = std::make_unique<report::Progress>(job_.train.steps, opt_.out, opt_.interactive);
  const parallel::PipelinePlan pipe = parallel::pipeline_plan(plan_);
  const int zero_run = parallel::zero_run(int(plan_.zero), int(plan_.dp * plan_.cp));
  const std::string zero = zero_run == int(plan_.zero) ? std::to_string(plan_.zero)
                                                       : fmt::format("{} (runs as 0: one replica)", plan_.zero);
  fmt::print(opt_.out, "training on {} MPI rank{} (tp {}{} x pp {} (vp {}, {}) x dp {}, zero {}, recompute {}) x {} "
             "thread(s), backend {}: {} params on rank 0 ({} layers, hidden {}, vocab {}), {} steps of {} x {} tokens "
             "({} micro-batch(es) of {} per pipeline), data {}\n",
             world_, world_ == 1 ? "" : "s", plan_.tp, plan_.seq_parallel ? " +sp" : "", plan_.pp, plan_.vp,
             parallel::to_string(pipe.schedule), plan_.dp, zero, to_string(plan_.recompute), threads_,
             backend_->name(), trainer_->params_on_rank(), job_.model.layers, job_.model.hidden, job_.model.vocab,
             job_.train.steps, job_.parallel.global_batch, job_.model.seq_len, plan_.micro_batches(),
             plan_.micro_batch, result_.dataset_dir);
  if (const std::optional<Half> h = half_format(plan_.precision)) {
    fmt::print(opt_.out, "precision {}: 16-bit weight copy and activations (residual stream {}), fp32 master weights, "
               "gradients and optimizer state; GEMMs: {}{}{}\n", to_string(plan_.precision),
               plan_.residual_fp32 ? "fp32" : "16-bit", backend_->gemm_half_path(*h),
               plan_.tp > 1 ? (plan_.tp_comm_fp32 ? "; tp messages fp32" : "; tp messages 16-bit") : "",
               plan_.pp > 1 ? (plan_.pipeline_fp32 ? "; pipeline messages fp32" : "; pipeline messages 16-bit") : "");
  }
  // Settings of the job without effect on this plan, as `predict` and `check` say them.
  for (const std::string& note : plan::plan_notes(job_, plan_)) fmt::print(opt_.out, "note: {}\n", note);
  // What the job plans that this trainer runs otherwise (`report` predicts the run as it ran).
  for (const std::string& line : plan::framework_not_run_here(job_, plan_, /*set_only=*/true))
    fmt::print(opt_.out, "note: [parallel] {} (`exatrain report` predicts this run as this trainer runs it)\n", line);
  if (trainer_->loss_scaler().enabled()) {
    const LossScaleSpec& ls = job_.train.loss_scale;
    if (ls.dynamic)
      fmt::print(opt_.out, "loss scaling: dynamic, scale {} (x{} on each overflow once {} since the last growth "
                 "have been seen, x{} after {} good steps, at least {}); overflowing steps are skipped\n",
                 trainer_->loss_scaler().scale(), ls.backoff, ls.hysteresis, ls.growth_factor, ls.growth_interval,
                 ls.min_scale);
    else
      fmt::print(opt_.out, "loss scaling: fixed, scale {}; overflowing steps are skipped\n", ls.initial);
  }
  std::fflush(opt_.out);
}

// The NaN policy. Every rank skips or stops at the same step (the loss and the norm are global),
// with the same message. Returns true when the step was skipped.
bool Session::handle_nonfinite(const StepMetrics& m) {
  const std::string last = result_.last_checkpoint.empty() ? "none" : result_.last_checkpoint;
  if (m.overflow) {
    handle_overflow(m);
    return true;
  }
  consecutive_overflows_ = 0;
  if (m.skipped) {
    ++result_.skipped_steps;
    if (progress_)
      progress_->note(fmt::format("step {}: non-finite loss ({}) or gradient norm ({}); update skipped "
                                  "(train.nan_policy = \"skip\")", trainer_->step() + 1, m.loss, m.grad_norm));
    if (++consecutive_skips_ >= 10)
      throw EveryRankError(fmt::format("train: 10 consecutive steps had a non-finite loss; stopping (the last "
                                       "checkpoint is {})", last));
    return true;
  }
  if (m.nonfinite)
    throw EveryRankError(fmt::format("train: step {}: the loss is {} and the gradient norm {} (non-finite); stopped "
                                     "before the update (train.nan_policy = \"stop\"; \"skip\" skips such steps). "
                                     "Last checkpoint: {}", m.step + 1, m.loss, m.grad_norm, last));
  consecutive_skips_ = 0;
  return false;
}

// An fp16 overflow (the trainer skipped the step and backed the scale off): its metrics line
// (step = the update it attempted, which the next line repeats; no "loss", so readers of steps
// pass over it; drop_metrics_after drops it with that step on a resume), a note. A fixed scale
// overflowing 10 steps in a row would never stop skipping: stopped (a dynamic one stops at
// min_loss_scale).
void Session::handle_overflow(const StepMetrics& m) {
  const LossScaler& sc = trainer_->loss_scaler();
  result_.overflow_skipped_steps = m.skipped_steps;
  if (metrics_)
    metrics_->write({{"step", m.step + 1}, {"skipped", true}, {"loss_scale", m.loss_scale},
                     {"skipped_steps", m.skipped_steps}, {"seconds", m.seconds}});
  if (progress_)
    progress_->note(fmt::format("step {}: fp16 gradients overflowed (inf/NaN) at loss scale {}; update skipped, loss "
                                "scale now {} ({} skipped so far)", m.step + 1, m.loss_scale, sc.scale(),
                                m.skipped_steps));
  if (!job_.train.loss_scale.dynamic && ++consecutive_overflows_ >= 10)
    throw EveryRankError(fmt::format("{}: [train] loss_scale = {}: 10 consecutive steps overflowed fp16 at this fixed "
                                     "scale; stopped at step {} (expected a smaller loss_scale, or loss_scale = "
                                     "\"dynamic\")", job_origin(job_, {"train.loss_scale"}),
                                     job_.train.loss_scale.initial, m.step + 1));
}

// One metrics.jsonl line (rank 0): the step's numbers, MFU over the world, every rank's breakdown
// and its resident and peak resident bytes (one gather for all), rank 0's bytes sent by kind.
void Session::write_metrics(const StepMetrics& m) {
  const double mfu = peak_gflops_ > 0 ? world_flops_ / double(world_) / m.seconds / 1e9 / peak_gflops_ : 0.0;
  constexpr int kPerRank = kBreakdown + 3;
  double mine[kPerRank];
  for (int k = 0; k < kBreakdown; k++) {
    auto it = m.breakdown_s.find(kBreakdownNames[k]);
    mine[k] = it == m.breakdown_s.end() ? 0.0 : it->second;
  }
  mine[kBreakdown] = double(resident_bytes()), mine[kBreakdown + 1] = double(peak_rss_bytes());
  mine[kBreakdown + 2] = double(m.optimizer_fallbacks);
  std::vector<double> all(size_t(kPerRank * world_));
  rt_->world().gather(mine, all.data(), kPerRank, parallel::DType::f64, 0);
  if (rank_ != 0) return;
  nlohmann::json per_rank = nlohmann::json::array(), rss = per_rank, peak = per_rank;
  int64_t fallbacks = 0;  // summed over the ranks: each counts the preconditioners it computes
  for (int r = 0; r < world_; r++) {
    fallbacks += int64_t(all[size_t(r * kPerRank + kBreakdown + 2)]);
    nlohmann::json b;
    for (int k = 0; k < kBreakdown; k++) b[kBreakdownNames[k]] = all[size_t(r * kPerRank + k)];
    per_rank.push_back(b);
    rss.push_back(int64_t(all[size_t(r * kPerRank + kBreakdown)]));
    peak.push_back(int64_t(all[size_t(r * kPerRank + kBreakdown + 1)]));
  }
  StepMetrics line = m;
  line.mfu = mfu;
  nlohmann::json j = nlohmann::json::parse(metrics_json(line));
  j["ranks"] = world_;
  j["breakdown_s_per_rank"] = per_rank;
  j["rss_bytes_per_rank"] = rss;
  j["peak_rss_bytes_per_rank"] = peak;
  j["bytes_sent"] = m.bytes;  // rank 0's byte ledger for the step (parallel/comm.hpp's convention)
  std::map<std::string, int64_t> by_group;  // the same per group: "dp", "tp", "pp", "cp"
  for (const auto& [kind, bytes] : m.bytes) by_group[kind.substr(0, kind.find('_'))] += bytes;
  j["bytes_sent_by_group"] = by_group;
  if (!m.compression.empty()) j["compression"] = m.compression;  // rank 0's compressor figures (docs/compression.md)
  j["optimizer_fallbacks"] = fallbacks;
  if (fallbacks > fallbacks_seen_)
    progress_->note(fmt::format("step {}: warning: {} preconditioner computation(s) failed (a failed eigendecomposition "
                                "or a non-finite root); the previous ones were kept ({} in this run so far, "
                                "metrics.jsonl optimizer_fallbacks)", m.step, fallbacks - fallbacks_seen_, fallbacks));
  fallbacks_seen_ = fallbacks;
  metrics_->write(j);
  if (m.step % job_.train.log_every == 0 || m.step == job_.train.steps)
    progress_->update({m.step, m.loss, m.lr, m.grad_norm, m.tokens_per_s, mfu, m.seconds});
}

void Session::evaluate(int64_t step) {
  auto val_batch = [&](int64_t i, int32_t* tokens, int32_t* targets) {
    val_loader_->val_batch(i, tokens, targets, plan_.micro_batch);
  };
  result_.last_val_loss = trainer_->evaluate(job_.train.eval_batches, val_batch);
  if (rank_ != 0) return;
  metrics_->write({{"step", step}, {"val_loss", result_.last_val_loss}});
  progress_->note(fmt::format("step {}: val_loss {:.4f}", step, result_.last_val_loss));
}

void Session::checkpoint() {
  extras_.data_cursor_json = loader_->cursor_json();  // the global position: the same on every rank
  if (trainer_->loss_scaler().enabled()) extras_.loss_scaler = trainer_->loss_scaler().state();
  std::string dir = save_checkpoint(*trainer_, MPI_COMM_WORLD, ckpt_root_, extras_, job_.train.keep_checkpoints);
  broadcast_from_rank0(dir, MPI_COMM_WORLD, rt_->watchdog(), "MPI_Bcast (checkpoint name)");
  result_.last_checkpoint = dir;  // rank 0's name, on every rank (the stop messages name it)
  if (progress_) progress_->note(fmt::format("checkpoint saved: {}", dir));
}

void Session::loop() {
  // Optional trace of the first steps of this run (every rank's timeline, one file by rank 0).
  std::vector<parallel::TraceEvent> events;
  const int64_t trace_steps = std::min<int64_t>(3, job_.train.steps - trainer_->step());
  bool tracing = !opt_.trace.empty();  // until written: an fp16 step skipped after the window keeps m.step
  if (tracing) {
    MPI_Barrier(MPI_COMM_WORLD);
    trainer_->trace_into(&events, MPI_Wtime());
  }
  while (trainer_->step() < job_.train.steps) {
    const StepMetrics m = trainer_->train_step();
    if (tracing && m.step - result_.first_step == trace_steps) {
      tracing = false;
      trainer_->trace_into(nullptr, 0);
      parallel::write_chrome_trace(MPI_COMM_WORLD, events, opt_.trace);
      if (progress_) progress_->note(fmt::format("trace of steps {}-{} of every rank: {} (ui.perfetto.dev)",
                                                 result_.first_step + 1, m.step, opt_.trace));
    }
    if (handle_nonfinite(m)) continue;
    ++steps_this_run_;
    result_.last_loss = m.loss;
    write_metrics(m);
    const bool last = m.step == job_.train.steps || steps_this_run_ == opt_.stop_after_steps;
    if ((job_.train.eval_every > 0 && m.step % job_.train.eval_every == 0) || last) evaluate(m.step);
    if ((job_.train.checkpoint_every > 0 && m.step % job_.train.checkpoint_every == 0) || last) checkpoint();
    if (last) break;
  }
}

TrainRunResult Session::run() {
  result_.last_val_loss = std::numeric_limits<double>::quiet_NaN();
  on_every_rank([&] { plan::check_training_job(job_, world_); });  // before any data is prepared
  // Before the data and the model: an unwritable run_dir is reported now, naming the key.
  on_rank0_for_all(MPI_COMM_WORLD, nullptr, "MPI_Bcast (run_dir verdict)", [&] {
    make_directories(job_.train.run_dir, fmt::format("{}: [train] run_dir", job_origin(job_, {"train.run_dir"})));
  });
  prepare_data();
  build();
  resume();
  open_outputs();
  loop();
  if (progress_) progress_->finish();
  if (rank_ == 0) result_.run_dir = job_.train.run_dir;
  result_.final_step = trainer_->step();
  if (trainer_->loss_scaler().enabled()) {
    result_.overflow_skipped_steps = trainer_->loss_scaler().state().skipped_steps;
    result_.loss_scale = trainer_->loss_scaler().scale();
  }
  return result_;
}

}  // namespace

void check_training_job(const Job& job, std::vector<std::string>& errors) {
  plan::training_job_problems(job, world_rank_size().second, errors);
}

std::string resolve_dataset(const Job& job, std::FILE* log) {
  if (!job.train.data.empty()) {
    EXA_CHECK(fs::exists(fs::path(job.train.data) / data::kManifestName),
              "{}: [train] data = \"{}\": expected a directory written by `exatrain data prepare` (no {} there)",
              job_origin(job, {"train.data"}), job.train.data, data::kManifestName);
    return job.train.data;
  }
  const char* cache_env = std::getenv("EXATRAIN_CACHE");
  std::string cache = cache_env && *cache_env ? cache_env : data_root() + "/data-cache";
  data::PrepareOptions po;
  po.inputs = {data::bundled_corpus_path()};
  po.out_dir = fmt::format("{}/kjv-bpe{}", cache, kBundledVocab);
  po.tokenizer = "bpe";
  po.vocab_size = kBundledVocab;
  if (!fs::exists(fs::path(po.out_dir) / data::kManifestName))
    fmt::print(log, "preparing the bundled corpus ({}) into {} (once; cached)\n", po.inputs[0], po.out_dir);
  std::fflush(log);
  bool reused = false;
  data::prepare_if_needed(po, &reused);
  return po.out_dir;
}

TrainRunResult run_training(const Job& job, const TrainRunOptions& opt) {
  const auto [world, rank] = init_mpi();
  Session s(job, opt, world, rank);
  return s.run();
}

void finalize_mpi() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (init && !fin) MPI_Finalize();
}

}  // namespace exatrain
