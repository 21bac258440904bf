// A mixed-order optimizer: a matrix optimizer (Muon, Shampoo, SOAP, K-FAC) on the layers' 2-D matrices
// (ParamRole::matrix) and a first-order one (AdamW, LAMB, SGD, Lion, Adafactor) on every other
// entry (embeddings, head, norms, biases), optionally after `first_order_steps` steps in which the
// first-order one updates every entry (a schedule: first order to start, second order after).
// From the job's [optimizer] others / first_order_steps (job/job.hpp MixedSpec; docs/optimizers.md).
//
// Both optimizers keep their state as entry states of the entries they take: the matrix
// optimizer's under its own names (it has no per-element state), the first-order one's per-element
// state as entry states of the entry's shape, named "<optimizer>_<state>" ("adamw_exp_avg"), so
// that a matrix keeps both through a schedule and a checkpoint names each. At the switch the
// matrix optimizer starts from its zeroed state with its own step count (its step 1 is the job's
// step first_order_steps + 1: its bias corrections and refresh intervals start there); the
// first-order state of the matrices is kept (and checkpointed) but no longer updated.
//
// Owns: the routing of entries, steps and entry states to the two. May use: core/, job/, backend/,
// model/layout.hpp, optim/optimizer.hpp.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "optim/optimizer.hpp"

namespace exatrain {

class MixedOrder final : public Optimizer {
 public:
  MixedOrder(Backend& backend, std::unique_ptr<Optimizer> matrix, std::unique_ptr<Optimizer> first_order,
             int64_t first_order_steps);
  const char* name() const override { return name_.c_str(); }  // "soap+adamw"
  std::vector<std::string> state_names() const override { return {}; }
  bool needs_whole_entries() const override { return true; }
  // The first-order optimizer's states of p (when it ever updates p), then the matrix optimizer's
  // (when p is a matrix).
  std::vector<EntryStateSpec> entry_states(const ParamInfo& p) const override;
  int64_t fallbacks() const override { return matrix_->fallbacks(); }
  int64_t scratch_bytes() const override { return matrix_->scratch_bytes() + first_->scratch_bytes(); }
  // Distribution and observation are the matrix optimizer's (K-FAC's); before the switch it is
  // told step <= 0 (nothing to observe).
  void connect(const OptimizerTopology& t) override { matrix_->connect(t); }
  void begin_step(int64_t step) override { matrix_->begin_step(step - first_order_steps_); }
  LinearObserver* linear_observer() override { return matrix_->linear_observer(); }
  bool holds_entry_state(const ParamInfo& p, size_t spec) const override;
  int entry_state_saver(const ParamInfo& p, size_t spec) const override;
  static bool is_matrix(const ParamInfo& p) { return p.role == ParamRole::matrix && p.shard_shape.size() == 2; }

 protected:
  void prepare_step(const std::vector<EntryPart>& parts, const OptimStep& ctx) override;
  void update(const EntryPart& part, const OptimStep& ctx) override;

 private:
  bool first_order_takes(const ParamInfo& p) const { return !is_matrix(p) || first_order_steps_ > 0; }
  size_t first_order_states(const ParamInfo& p) const;  // how many entry states of p are the first-order one's
  std::unique_ptr<Optimizer> matrix_, first_;
  int64_t first_order_steps_;
  std::string name_;
};

}  // namespace exatrain
