#include "train/trainer.hpp"

#include <omp.h>

#include <cmath>

#include <nlohmann/json.hpp>

#include "core/check.hpp"
#include "train/machine_peak.hpp"

namespace exatrain {

Trainer::Trainer(Backend& backend, const TrainerOptions& options, TokenSource& data)
    : be_(backend), options_(options), data_(data) {
  EXA_CHECK(options_.grad_accum >= 1, "train: gradient accumulation must be >= 1, got {}",
            options_.grad_accum);
  EXA_CHECK(options_.train.optimizer == "adamw",
            "train.optimizer = \"{}\": only \"adamw\" is implemented", options_.train.optimizer);
  GptOptions g;
  g.model = options_.model;
  g.micro_batch = options_.micro_batch;
  g.seq = options_.seq;
  g.recompute = options_.recompute;
  model_ = std::make_unique<Gpt>(be_, g);
  model_->init_weights(options_.train.seed);
  options_.seq = model_->options().seq;
  AdamWConfig ac;
  ac.beta1 = float(options_.train.beta1);
  ac.beta2 = float(options_.train.beta2);
  ac.eps = float(options_.train.eps);
  ac.weight_decay = float(options_.train.weight_decay);
  adamw_ = std::make_unique<AdamW>(be_, model_->layout(), ac);
  const size_t n = size_t(options_.micro_batch * options_.seq);
  inputs_.resize(n);
  targets_.resize(n);
}

TrainerOptions trainer_options_from_job(const Job& job) {
  TrainerOptions o;
  o.model = job.model;
  o.train = job.train;
  const ParallelSpec& p = job.parallel;
  o.micro_batch = p.micro_batch.value_or(1);
  EXA_CHECK(o.micro_batch >= 1, "{}: parallel.micro_batch = {} must be >= 1", job.source,
            o.micro_batch);
  EXA_CHECK(p.global_batch % o.micro_batch == 0,
            "{}: parallel.global_batch = {} is not a multiple of parallel.micro_batch = {}",
            job.source, p.global_batch, o.micro_batch);
  o.grad_accum = p.global_batch / o.micro_batch;
  o.recompute = p.recompute.value_or(Recompute::none);
  o.seq = job.model.seq_len;
  return o;
}

std::string metrics_json(const StepMetrics& m) {
  nlohmann::json j = {{"step", m.step},
                      {"loss", m.loss},
                      {"grad_norm", m.grad_norm},
                      {"lr", m.lr},
                      {"tokens_per_s", m.tokens_per_s},
                      {"mfu", m.mfu},
                      {"seconds", m.seconds},
                      {"gflops", m.gflops},
                      {"peak_rss_bytes", m.peak_rss_bytes},
                      {"accounted_bytes", m.accounted_bytes}};
  return j.dump();
}

int64_t Trainer::accounted_bytes() const {
  const ModelMemory m = model_->memory();
  return m.params + m.grads + m.activations + adamw_->state_bytes();
}

StepMetrics Trainer::train_step() {
  const TrainSpec& ts = options_.train;
  const double t0 = omp_get_wtime();
  model_->zero_grad();
  double loss_sum = 0;
  for (int64_t micro = 0; micro < options_.grad_accum; micro++) {
    data_.next_batch(options_.micro_batch, options_.seq, inputs_.data(), targets_.data());
    loss_sum += model_->forward(inputs_.data(), nullptr, targets_.data());
    model_->backward(nullptr, 1.0f / float(options_.grad_accum));
  }
  StepMetrics s;
  s.loss = loss_sum / double(options_.grad_accum);
  s.grad_norm = std::sqrt(be_.sum_squares(model_->grads(), model_->num_params()));
  if (options_.inject_nan_at_step == adamw_->step() + 1) {
    s.loss = std::nan("");
    options_.inject_nan_at_step = -1;  // once: a skipped step is retried with the next batch
  }
  // A non-finite loss or gradient must never reach the weights: the update is not applied, and
  // the caller skips the step or stops (train.nan_policy).
  if (!std::isfinite(s.loss) || !std::isfinite(s.grad_norm)) {
    s.skipped = options_.skip_nonfinite;
    s.step = adamw_->step();
    s.seconds = omp_get_wtime() - t0;
    return s;
  }
  double clip_scale = 1.0;  // as torch.nn.utils.clip_grad_norm_
  if (ts.grad_clip > 0) clip_scale = std::min(1.0, ts.grad_clip / (s.grad_norm + 1e-6));
  s.lr = lr_at(adamw_->step(), ts.lr, ts.min_lr, ts.warmup_steps, ts.steps);
  adamw_->update(model_->params(), model_->grads(), float(s.lr), float(clip_scale));
  s.step = adamw_->step();
  s.seconds = omp_get_wtime() - t0;
  const double tokens = double(options_.micro_batch * options_.seq * options_.grad_accum);
  s.tokens_per_s = tokens / s.seconds;
  s.gflops = model_->flops_per_step() * double(options_.grad_accum) / s.seconds / 1e9;
  if (options_.peak_gflops <= 0) {
    int threads = omp_get_max_threads();
    options_.peak_gflops = cached_sgemm_peak_gflops(be_, threads);
  }
  s.mfu = s.gflops / options_.peak_gflops;
  s.peak_rss_bytes = peak_rss_bytes();
  s.accounted_bytes = accounted_bytes();
  return s;
}

}  // namespace exatrain
