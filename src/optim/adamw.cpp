#include "optim/adamw.hpp"

#include <cmath>

namespace exatrain {

AdamW::AdamW(Backend& backend, const ParamLayout& layout, AdamWConfig config)
    : be_(backend), layout_(layout), cfg_(config) {
  m_ = be_.alloc(layout_.total());
  v_ = be_.alloc(layout_.total());
}

AdamW::~AdamW() {
  be_.free_bytes(m_);
  be_.free_bytes(v_);
}

void AdamW::update(float* params, const float* grads, float lr, float grad_scale) {
  step_ += 1;
  const float bc1 = 1.0f - std::pow(cfg_.beta1, float(step_));
  const float bc2 = 1.0f - std::pow(cfg_.beta2, float(step_));
  for (const ParamInfo& p : layout_.entries()) {
    const int64_t o = p.offset;
    be_.adamw_update(params + o, grads + o, m_ + o, v_ + o, p.numel, lr, cfg_.beta1, cfg_.beta2,
                     cfg_.eps, p.decay ? cfg_.weight_decay : 0.0f, bc1, bc2, grad_scale);
  }
}

double lr_at(int64_t step, double lr, double min_lr, int64_t warmup, int64_t total) {
  if (warmup > 0 && step < warmup) return lr * double(step + 1) / double(warmup);
  if (total <= warmup) return lr;
  const double progress = std::min(1.0, double(step - warmup) / double(total - warmup));
  return min_lr + 0.5 * (lr - min_lr) * (1.0 + std::cos(M_PI * progress));
}

}  // namespace exatrain
