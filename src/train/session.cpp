#include "train/session.hpp"

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
#include "data/token_source.hpp"
#include "data/manifest.hpp"
#include "data/prepare.hpp"
#include "job/parse.hpp"
#include "report/metrics.hpp"
#include "report/progress.hpp"
#include "report/report.hpp"
#include "train/resume_check.hpp"
#include "train/state_io.hpp"
#include "train/trainer.hpp"

namespace exatrain {
namespace {

namespace fs = std::filesystem;

// The bundled corpus (corpus/README.md) is prepared with this vocabulary for the default job.
constexpr uint32_t kBundledVocab = 4096;

void validate_local_job(const Job& job) {
  std::vector<std::string> errors;
  check_single_rank_job(job, errors);
  if (!errors.empty()) {
    std::string msg = fmt::format("{} problem{} in job {}:", errors.size(), errors.size() == 1 ? "" : "s", job.source);
    for (const auto& e : errors) msg += "\n  " + e;
    throw Error(msg);
  }
}

}  // namespace

void check_single_rank_job(const Job& job, std::vector<std::string>& errors) {
  const ParallelSpec& p = job.parallel;
  auto one = [&](const char* key, const std::optional<int64_t>& v) {
    if (v && *v != 1)
      errors.push_back(fmt::format("{}: [parallel] {} = {}: this trainer runs on one rank, so expected 1 "
                                   "(multi-rank training comes with the parallel runtime; `exatrain plan` "
                                   "predicts such plans)", job_origin(job, {std::string("parallel.") + key}), key, *v));
  };
  if (p.gpus != 1)
    errors.push_back(fmt::format("{}: [parallel] gpus = {}: this trainer runs on one rank, so expected 1",
                                 job_origin(job, {"parallel.gpus"}), p.gpus));
  one("tp", p.tp), one("pp", p.pp), one("dp", p.dp), one("cp", p.cp), one("vp", p.vp);
  const int64_t micro_batch = p.micro_batch.value_or(1);
  if (p.global_batch % micro_batch != 0)
    errors.push_back(fmt::format("{}: [parallel] global_batch = {} is not divisible by dp * micro_batch = 1 * {} "
                                 "(micro-batches per step = global_batch / (dp * micro_batch) must be an integer)",
                                 job_origin(job, {"parallel.global_batch", "parallel.micro_batch"}), p.global_batch,
                                 micro_batch));
  if (job.train.precision != Precision::fp32)
    errors.push_back(fmt::format("{}: [train] precision = \"{}\": the CPU backend trains in \"fp32\" only "
                                 "(other precisions are for `predict`/`plan` and the GPU backends)",
                                 job_origin(job, {"train.precision"}), to_string(job.train.precision)));
  if (job.train.steps < 1)
    errors.push_back(fmt::format("{}: [train] steps = {}: expected at least 1", job_origin(job, {"train.steps"}),
                                 job.train.steps));
}

namespace {

double evaluate(Trainer& trainer, const data::TokenLoader& loader, int64_t batches) {
  const int64_t B = trainer.options().micro_batch, T = trainer.options().seq;
  std::vector<int32_t> tokens(static_cast<size_t>(B * T)), targets(static_cast<size_t>(B * T));
  double sum = 0;
  for (int64_t i = 0; i < batches; ++i) {
    loader.val_batch(i, tokens.data(), targets.data(), B);
    sum += trainer.model().forward(tokens.data(), nullptr, targets.data());
  }
  return sum / double(batches);
}


}  // namespace

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

TrainRunResult run_training(const Job& job_in, const TrainRunOptions& opt) {
  Job job = job_in;
  validate_local_job(job);
  // Before the data and the model: an unwritable run_dir is reported now, naming the key.
  make_directories(job.train.run_dir, fmt::format("{}: [train] run_dir", job_origin(job, {"train.run_dir"})));
  TrainRunResult result;
  result.last_val_loss = std::numeric_limits<double>::quiet_NaN();
  result.run_dir = job.train.run_dir;
  result.dataset_dir = resolve_dataset(job, opt.out);

  // Data first: the model's vocabulary may come from the tokenizer.
  data::LoaderOptions lo;
  lo.seq_len = job.model.seq_len;
  lo.seed = job.train.seed;
  lo.step_windows = job.parallel.global_batch;  // epochs end between steps: the order of any topology
  data::TokenLoader loader(result.dataset_dir, lo);
  const int64_t data_vocab = loader.vocab_size();
  if (job.model.vocab_from_data) job.model.vocab = data_vocab;
  EXA_CHECK(job.model.vocab >= data_vocab,
            "{}: [model] vocab = {} is smaller than the vocabulary of the dataset's tokenizer ({}, in {}): "
            "token ids would fall outside the embedding; expected vocab >= {} (or omit it)",
            job_origin(job, {"model.vocab"}), job.model.vocab, data_vocab, result.dataset_dir, data_vocab);
  TrainerOptions to = trainer_options_from_job(job);
  to.skip_nonfinite = job.train.nan_policy == "skip";
  to.inject_nan_at_step = opt.inject_nan_at_step;
  EXA_CHECK(loader.train_windows() >= uint64_t(to.micro_batch),
            "dataset {} has {} training sequences of {} tokens, fewer than one micro-batch ({})",
            result.dataset_dir, loader.train_windows(), job.model.seq_len, to.micro_batch);

  const int threads = job.train.threads > 0 ? int(job.train.threads) : omp_get_num_procs();
  std::unique_ptr<Backend> backend_owner = make_cpu_backend(threads);
  Backend& backend = *backend_owner;
  LoaderSource source(loader);
  Trainer trainer(backend, to, source);

  // The tokenizer travels with every checkpoint (so `sample` needs only the checkpoint).
  TrainerExtras extras{"", job_to_toml(job), loader.manifest().tokenizer_type,
                       data::read_dataset_tokenizer_model(result.dataset_dir)};

  const std::string ckpt_root = job.train.run_dir + "/checkpoints";
  const bool resuming = !opt.resume.empty() && opt.resume != "none";
  // A fresh run never mixes its metrics and checkpoints with an earlier run's.
  EXA_CHECK(resuming || !fs::exists(job.train.run_dir + "/metrics.jsonl"),
            "{}: [train] run_dir = \"{}\" already holds a run (metrics.jsonl); expected a new directory: pass "
            "--resume auto to continue it, or --set train.run_dir=OTHER", job_origin(job, {"train.run_dir"}),
            job.train.run_dir);
  if (auto ref = checkpoint::resolve_resume(opt.resume, ckpt_root, opt.out)) {
    checkpoint::CheckpointReader reader(ref->dir);
    check_same_model(reader, job.model);
    TrainerExtras saved = load_trainer_state(reader, backend, trainer);
    restore_trainer_state(ref->dir, trainer.step(), saved, job, loader);
    fmt::print(opt.out, "resumed from {} (step {})\n", ref->dir, trainer.step());
  }
  result.first_step = trainer.step();
  if (resuming) report::drop_metrics_after(job.train.run_dir + "/metrics.jsonl", result.first_step);
  write_file_atomic(job.train.run_dir + "/job.toml", extras.job_toml);

  report::MetricsWriter metrics(job.train.run_dir + "/metrics.jsonl");
  report::Progress progress(job.train.steps, opt.out, opt.interactive);
  fmt::print(opt.out, "training {} params ({} layers, hidden {}, vocab {}) on {} thread(s): {} steps of {} x {} "
                      "tokens ({} micro-batch(es) of {}), data {}\n",
             trainer.model().num_params(), job.model.layers, job.model.hidden, job.model.vocab, threads,
             job.train.steps, job.parallel.global_batch, job.model.seq_len, to.grad_accum, to.micro_batch,
             result.dataset_dir);

  auto save = [&] {
    extras.data_cursor_json = loader.cursor_json();
    checkpoint::CheckpointWriter w(ckpt_root, trainer.step());
    add_trainer_state(w, backend, trainer, extras);
    result.last_checkpoint = w.commit(job.train.keep_checkpoints);
    progress.note(fmt::format("checkpoint saved: {}", result.last_checkpoint));
  };

  int64_t steps_this_run = 0, consecutive_skips = 0;
  while (trainer.step() < job.train.steps) {
    StepMetrics m = trainer.train_step();
    if (m.skipped) {
      ++result.skipped_steps;
      progress.note(fmt::format("step {}: non-finite loss ({}) or gradient norm ({}); update skipped "
                                "(train.nan_policy = \"skip\")", trainer.step() + 1, m.loss, m.grad_norm));
      EXA_CHECK(++consecutive_skips < 10, "train: 10 consecutive steps had a non-finite loss; stopping "
                                         "(the last checkpoint is {})",
                result.last_checkpoint.empty() ? "none" : result.last_checkpoint);
      continue;
    }
    if (!std::isfinite(m.loss) || !std::isfinite(m.grad_norm))
      EXA_FAIL("train: step {}: the loss is {} and the gradient norm {} (non-finite); stopped before the "
               "update (train.nan_policy = \"stop\"; \"skip\" skips such steps). Last checkpoint: {}",
               m.step + 1, m.loss, m.grad_norm, result.last_checkpoint.empty() ? "none" : result.last_checkpoint);
    consecutive_skips = 0;
    ++steps_this_run;
    result.last_loss = m.loss;
    metrics.write(nlohmann::json::parse(metrics_json(m)));
    if (m.step % job.train.log_every == 0 || m.step == job.train.steps)
      progress.update({m.step, m.loss, m.lr, m.grad_norm, m.tokens_per_s, m.mfu, m.seconds});
    const bool last = m.step == job.train.steps || steps_this_run == opt.stop_after_steps;
    if ((job.train.eval_every > 0 && m.step % job.train.eval_every == 0) || last) {
      result.last_val_loss = evaluate(trainer, loader, job.train.eval_batches);
      metrics.write({{"step", m.step}, {"val_loss", result.last_val_loss}});
      progress.note(fmt::format("step {}: val_loss {:.4f}", m.step, result.last_val_loss));
    }
    if ((job.train.checkpoint_every > 0 && m.step % job.train.checkpoint_every == 0) || last) save();
    if (last) break;
  }
  progress.finish();
  result.final_step = trainer.step();
  return result;
}

}  // namespace exatrain
