// The Optimizer interface: an update over ranges of a model chunk's parameter arena, with named
// state tensors per parameter, so that every data-parallel sharding (ZeRO 0-3, parallel/grad_sync)
// calls the same code and checkpoints store the state by name.
//
// A GradSync strategy decides which ranges this rank updates (the whole arena under ZeRO 0, its
// shard under ZeRO 1-3) and where their parameters and reduced gradients live (the model's arenas
// or shard buffers); it hands them over as ParamRegions, once to init_state (which allocates the
// state, zeroed, beside each region) and at every step. The optimizer walks each region entry by
// entry and calls update() on the part of every ParamInfo (global shape, shard, role, decay) that
// the region holds; an optimizer that needs whole matrices says so (needs_whole_entries) and the
// sharding then cuts only between entries.
//
// Owns: the update rules and their state memory. May use: core/, job/, backend/ (the ops and
// device memory), model/layout.hpp (ParamInfo).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "job/job.hpp"
#include "model/layout.hpp"

namespace exatrain {

// A contiguous range [begin, end) of one model chunk's parameter arena that this rank updates.
struct ParamRegion {
  const ParamLayout* layout = nullptr;  // the chunk's entries, in arena order
  int64_t begin = 0, end = 0;           // arena elements
  float* params = nullptr;              // device [end - begin]: element i is arena element begin + i
  const float* grads = nullptr;         // device [end - begin], reduced (summed over the replicas)
  int64_t size() const { return end - begin; }
};

struct OptimStep {
  int64_t step = 1;        // 1-based: the number of this update (bias corrections use it)
  float lr = 0;            // this step's learning rate
  float grad_scale = 1;    // multiplies every gradient first (global-norm clipping)
};

class Optimizer {
 public:
  explicit Optimizer(Backend& backend) : be_(backend) {}
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  virtual const char* name() const = 0;
  // The per-element state tensors, each laid out like the region's parameters (checkpoints store
  // them as "<state>.<parameter name>"), e.g. AdamW {"exp_avg", "exp_avg_sq"} as torch.optim.
  virtual std::vector<std::string> state_names() const = 0;
  // True when an update needs every parameter entry whole on one rank (matrix optimizers).
  virtual bool needs_whole_entries() const { return false; }

  // Allocates the state of these regions (zeroed); once, before the first step.
  void init_state(const std::vector<ParamRegion>& regions);
  // State tensor s (index into state_names) of region r: device [regions[r].size()].
  float* state(size_t region, size_t s) const;
  size_t regions() const { return state_.size(); }
  // One update of every region; the regions are init_state's (their pointers may have moved).
  void step(const std::vector<ParamRegion>& regions, const OptimStep& ctx);
  int64_t state_bytes() const;

 protected:
  // Updates n elements of entry p, starting at shard element `first` of it: params, grads and
  // state[s] point at that element.
  virtual void update(const ParamInfo& p, int64_t first, int64_t n, float* params, const float* grads,
                      float* const* state, const OptimStep& ctx) = 0;
  Backend& be_;

 private:
  std::vector<std::vector<DeviceBuffer>> state_;  // [region][state]
};

// AdamW with decoupled weight decay (Loshchilov & Hutter), as torch.optim.AdamW; weight decay
// only on entries with decay = true.
struct AdamWConfig {
  float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.1f;
};

class AdamW final : public Optimizer {
 public:
  AdamW(Backend& backend, AdamWConfig config) : Optimizer(backend), cfg_(config) {}
  const char* name() const override { return "adamw"; }
  std::vector<std::string> state_names() const override { return {"exp_avg", "exp_avg_sq"}; }

 protected:
  void update(const ParamInfo& p, int64_t first, int64_t n, float* params, const float* grads,
              float* const* state, const OptimStep& ctx) override;

 private:
  AdamWConfig cfg_;
};

// The job's optimizer ([train] optimizer and its hyper-parameters). An optimizer that is not
// implemented is an error naming train.optimizer.
std::unique_ptr<Optimizer> make_optimizer(Backend& backend, const TrainSpec& train);

// Learning rate at optimizer step `step` (0-based): linear warm-up from lr/warmup to lr over
// `warmup` steps, then cosine decay from lr to min_lr at step `total`.
double lr_at(int64_t step, double lr, double min_lr, int64_t warmup, int64_t total);

}  // namespace exatrain
