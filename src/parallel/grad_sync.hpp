// GradSync: the data-parallel side of a training step, one strategy per ZeRO stage, chosen once
// from the plan (make_grad_sync). The trainer calls the same interface whatever the stage:
//
//   begin_step()                          the step's gradients start from 0
//   before_unit / after_unit(chunk, u)    a pass is about to read / is done with unit u's
//                                         parameters (ZeRO 3 gathers / releases them)
//   unit_backward_done(chunk, u, last)    a micro-batch's backward through unit u is complete
//                                         (its gradients may leave for the dp reduction)
//   micro_batch_done(chunk)               a micro-batch's backward is complete
//   finish()                              every reduction of the step complete, the tied
//                                         embedding's two copies summed
//   grad_norm_squared()                   this rank's share of the global norm^2 (each element once)
//   apply(step)                           the optimizer on this rank's regions, then the gathers
//   state_slices()                        where this rank's parameters and optimizer state live,
//                                         for checkpoints
//
//   stage   gradients                                          optimizer on      memory per rank
//   ZeRO 0  all-reduced in buckets as backward makes them      everything        full
//   ZeRO 1  one reduce-scatter after the last micro-batch      its shard         full grads, 1/dp state
//   ZeRO 2  every micro-batch, bucket by bucket, reduce-       its chunk of      1/dp grads and state
//           scattered into the shard (DeepSpeed stage 2)       every bucket
//   ZeRO 3  every micro-batch, unit by unit, reduce-scattered  its shard of      1/dp of everything
//           (parameters gathered per unit, released after)     every unit
// The per-bucket reduction (ZeRO 0, 1, 2) is the compressor slot (parallel/compressor.hpp).
//
// Owns: gradient reduction, parameter sharding, where optimizer state lives. May use: backend/,
// model/ (Gpt, ParamLayout), optim/ (the Optimizer), parallel/ (groups, buckets, compressor).
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "backend/backend.hpp"
#include "model/gpt.hpp"
#include "optim/optimizer.hpp"
#include "parallel/comm.hpp"
#include "parallel/compressor.hpp"
#include "parallel/master_shards.hpp"

namespace exatrain::parallel {

struct Range {
  int64_t offset = 0, len = 0;
  int64_t end() const { return offset + len; }
};

// One model chunk as the gradient reduction sees it (built by chunk_view from its layout).
struct SyncChunk {
  Gpt* model = nullptr;
  std::map<int64_t, std::vector<Range>> units;  // unit (ParamInfo::unit) -> its entries' arena ranges
  Range tied;               // the tied embedding, when its gradient is summed with another stage's
  std::vector<Range> counted;  // what this rank counts in the global gradient norm (ascending)
};

// units, counted (each global element once over tp: replicated entries on tp rank 0; the tied
// copy never) and tied (tied_across_stages: the first and last stage of a pipeline both hold wte).
SyncChunk chunk_view(Gpt& model, int tp_rank, bool tied_across_stages);

struct GradSyncSetup {
  Backend* be = nullptr;
  Group* dp = nullptr;  // the replica group
  Compressor* compressor = nullptr;
  Optimizer* optimizer = nullptr;
  // The optimizer's view of the replicas (parallel/optimizer_comm.hpp); null: a world of one.
  ReplicaComm* optimizer_comm = nullptr;
  std::vector<SyncChunk> chunks;
  int64_t bucket_floats = 1 << 18;  // gradient bucket (ZeRO 0 and 2)
  int buckets_in_flight = 2;        // ZeRO 2: reduce-scatters in flight at once
  uint64_t seed = 0;                // ZeRO 3 initialises its shards from the seed
  bool align_to_entries = false;    // ZeRO 1: shards cut between entries (forced by the optimizer)
  // A unit's gradients before they leave for the dp reduction: the tensor-parallel partial sums.
  std::function<void(int chunk, int64_t unit)> finish_local;
  // Sums a chunk's tied-embedding gradient (device, n floats) with the other stage's copy.
  std::function<void(int chunk, float* grads, int64_t n)> tied_sum;
};

// A checkpoint's view of one piece of this rank's state: [begin, end) of a chunk's arena, of the
// parameters (state = -1) or of optimizer state tensor `state` (Optimizer::state_names), at
// `data` (device). Exactly one rank among the dp replicas of an element is its saver.
struct StateSlice {
  int chunk = 0;
  int state = -1;
  int64_t begin = 0, end = 0;
  float* data = nullptr;
  bool saver = false;
};

class GradSync {
 public:
  explicit GradSync(GradSyncSetup setup) : s_(std::move(setup)) {}
  virtual ~GradSync() = default;
  GradSync(const GradSync&) = delete;
  GradSync& operator=(const GradSync&) = delete;
  virtual const char* name() const = 0;

