#include "optim/first_order.hpp"

#include <cmath>

#include "core/check.hpp"

namespace exatrain {

void Sgd::update(const EntryPart& e, const OptimStep& ctx) {
  be_.sgd_update(e.params, e.grads, e.state[0], e.n, ctx.lr, cfg_.momentum, cfg_.nesterov,
                 e.p.decay ? cfg_.weight_decay : 0.0f, ctx.grad_scale);
}

void Lion::update(const EntryPart& e, const OptimStep& ctx) {
  be_.lion_update(e.params, e.grads, e.state[0], e.n, ctx.lr, cfg_.beta1, cfg_.beta2,
                  e.p.decay ? cfg_.weight_decay : 0.0f, ctx.grad_scale);
}

void Lamb::update(const EntryPart& e, const OptimStep& ctx) {
  check_whole_entry("lamb", e);
  const LambStep s{ctx.lr, cfg_.beta1, cfg_.beta2, cfg_.eps, e.p.decay ? cfg_.weight_decay : 0.0f,
                   1.0f - std::pow(cfg_.beta1, float(ctx.step)), 1.0f - std::pow(cfg_.beta2, float(ctx.step)),
                   ctx.grad_scale};
  be_.lamb_update(e.params, e.grads, e.state[0], e.state[1], reserve_scratch(be_, scratch_, e.n, "lamb direction"), e.n, s);
}

std::vector<EntryStateSpec> Adafactor::entry_states(const ParamInfo& p) const {
  std::vector<EntryStateSpec> specs;
  if (factored(p)) specs = {{"exp_avg_sq_row", {p.shard_shape[0]}}, {"exp_avg_sq_col", {p.shard_shape[1]}}};
  else specs = {{"exp_avg_sq", p.shard_shape}};
  if (cfg_.beta1 > 0) specs.push_back({"exp_avg", p.shard_shape});
  return specs;
}

void Adafactor::update(const EntryPart& e, const OptimStep& ctx) {
  check_whole_entry("adafactor", e);
  const bool f = factored(e.p);
  const int64_t rows = f ? e.p.shard_shape[0] : 1, cols = f ? e.p.shard_shape[1] : e.n;
  float* row = f ? e.entry_state[0] : nullptr;
  float* col = f ? e.entry_state[1] : nullptr;
  float* v = f ? nullptr : e.entry_state[0];
  float* m = cfg_.beta1 > 0 ? e.entry_state[f ? 2 : 1] : nullptr;
  const AdafactorStep s{ctx.lr, cfg_.beta1, float(1.0 - std::pow(double(ctx.step), double(cfg_.decay_rate))),
                        cfg_.eps1, cfg_.clip_threshold, e.p.decay ? cfg_.weight_decay : 0.0f, ctx.grad_scale};
  be_.adafactor_update(e.params, e.grads, row, col, v, m, reserve_scratch(be_, scratch_, e.n, "adafactor update"), rows, cols,
                       s);
}

}  // namespace exatrain
