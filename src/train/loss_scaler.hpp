// The loss scale of fp16 mixed precision ([train] precision = "fp16", docs/precision.md "Loss
// scaling"): how PyTorch's torch.amp.GradScaler and Megatron's DynamicGradScaler keep fp16's
// small gradients (dY below 2^-24 flushes to zero in fp16) representable. The trainer multiplies
// the loss by scale() before backward (the initial dlogits), divides the fp32 gradients by it
// before clipping and the optimizer, and tells update() whether any gradient on any rank was inf
// or NaN:
//   overflow:  the step is skipped (no optimizer update, no optimizer state change), the scale
//              is multiplied by backoff (dynamic only) and the good-step counter restarts;
//   good step: the counter grows; at growth_interval consecutive good steps the scale is
//              multiplied by growth_factor (dynamic only) and the counter restarts.
// As GradScaler.update() (growth tracker, backoff on any inf) without Megatron's hysteresis (it
// backs off only after `hysteresis` overflows, default 2): every overflow backs off here.
// A backoff below min_scale is an error (DeepSpeed's raise_error_at_min_scale): gradients that
// overflow at the smallest allowed scale are non-finite at any useful scale (a diverged run).
// The state (scale, counter, skipped steps) is saved in checkpoints (train/state_io.hpp), so a
// resumed run continues bit for bit.
//
// Owns: the loss-scale arithmetic and its state. May use: job/ (LossScaleSpec), core/check.
#pragma once
#include <cstdint>

#include "job/job.hpp"

namespace exatrain {

struct LossScalerState {
  double scale = 1;           // the scale the next step's backward uses
  int64_t good_steps = 0;     // consecutive good steps since the last overflow or growth
  int64_t skipped_steps = 0;  // overflowing steps skipped in the whole run (resumes included)
  bool operator==(const LossScalerState&) const = default;
};

class LossScaler {
 public:
  LossScaler() = default;  // no loss scaling (fp32, bf16): scale 1, nothing ever skipped
  explicit LossScaler(const LossScaleSpec& spec);

  bool enabled() const { return enabled_; }
  double scale() const { return st_.scale; }
  const LossScalerState& state() const { return st_; }

  // The outcome of the step whose backward used scale(): found_inf = some gradient element on some
  // rank is inf or NaN (the caller's global check). Returns true when the step must be skipped.
  // Throws Error (naming [train] min_loss_scale) when the backoff would go below min_scale; the
  // state is then unchanged.
  bool update(bool found_inf);

  // A checkpoint's state (train/resume_check.cpp has parsed and range-checked it): the counters,
  // and the scale unless the scale is fixed (then the job's fixed scale stays). Error when a
  // dynamic scale lies outside [min_scale, kMaxLossScale]: `where` names the checkpoint file.
  void restore(const LossScalerState& saved, const std::string& where);

 private:
  LossScaleSpec spec_;
  bool enabled_ = false;
  LossScalerState st_;
};

}  // namespace exatrain
