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
// Besides the per-element state (laid out like the parameters: AdamW's moments), an optimizer may
// keep state of an entry's own shape (entry_states: Shampoo's L [m,m] and R [n,n], K-FAC's factors,
// Adafactor's row and column sums). It exists for the entries a region holds whole, on the rank
// that updates them (under ZeRO 1 with shards cut between entries: the entry's owner; under ZeRO 0:
// every replica), and is checkpointed by name as "<state>.<parameter>"; a tensor-parallel shard has
// its own (train/checkpoint_io.cpp names it by its tp rank).
//
// Owns: the update rules and their state memory, and what an optimizer may ask of the other
// replicas (replica_comm.hpp: implemented by parallel/). May use: core/, job/, backend/ (the ops
// and device memory), model/layout.hpp (ParamInfo), model/linear_observer.hpp (K-FAC's statistics).
#pragma once
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "job/job.hpp"
#include "model/layout.hpp"
#include "model/linear_observer.hpp"
#include "optim/replica_comm.hpp"

namespace exatrain {

// A contiguous range [begin, end) of one model chunk's parameter arena that this rank updates.
struct ParamRegion {
  const ParamLayout* layout = nullptr;  // the chunk's entries, in arena order
  int64_t begin = 0, end = 0;           // arena elements
  float* params = nullptr;              // device [end - begin]: element i is arena element begin + i
  const float* grads = nullptr;         // device [end - begin], reduced (summed over the replicas)
  int64_t size() const { return end - begin; }
};

// A state tensor of one whole entry, of its own shape (row-major floats).
struct EntryStateSpec {
  std::string name;            // the checkpoint's tensor is "<name>.<parameter name>"
  std::vector<int64_t> shape;  // e.g. {m, m} for a left factor of an [m, n] shard
};

// One entry's entry-state tensors held by this rank (Optimizer::entry_state_tensors).
struct EntryStateTensor {
  const ParamLayout* layout = nullptr;  // the chunk whose entry it is (ParamRegion::layout)
  const ParamInfo* entry = nullptr;
  EntryStateSpec spec;
  float* data = nullptr;                // device [product of spec.shape]
  size_t index = 0;                     // spec's place in entry_states(*entry)
  size_t of = 0;                        // entry_states(*entry).size()
  int64_t numel() const;
};

// What update() gets: n elements of entry p from shard element `first` on, and the state there.
struct EntryPart {
  const ParamInfo& p;
  int64_t first = 0, n = 0;
  float* params = nullptr;             // device [n]
  const float* grads = nullptr;        // device [n]
  float* const* state = nullptr;       // [state_names().size()]: each device [n], at element first
  float* const* entry_state = nullptr; // [entry_states(p).size()]: whole-entry tensors; only when
                                       // the part is the whole entry (first == 0, n == p.numel);
                                       // null for one this rank does not hold (holds_entry_state)
};

// Where this rank's optimizer runs, told once by the GradSync strategy before init_state (a
// distributed optimizer, K-FAC, assigns its work to the replicas from it).
struct OptimizerTopology {
  ReplicaComm* comm = nullptr;             // the replicas of this rank's chunks (never null)
  std::vector<const ParamLayout*> chunks;  // this rank's model chunks, in order
  // true: every replica updates every entry (ZeRO 0); false: each entry has one owner among the
  // replicas, whose regions hold it (ZeRO 1 cut between entries; at dp 1, the one rank).
  bool replicated = true;
};

struct OptimStep {
  int64_t step = 1;        // 1-based: the number of this update (bias corrections use it)
  float lr = 0;            // this step's learning rate
  float grad_scale = 1;    // multiplies every gradient first (global-norm clipping)
  // The reduced "gradients" are the data-parallel-synchronised first moment ([comm] compress =
  // "momentum": the compressed sum of the ranks' local momenta, docs/compression.md): AdamW takes
  // them as its m (times grad_scale) with its v frozen; the other optimizers refuse it.
  bool grads_are_momentum = false;
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
  // The state tensors of entry p's own shape (p as this rank holds it: p.shard_shape); none by
  // default. An optimizer with such state needs whole entries.
  virtual std::vector<EntryStateSpec> entry_states(const ParamInfo& p) const { return {}; }
  // True when an update needs every parameter entry whole on one rank (matrix optimizers).
  virtual bool needs_whole_entries() const { return false; }
  // The index in state_names() of the first moment an update can take synchronised in place of
  // the gradient (OptimStep::grads_are_momentum; [comm] compress = "momentum"), -1 when none:
  // AdamW's exp_avg. Said by the optimizer, so that no caller finds the state by its name.
  virtual int momentum_state() const { return -1; }
  bool takes_momentum() const { return momentum_state() >= 0; }

