#include "train/loss_scaler.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "core/check.hpp"

namespace exatrain {

LossScaler::LossScaler(const LossScaleSpec& spec) : spec_(spec), enabled_(true) {
  EXA_CHECK(spec.initial > 0 && spec.initial <= kMaxLossScale && spec.backoff > 0 && spec.backoff < 1 &&
                spec.growth_factor > 1 && spec.growth_interval >= 1 && spec.min_scale > 0 && spec.hysteresis >= 1,
            "loss scaler: initial {} (expected (0, 2^64]), backoff {} (expected (0, 1)), growth factor {} (expected "
            "> 1), growth interval {} (expected >= 1), min scale {} (expected > 0), hysteresis {} (expected >= 1)",
            spec.initial, spec.backoff, spec.growth_factor, spec.growth_interval, spec.min_scale, spec.hysteresis);
  st_.scale = spec.initial;
  st_.hysteresis_left = spec.hysteresis;
}

bool LossScaler::update(bool found_inf) {
  if (!enabled_) return false;
  if (found_inf) {
    // A fixed scale never backs off or grows: its hysteresis stays whole.
    const int64_t left = spec_.dynamic ? std::max<int64_t>(0, st_.hysteresis_left - 1) : st_.hysteresis_left;
    if (spec_.dynamic && left == 0) {
      const double next = st_.scale * spec_.backoff;
      EXA_CHECK(next >= spec_.min_scale,
                "fp16 loss scaling: the gradients overflowed (inf or NaN) at loss scale {}, and backing off to {} "
                "would go below [train] min_loss_scale = {}: they are non-finite at any allowed scale (a diverged "
                "run? expected a lower lr, grad_clip, or precision = \"bf16\"); {} step(s) were skipped so far",
                st_.scale, next, spec_.min_scale, st_.skipped_steps + 1);
      st_.scale = next;
    }
    st_.hysteresis_left = left;
    st_.good_steps = 0;
    st_.skipped_steps++;
    return true;
  }
  if (spec_.dynamic && ++st_.good_steps >= spec_.growth_interval) {
    // Capped at kMaxLossScale (job/job.hpp): the backward's factor stays a finite float.
    st_.scale = std::min(kMaxLossScale, st_.scale * spec_.growth_factor);
    st_.good_steps = 0;
    st_.hysteresis_left = spec_.hysteresis;
  }
  return false;
}

void LossScaler::restore(const LossScalerState& saved, const std::string& where) {
  if (!enabled_) return;
  if (spec_.dynamic) {
    EXA_CHECK(std::isfinite(saved.scale) && saved.scale >= spec_.min_scale && saved.scale <= kMaxLossScale,
              "{}: loss scale {}: expected a number in [{}, 2^64] ([train] min_loss_scale = {} of this job)", where,
              saved.scale, spec_.min_scale, spec_.min_scale);
    st_.scale = saved.scale;
  }
  st_.good_steps = saved.good_steps;
  st_.skipped_steps = saved.skipped_steps;
  st_.hysteresis_left = saved.hysteresis_left == kHysteresisNotSaved
                            ? spec_.hysteresis
                            : std::min(saved.hysteresis_left, spec_.hysteresis);
}

}  // namespace exatrain
