// The single-process training loop: micro-batches from a TokenSource, gradient accumulation,
// global-norm clipping, warm-up + cosine learning rate, AdamW, per-step metrics.
// The CLI `train` command (and later the parallel runtime) drives it through train_step().
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "backend/backend.hpp"
#include "job/job.hpp"
#include "model/gpt.hpp"
#include "optim/adamw.hpp"
#include "data/token_source.hpp"

namespace exatrain {

struct TrainerOptions {
  ModelSpec model;
  TrainSpec train;             // lr, min_lr, warmup_steps, steps, seed, betas, eps, wd, clip
  int64_t micro_batch = 1;     // sequences per forward/backward
  int64_t grad_accum = 1;      // micro-batches per optimizer step
  int64_t seq = 0;             // tokens per sequence (0 = model.seq_len)
  Recompute recompute = Recompute::none;
  double peak_gflops = 0;      // for MFU; 0 = measure (cached) on first use
  bool skip_nonfinite = false; // non-finite loss or grad norm: skip the update (else return it
                               // un-applied: the caller stops, see train.nan_policy)
  int64_t inject_nan_at_step = -1;  // test hook: step (1-based) whose loss reads as NaN
};

struct StepMetrics {
  int64_t step = 0;            // 1-based optimizer step just completed
  double loss = 0;             // mean over the step's micro-batches
  double grad_norm = 0;        // global L2 norm before clipping
  double lr = 0;
  double seconds = 0;
  double tokens_per_s = 0;
  double gflops = 0;           // achieved model GFLOP/s
  double mfu = 0;              // gflops / measured sgemm peak
  int64_t peak_rss_bytes = 0;
  int64_t accounted_bytes = 0; // params + grads + optimizer state + activations
  bool skipped = false;        // non-finite: no update was applied (step not advanced)
};

// Trainer options from a validated job for a single-process run: micro_batch from
// [parallel] (default 1), grad_accum = global_batch / micro_batch (must divide), recompute
// (default none), seq = model.seq_len. Throws Error naming the key when they do not fit.
TrainerOptions trainer_options_from_job(const Job& job);

// One metrics.jsonl line (no trailing newline): the contract keys step, loss, grad_norm, lr,
// tokens_per_s, mfu plus seconds, gflops, peak_rss_bytes, accounted_bytes.
std::string metrics_json(const StepMetrics& m);

class Trainer {
 public:
  Trainer(Backend& backend, const TrainerOptions& options, TokenSource& data);
  StepMetrics train_step();

  Gpt& model() { return *model_; }
  AdamW& optimizer() { return *adamw_; }
  int64_t step() const { return adamw_->step(); }
  const TrainerOptions& options() const { return options_; }
  int64_t accounted_bytes() const;

 private:
  Backend& be_;
  TrainerOptions options_;
  TokenSource& data_;
  std::unique_ptr<Gpt> model_;
  std::unique_ptr<AdamW> adamw_;
  std::vector<int32_t> inputs_, targets_;
};

}  // namespace exatrain
