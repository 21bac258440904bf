#include "optim/optimizer.hpp"

#include <algorithm>
#include <cmath>

#include "core/check.hpp"

namespace exatrain {

void Optimizer::init_state(const std::vector<ParamRegion>& regions) {
  EXA_CHECK(state_.empty(), "optimizer {}: init_state called twice", name());
  const std::vector<std::string> names = state_names();
  for (const ParamRegion& r : regions) {
    std::vector<DeviceBuffer> bufs;
    for (const std::string& s : names) {
      bufs.emplace_back(be_, r.size(), ("optimizer state " + s).c_str());
      if (!bufs.back().empty()) be_.zero(bufs.back().data(), sizeof(float) * size_t(r.size()));
    }
    state_.push_back(std::move(bufs));
  }
}

float* Optimizer::state(size_t region, size_t s) const { return state_.at(region).at(s).data(); }

int64_t Optimizer::state_bytes() const {
  int64_t b = 0;
  for (const auto& bufs : state_)
    for (const DeviceBuffer& d : bufs) b += int64_t(sizeof(float)) * d.size();
  return b;
}

// Every region entry by entry: the part of each layout entry inside it, in arena order.
void Optimizer::step(const std::vector<ParamRegion>& regions, const OptimStep& ctx) {
  EXA_CHECK(regions.size() == state_.size(), "optimizer {}: {} regions, state for {}", name(), regions.size(),
            state_.size());
  std::vector<float*> st(state_names().size());
  for (size_t r = 0; r < regions.size(); r++) {
    const ParamRegion& reg = regions[r];
    const std::vector<ParamInfo>& entries = reg.layout->entries();
    auto it = std::partition_point(entries.begin(), entries.end(),
                                   [&](const ParamInfo& p) { return p.offset + p.numel <= reg.begin; });
    for (; it != entries.end() && it->offset < reg.end; ++it) {
      const int64_t lo = std::max(reg.begin, it->offset), hi = std::min(reg.end, it->offset + it->numel);
      if (lo >= hi) continue;
      const int64_t k = lo - reg.begin;  // position in the region
      for (size_t s = 0; s < st.size(); s++) st[s] = state_[r][s].data() + k;
      update(*it, lo - it->offset, hi - lo, reg.params + k, reg.grads + k, st.data(), ctx);
    }
  }
}

void AdamW::update(const ParamInfo& p, int64_t, int64_t n, float* params, const float* grads, float* const* state,
                   const OptimStep& ctx) {
  const float bc1 = 1.0f - std::pow(cfg_.beta1, float(ctx.step));
  const float bc2 = 1.0f - std::pow(cfg_.beta2, float(ctx.step));
  be_.adamw_update(params, grads, state[0], state[1], n, ctx.lr, cfg_.beta1, cfg_.beta2, cfg_.eps,
                   p.decay ? cfg_.weight_decay : 0.0f, bc1, bc2, ctx.grad_scale);
}

std::unique_ptr<Optimizer> make_optimizer(Backend& backend, const TrainSpec& t) {
  EXA_CHECK(t.optimizer == "adamw", "train.optimizer = \"{}\": only \"adamw\" is implemented", t.optimizer);
  return std::make_unique<AdamW>(backend, AdamWConfig{float(t.beta1), float(t.beta2), float(t.eps),
                                                      float(t.weight_decay)});
}

double lr_at(int64_t step, double lr, double min_lr, int64_t warmup, int64_t total) {
  if (warmup > 0 && step < warmup) return lr * double(step + 1) / double(warmup);
  if (total <= warmup) return lr;
  const double progress = std::min(1.0, double(step - warmup) / double(total - warmup));
  return min_lr + 0.5 * (lr - min_lr) * (1.0 + std::cos(M_PI * progress));
}

}  // namespace exatrain
