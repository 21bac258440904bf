// The loss scale of fp16 mixed precision ([train] precision = "fp16", docs/precision.md "Loss
// scaling"): how PyTorch's torch.amp.GradScaler and Megatron's DynamicGradScaler keep fp16's
// small gradients (dY below 2^-24 flushes to zero in fp16) representable. The trainer multiplies
// the loss by scale() before backward (the initial dlogits), divides the fp32 gradients by it
// before clipping and the optimizer, and tells update() whether any gradient on any rank was inf
// or NaN:
//   overflow:  the step is skipped (no optimizer update, no optimizer state change), the
//              good-step counter restarts and one overflow of the hysteresis is used up; once
//              none is left the scale is multiplied by backoff (dynamic only), and so on every
//              further overflow until the next growth;
//   good step: the counter grows; at growth_interval consecutive good steps the scale is
//              multiplied by growth_factor (dynamic only), the counter restarts and the
//              hysteresis is whole again.
// As Megatron's DynamicGradScaler.update() (megatron/core/optimizer/grad_scaler.py: growth and
// hysteresis trackers, the latter reset only on growth; DeepSpeed's DynamicLossScaler with its
// default consecutive_hysteresis = false is the same rule); with hysteresis 1 it is
// torch.amp.GradScaler.update(): a backoff on every overflow.
// A backoff below min_scale is an error (DeepSpeed's raise_error_at_min_scale): gradients that
// overflow at the smallest allowed scale are non-finite at any useful scale (a diverged run).
// The state (scale, counter, skipped steps, hysteresis left) is saved in checkpoints (train/state_io.hpp), so a
// resumed run continues bit for bit.
//
// Owns: the loss-scale arithmetic and its state. May use: job/ (LossScaleSpec), core/check.
#pragma once
#include <cstdint>

#include "job/job.hpp"

namespace exatrain {

inline constexpr int64_t kHysteresisNotSaved = -1;

struct LossScalerState {
  double scale = 1;           // the scale the next step's backward uses
  int64_t good_steps = 0;     // consecutive good steps since the last overflow or growth
  int64_t skipped_steps = 0;  // overflowing steps skipped in the whole run (resumes included)
  // Overflows still tolerated before the next backoff: [train] loss_scale_hysteresis after a growth
  // (and at the start), one fewer per overflow down to 0, where every overflow backs off. Megatron
  // lets its tracker go negative; 0 behaves the same and keeps the checkpointed value in range.
  // kHysteresisNotSaved: a checkpoint written before hysteresis existed (restore() fills it in).
  int64_t hysteresis_left = 0;
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
  // and the scale unless the scale is fixed (then the job's fixed scale stays). The hysteresis left
  // is capped at this job's loss_scale_hysteresis (a resume may lower it), and is this job's whole
  // hysteresis for a checkpoint that did not save it (kHysteresisNotSaved). Error when a
  // dynamic scale lies outside [min_scale, kMaxLossScale]: `where` names the checkpoint file.
  void restore(const LossScalerState& saved, const std::string& where);

 private:
  LossScaleSpec spec_;
  bool enabled_ = false;
  LossScalerState st_;
};

}  // namespace exatrain
