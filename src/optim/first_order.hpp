// First-order optimizers besides AdamW (optim/optimizer.hpp): SGD with (Nesterov) momentum, Lion,
// LAMB and Adafactor, each one backend op per entry part (backend/backend.hpp states the update).
// Weight decay applies to the entries with decay = true only, as AdamW's. docs/optimizers.md.
//
// SGD and Lion are elementwise: any sharding. LAMB's trust ratio is a norm of the whole entry and
// Adafactor's factored moment and update clipping are means over it, so both need whole entries
// (ZeRO 1 cuts between entries; ZeRO 2 and 3 at dp > 1 are refused by plan_problem). Under tensor
// parallelism the entry is the tp shard: LAMB's ratio and Adafactor's row/column means are the
// shard's (an approximation, as Muon's per-shard orthogonalisation).
//
// Owns: these update rules and their scratch. May use: core/, job/, backend/, model/layout.hpp,
// optim/optimizer.hpp.
#pragma once
#include <string>
#include <vector>

#include "optim/optimizer.hpp"

namespace exatrain {

// torch.optim.SGD (dampening 0; weight decay as L2 on the gradient, torch's convention).
struct SgdConfig {
  float momentum = 0.9f, weight_decay = 0;
  bool nesterov = false;
};

class Sgd final : public Optimizer {
 public:
  Sgd(Backend& backend, SgdConfig config) : Optimizer(backend), cfg_(config) {}
  const char* name() const override { return "sgd"; }
  std::vector<std::string> state_names() const override { return {"momentum_buffer"}; }

 protected:
  void update(const EntryPart& part, const OptimStep& ctx) override;

 private:
  SgdConfig cfg_;
};

// Lion (Chen et al. 2023): the sign of an interpolated momentum; decoupled weight decay.
struct LionConfig {
  float beta1 = 0.9f, beta2 = 0.99f, weight_decay = 0;
};

class Lion final : public Optimizer {
 public:
  Lion(Backend& backend, LionConfig config) : Optimizer(backend), cfg_(config) {}
  const char* name() const override { return "lion"; }
  std::vector<std::string> state_names() const override { return {"exp_avg"}; }

 protected:
  void update(const EntryPart& part, const OptimStep& ctx) override;

 private:
  LionConfig cfg_;
};

// LAMB (You et al. 2019): Adam's direction plus weight decay, scaled per entry by |p| / |r|.
class Lamb final : public Optimizer {
 public:
  Lamb(Backend& backend, AdamWConfig config) : Optimizer(backend), cfg_(config) {}
  const char* name() const override { return "lamb"; }
  std::vector<std::string> state_names() const override { return {"exp_avg", "exp_avg_sq"}; }
  bool needs_whole_entries() const override { return true; }
  int64_t scratch_bytes() const override { return bytes_of({&scratch_}); }

 protected:
  void update(const EntryPart& part, const OptimStep& ctx) override;

 private:
  AdamWConfig cfg_;
  DeviceBuffer scratch_;  // the direction r of the largest entry so far
};

// Adafactor (Shazeer & Stern 2018) with an explicit learning rate, as Hugging Face's Adafactor
// with relative_step = scale_parameter = false: every 2-D entry's second moment factored into a
// row and a column mean (Hugging Face factors any tensor of 2 or more dimensions; our entries
// have at most 2).
struct AdafactorConfig {
  float beta1 = 0, decay_rate = -0.8f, eps1 = 1e-30f, clip_threshold = 1, weight_decay = 0;
  bool factored = true;
};

class Adafactor final : public Optimizer {
 public:
  Adafactor(Backend& backend, AdafactorConfig config) : Optimizer(backend), cfg_(config) {}
  const char* name() const override { return "adafactor"; }
  std::vector<std::string> state_names() const override { return {}; }
  // "exp_avg_sq_row" [m] and "exp_avg_sq_col" [n] for a factored [m, n] entry, else "exp_avg_sq"
  // of its shape; "exp_avg" of its shape when beta1 > 0 (Hugging Face's state names).
  std::vector<EntryStateSpec> entry_states(const ParamInfo& p) const override;
  bool needs_whole_entries() const override { return true; }
  bool factored(const ParamInfo& p) const { return cfg_.factored && p.shard_shape.size() == 2; }
  int64_t scratch_bytes() const override { return bytes_of({&scratch_}); }

 protected:
  void update(const EntryPart& part, const OptimStep& ctx) override;

 private:
  AdafactorConfig cfg_;
  DeviceBuffer scratch_;  // U of the largest entry so far
};

}  // namespace exatrain