  // Allocates the state of these regions (zeroed): the per-element tensors of every region and
  // the entry states of every entry a region holds whole; refuses an entry with entry states cut
  // by a region. Once, before the first step.
  void init_state(const std::vector<ParamRegion>& regions);
  // State tensor s (index into state_names) of region r: device [regions[r].size()].
  float* state(size_t region, size_t s) const;
  size_t regions() const { return state_.size(); }
  // Every entry-state tensor this rank holds, in region and arena order.
  const std::vector<EntryStateTensor>& entry_state_tensors() const { return entry_tensors_; }
  // One update of every region; the regions are init_state's (their pointers may have moved).
  void step(const std::vector<ParamRegion>& regions, const OptimStep& ctx);
  int64_t state_bytes() const;
  // Device memory the optimizer holds beyond its state between steps (scratch grown to the largest
  // entry, K-FAC's statistics and preconditioned gradients): counted in the trainer's accounted bytes.
  virtual int64_t scratch_bytes() const { return 0; }
  // Distribution (optimizers whose update needs other ranks; default: nothing to do). connect is
  // called once, before init_state; begin_step before the forward of every step, with the number
  // of the update that step ends with; the observer, when there is one, is shown every backward's
  // layer matrices (the trainer hands it to the model: Gpt::set_linear_observer).
  virtual void connect(const OptimizerTopology& topology) {}
  virtual void begin_step(int64_t step) {}
  virtual LinearObserver* linear_observer() { return nullptr; }
  // Whether this rank keeps entry state `spec` (an index into entry_states(p)) of an entry it
  // updates (default: all of them), and which replica saves it in checkpoints (-1: the rank that
  // saves the entry's parameters, train/checkpoint_io.cpp). K-FAC keeps a layer's eigenbases only
  // on its gradient workers, saved by the one that computes them.
  virtual bool holds_entry_state(const ParamInfo& p, size_t spec) const { return true; }
  virtual int entry_state_saver(const ParamInfo& p, size_t spec) const { return -1; }

  // Preconditioner computations (a Shampoo block's root, a SOAP side's basis) that failed (the
  // eigendecomposition, or a non-finite result) and kept the previous one, since construction;
  // 0 for the optimizers without any.
  virtual int64_t fallbacks() const { return 0; }

 protected:
  friend class MixedOrder;  // routes entries to the update() of the two it composes
  // Before the step's updates, with every part it will update (in region and arena order): the
  // work that spans entries (K-FAC: factor reductions, eigendecompositions, a global clip).
  virtual void prepare_step(const std::vector<EntryPart>& parts, const OptimStep& ctx) {}
  // Updates one entry's part (EntryPart).
  virtual void update(const EntryPart& part, const OptimStep& ctx) = 0;
  Backend& be_;

 private:
  void init_entry_states(size_t region, const ParamRegion& r);
  void collect_parts(const std::vector<ParamRegion>& regions);  // into parts_
  std::vector<EntryPart> parts_;                  // the step's parts (collect_parts)
  std::vector<std::vector<float*>> part_state_;   // [part]: its state pointers, then its entry states
  std::vector<std::vector<DeviceBuffer>> state_;  // [region][state]
  std::vector<EntryStateTensor> entry_tensors_;   // region by region, entries in arena order
  std::vector<DeviceBuffer> entry_buffers_;       // entry_tensors_[i].data's memory
  std::vector<size_t> region_first_tensor_;       // [region + 1]: its range of entry_tensors_
};

// AdamW with decoupled weight decay (Loshchilov & Hutter), as torch.optim.AdamW; weight decay
// only on entries with decay = true.
struct AdamWConfig {
  float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.1f;
  // > 0: after this many steps the second moment v (and its bias correction) stays as it is, 1-bit
  // Adam's frozen variance (Tang et al. 2021): the update becomes linear in the gradient, so the
  // error-feedback-compressed gradients of [comm] (docs/compression.md, "Under Adam") move the
  // weights as far as the dense ones. From [comm] adam_variance = "freeze" (after warmup_steps).
  int64_t freeze_variance_after = 0;
};

class AdamW final : public Optimizer {
 public:
  AdamW(Backend& backend, AdamWConfig config) : Optimizer(backend), cfg_(config) {}
  const char* name() const override { return "adamw"; }
  std::vector<std::string> state_names() const override { return {"exp_avg", "exp_avg_sq"}; }
  int momentum_state() const override { return 0; }  // exp_avg

 protected:
  void update(const EntryPart& part, const OptimStep& ctx) override;

 private:
  AdamWConfig cfg_;
};

// One AdamW update of an entry's part with moments m and v (device [part.n]): the update of
// AdamW, and of the entries a matrix optimizer leaves to AdamW (Muon's embeddings, norms, biases).
void adamw_part(Backend& be, const AdamWConfig& c, const EntryPart& part, float* m, float* v, const OptimStep& ctx);

// What the whole-entry optimizers share: the check that a part is its whole entry (init_state
// refuses a region that cuts an entry with entry states; LAMB has none, so it checks here), and a
// scratch buffer of at least n floats, grown and never shrunk.
void check_whole_entry(const char* optimizer, const EntryPart& e);
float* reserve_scratch(Backend& be, DeviceBuffer& buf, int64_t n, const char* label);
// The bytes of these buffers (scratch_bytes).
int64_t bytes_of(std::initializer_list<const DeviceBuffer*> buffers);

// The job's optimizer ([train] optimizer and its hyper-parameters: "adamw" and "lamb" with
// [train]'s beta1, beta2, eps; "sgd", "lion", "adafactor" (optim/first_order.hpp), "muon"
// (optim/muon.hpp), "shampoo" (optim/shampoo.hpp) and "soap" (optim/soap.hpp) with [optimizer]'s
// keys; a matrix optimizer with [optimizer] others / first_order_steps: optim/mixed.hpp). Another
// name, or a mixed order of another pair, is an error naming the key.
std::unique_ptr<Optimizer> make_optimizer(Backend& backend, const TrainSpec& train);

// Learning rate at optimizer step `step` (0-based): linear warm-up from lr/warmup to lr over
// `warmup` steps, then cosine decay from lr to min_lr at step `total`.
double lr_at(int64_t step, double lr, double min_lr, int64_t warmup, int64_t total);

}  // namespace exatrain
