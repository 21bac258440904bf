// AdamW over the flat parameter arena. Moments m and v are arenas with the model's layout
// offsets, so ZeRO-1 sharding is a sub-range and checkpointing is a copy of two arenas + step.
#pragma once
#include <cstdint>

#include "backend/backend.hpp"
#include "model/layout.hpp"

namespace exatrain {

struct AdamWConfig {
  float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.1f;
};

class AdamW {
 public:
  AdamW(Backend& backend, const ParamLayout& layout, AdamWConfig config);
  ~AdamW();
  AdamW(const AdamW&) = delete;
  AdamW& operator=(const AdamW&) = delete;

  // One update of every parameter: step() += 1, bias corrections use the new step. grad_scale
  // multiplies the gradients first (global-norm clipping). Weight decay applies only to the
  // parameters whose layout entry has decay = true.
  void update(float* params, const float* grads, float lr, float grad_scale);

  // Checkpoint view: m and v arenas [layout.total()] (device memory) and the step counter.
  float* m() { return m_; }
  float* v() { return v_; }
  int64_t step() const { return step_; }
  void set_step(int64_t s) { step_ = s; }
  int64_t state_bytes() const { return 2 * int64_t(sizeof(float)) * layout_.total(); }

 private:
  Backend& be_;
  const ParamLayout& layout_;
  AdamWConfig cfg_;
  float* m_ = nullptr;
  float* v_ = nullptr;
  int64_t step_ = 0;
};

// Learning rate at optimizer step `step` (0-based): linear warm-up from lr/warmup to lr over
// `warmup` steps, then cosine decay from lr to min_lr at step `total`.
double lr_at(int64_t step, double lr, double min_lr, int64_t warmup, int64_t total);

}  // namespace exatrain
