#include "optim/mixed.hpp"

#include "core/check.hpp"

namespace exatrain {

MixedOrder::MixedOrder(Backend& backend, std::unique_ptr<Optimizer> matrix, std::unique_ptr<Optimizer> first_order,
                       int64_t first_order_steps)
    : Optimizer(backend), matrix_(std::move(matrix)), first_(std::move(first_order)),
      first_order_steps_(first_order_steps), name_(std::string(matrix_->name()) + "+" + first_->name()) {
  EXA_CHECK(matrix_->state_names().empty(), "mixed optimizer: {} keeps per-element state; a matrix optimizer keeps "
            "entry states only", matrix_->name());
}

size_t MixedOrder::first_order_states(const ParamInfo& p) const {
  return first_order_takes(p) ? first_->state_names().size() + first_->entry_states(p).size() : 0;
}

std::vector<EntryStateSpec> MixedOrder::entry_states(const ParamInfo& p) const {
  std::vector<EntryStateSpec> specs;
  if (first_order_takes(p)) {
    const std::string prefix = std::string(first_->name()) + "_";
    for (const std::string& s : first_->state_names()) specs.push_back({prefix + s, p.shard_shape});
    for (EntryStateSpec s : first_->entry_states(p)) specs.push_back({prefix + s.name, s.shape});
  }
  if (is_matrix(p))
    for (const EntryStateSpec& s : matrix_->entry_states(p)) specs.push_back(s);
  return specs;
}

bool MixedOrder::holds_entry_state(const ParamInfo& p, size_t spec) const {
  const size_t k = first_order_states(p);
  return spec < k || matrix_->holds_entry_state(p, spec - k);
}

int MixedOrder::entry_state_saver(const ParamInfo& p, size_t spec) const {
  const size_t k = first_order_states(p);
  return spec < k ? -1 : matrix_->entry_state_saver(p, spec - k);
}

// After the switch, the matrix optimizer's work across its entries (the matrices, with its own
// entry states and step count).
void MixedOrder::prepare_step(const std::vector<EntryPart>& parts, const OptimStep& ctx) {
  if (ctx.step <= first_order_steps_) return;
  std::vector<EntryPart> mine;
  for (const EntryPart& e : parts)
    if (is_matrix(e.p)) mine.push_back({e.p, e.first, e.n, e.params, e.grads, nullptr, e.entry_state + first_order_states(e.p)});
  OptimStep own = ctx;
  own.step = ctx.step - first_order_steps_;
  matrix_->prepare_step(mine, own);
}

// The first-order optimizer gets its per-element states as the entry's first entry states (laid
// out like the part: it is the whole entry) and its own entry states after them.
void MixedOrder::update(const EntryPart& e, const OptimStep& ctx) {
  check_whole_entry(name(), e);
  if (is_matrix(e.p) && ctx.step > first_order_steps_) {
    const EntryPart part{e.p, e.first, e.n, e.params, e.grads, nullptr, e.entry_state + first_order_states(e.p)};
    OptimStep own = ctx;
    own.step = ctx.step - first_order_steps_;
    return matrix_->update(part, own);
  }
  const size_t k = first_->state_names().size();
  first_->update({e.p, e.first, e.n, e.params, e.grads, e.entry_state, e.entry_state + k}, ctx);
}

}  // namespace exatrain