  virtual void begin_step() = 0;
  virtual void before_unit(int chunk, int64_t unit) {}
  virtual void after_unit(int chunk, int64_t unit) {}
  virtual void unit_backward_done(int chunk, int64_t unit, bool last_micro_batch) = 0;
  virtual void micro_batch_done(int chunk) {}
  virtual void finish() = 0;
  virtual double grad_norm_squared() = 0;
  // The optimizer on this rank's regions, then the gathers; under mixed precision it leaves every
  // chunk's 16-bit weight copy ready for the next forward (converted lazily from the fp32 arena,
  // or gathered: MasterShards; ZeRO 3 gathers it unit by unit before each pass).
  virtual void apply(const OptimStep& step) = 0;
  // Mixed precision: the chunks' fp32 arenas hold every master, written from outside (the model's
  // initialisation, a checkpoint load, a test): the 16-bit copies follow them (default: each entry
  // converted again on first use; ZeRO 3: gathered at the next pass), and a strategy that keeps
  // only its shard of the masters (ZeRO 1/2, parallel/master_shards.hpp) drops the rest.
  void masters_written();
  // Bytes of the chunks' parameter arenas this rank does not hold (sharded fp32 masters).
  int64_t released_param_bytes() const;
  virtual std::vector<StateSlice> state_slices() = 0;
  // A step not applied (non-finite): its gradients are dropped (begin_step starts afresh anyway).
  virtual void discard() {}
  // Every parameter into the chunks' arenas (collective over dp) and back: ZeRO 3, and the fp32
  // masters of mixed precision under ZeRO 1/2 (this default); else no-ops.
  virtual void gather_full_params();
  virtual void release_full_params();
  // Buckets launched during backward in the last step (the overlap achieved).
  virtual int64_t buckets_launched_early() const { return 0; }

 protected:
  // Sum of squares of the counted elements of arena [begin, end) of chunk c, data[0] = element begin.
  double counted_squares(int c, const float* data, int64_t begin, int64_t end) const;
  // Slices of `state` over chunk c's whole arena [0, n) at data, saver on the ranges `saved`.
  static void add_arena_slices(std::vector<StateSlice>& out, int c, int state, float* data, int64_t n,
                               const std::vector<Range>& saved);
  // The optimizer connected to the replicas (Optimizer::connect: replicated = every replica
  // updates every entry, as ZeRO 0; else each entry has one owner), then its state for `regions`.
  void init_optimizer(const std::vector<ParamRegion>& regions, bool replicated);
  Backend& be() const { return *s_.be; }
  Group& dp() const { return *s_.dp; }
  GradSyncSetup s_;
  // [chunks] or empty: chunk c's sharded fp32 masters (ZeRO 1/2 under mixed precision at dp > 1),
  // null where the chunk keeps every master.
  std::vector<std::unique_ptr<MasterShards>> masters_;
};

// What a strategy needs of the model's arenas, decided with the strategy (before the model exists):
// ZeRO 3 never holds the full parameter arena (each rank initialises its shards from the seed and
// gathers one unit at a time); ZeRO 2/3 gradients stay in the arena only until their
// reduce-scatter, whose pages then go back to the OS (Backend::alloc_bytes_lazy: no page resident
// until written).
struct ArenaPolicy {
  bool lazy_params = false, lazy_grads = false;
  bool init_weights = true;  // Gpt::init_weights on the full arena
};
// The stage this runtime runs for ZeRO stage `zero` over `replicas` (the replica group's size,
// dp * cp): over one replica every stage is ZeRO 0 (nothing to shard: the planner's note says the
// stage has no effect, and its memory and time count ZeRO 0's bytes), so a run pays no per-unit
// gathers, released pages or shard copies for it.
int zero_run(int zero, int replicas);
// The arenas of ZeRO stage `zero` as it runs over `replicas` (zero_run).
ArenaPolicy arena_policy(int zero, int replicas);

// The strategy of ZeRO stage `zero` (0-3) as it runs over setup.dp's replicas (zero_run). Refuses
// what that cannot run, with the reason, naming the stage the job set (e.g. ZeRO 2/3 over several
// replicas with an optimizer that needs whole matrices).
std::unique_ptr<GradSync> make_grad_sync(int zero, GradSyncSetup setup);

}  // namespace exatrain::parallel
