// The distributed trainer: one rank's part of a training step under a RuntimePlan (dp x tp x pp,
// vp chunks, ZeRO 0-3, sequence parallelism, recomputation), built on the engine's Gpt stages and
// the parallel runtime's groups. The same step as the single-rank Trainer, computed by many ranks:
//
//   1. every rank reads the m micro-batches of its data-parallel replica (dp_rank of dp);
//   2. pp = 1: forward/backward of each micro-batch in turn; pp > 1: run_pipeline with this rank's
//      action table (GPipe, 1F1B or interleaved), one Gpt per model chunk, one activation slot per
//      micro-batch. Each micro-batch's loss is scaled by 1 / (m * dp), so the sums below are the
//      global mean's gradient;
//   3. gradients: sequence-parallel partial gradients (norms, row-parallel biases) all-reduced over
//      tp as each layer's last backward ends; ZeRO 0 launches the bucketed non-blocking dp
//      all-reduce from the same after_layer(l, backward) hook (overlapped with the rest of
//      backward); the tied embedding's two copies (first and last stage) are summed;
//      ZeRO 2 (DeepSpeed stage 2) reduce-scatters each gradient
//      bucket of EVERY micro-batch as soon as backward completes it (GradBucketer,
//      BucketOp::reduce_scatter): the summed chunk is accumulated into the rank's shard-sized
//      buffer and the bucket's arena pages go back to the OS once its reduce-scatter has completed,
//      so a rank holds its 1/dp shard plus the buckets in flight; the tied embedding is summed on
//      the shards; ZeRO 1 (Megatron's distributed optimizer) reduce-scatters the whole
//      arena once after backward; ZeRO 3 keeps only a shard of every unit's (layer's,
//      embedding's, head's) parameters, initialised from the seed without ever writing the full
//      arena, all-gathers a unit before each pass through it (before_layer), releases it after
//      (after_layer; released values read NaN) and reduce-scatters the unit's gradients after
//      every micro-batch's backward, returning their pages;
//   4. global gradient norm: each parameter element counted once (tp-replicated ones on tp rank 0,
//      dp-replicated ones on dp rank 0 or by their ZeRO owner, the tied copy on the first stage),
//      summed over the world; clipping and AdamW as the single-rank trainer (ZeRO 1/2: on this
//      rank's shard, then an all-gather of the updated weights).
// The reported loss is the global mean over the step's m * dp micro-batches.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "job/job.hpp"
#include "model/gpt.hpp"
#include "parallel/runtime.hpp"
#include "parallel/trace.hpp"
#include "data/token_source.hpp"

namespace exatrain::parallel {

struct DistOptions {
  ModelSpec model;
  TrainSpec train;
  // Gradient bucket size of the overlapped ZeRO-0 all-reduce, in floats. One bucket that holds the
  // whole arena reproduces the planner's single flat all-reduce byte for byte.
  int64_t bucket_floats = 1 << 18;
  // ZeRO 2: reduce-scatters in flight at once; backward waits for the oldest beyond that. Bounds
  // the gradient arena's resident part to about this many buckets (+ the one being filled).
  int buckets_in_flight = 2;
  // Layers of each of the pp * vp stages ([parallel] layers_per_stage); empty = balanced evenly.
  std::vector<int64_t> layers_per_stage;
  // train.nan_policy = "skip": a step whose global loss or gradient norm is non-finite applies no
  // update (on every rank: both numbers are global) and is reported with skipped = true; else the
  // step comes back un-applied with skipped = false and the caller stops.
  bool skip_nonfinite = false;
  int64_t inject_nan_at_step = -1;  // test hook: step (1-based) whose loss reads as NaN, once
  // Test hook: called at the end of every after_layer(unit, backward), after the trainer has
  // handed the unit's gradients on (e.g. to sample the gradient arena's resident pages).
  std::function<void(int chunk, int64_t unit)> after_backward_unit;
};

struct DistStepMetrics {
  int64_t step = 0;
  double loss = 0, grad_norm = 0, lr = 0, seconds = 0, tokens_per_s = 0;
  // The planner's breakdown_s names: compute, tp_comm, pp_comm, pp_bubble, dp_comm, optimizer.
  std::map<std::string, double> breakdown_s;
  std::map<std::string, int64_t> bytes;  // this rank's ledger for the step (kind -> bytes sent)
  int64_t buckets_launched_early = 0;    // ZeRO 0/2: dp buckets started during backward (ZeRO 2: all micro-batches)
  bool skipped = false;                  // non-finite step not applied (skip_nonfinite)
  bool nonfinite = false;                // non-finite loss or gradient norm: no update applied
};

// Fills tokens/targets [B*T] with validation batch i (the same batch on every rank that asks).
using ValBatchFn = std::function<void(int64_t i, int32_t* tokens, int32_t* targets)>;

class DistributedTrainer {
 public:
  // data: this rank's replica's micro-batches (a loader opened with dp_rank/dp_size); every rank
  // of a pipeline reads all m micro-batches of a step, so the pipeline's ranks stay in step.
  DistributedTrainer(Backend& backend, ParallelRuntime& rt, const DistOptions& options,
                     TokenSource& data);
  ~DistributedTrainer();
  DistributedTrainer(const DistributedTrainer&) = delete;
  DistributedTrainer& operator=(const DistributedTrainer&) = delete;

  DistStepMetrics train_step();
  // Mean validation loss over `batches` batches of micro_batch x seq_len (val_batch(i) for i < batches),
  // forward only, the same number as the single-rank trainer's evaluate() for the same weights. Collective
  // over the world: the dp replicas split the batches, each pipeline passes them stage by stage.
  double evaluate(int64_t batches, const ValBatchFn& val_batch);
  // Model FLOPs of one step computed by this rank's chunks (forward + backward, as Gpt::flops_per_step).
  double local_flops_per_step() const;
  // Record every forward/backward (and pipeline wait) of the following steps as trace events
  // relative to `origin` (MPI_Wtime after a common barrier); nullptr stops recording.
  void trace_into(std::vector<TraceEvent>* events, double origin) { trace_ = events, trace_origin_ = origin; }

  int64_t step() const { return step_; }
  void set_step(int64_t s) { step_ = s; }
  int chunks() const { return int(chunks_.size()); }
  Gpt& chunk(int c);
  int64_t params_on_rank() const;  // sum of the chunks' arenas
  ParallelRuntime& runtime() { return rt_; }
  const DistOptions& options() const { return opt_; }

  struct Chunk;  // one model chunk (Gpt stage) with its hooks, ranges and optimizer state
  // ZeRO 3: gathers every parameter into the chunks' arenas (collective over dp), e.g. to compare
  // them in tests; release_full_params() drops them again. No-ops for ZeRO 0-2.
  void gather_full_params();
  void release_full_params();
  // Checkpoints, slice by slice (train/dist_checkpoint.hpp): the parts of every chunk's state
  // (parameters, AdamW moments) that live on this rank, as ranges of the chunk's arena (the
  // ParamLayout offsets) with a pointer to this rank's memory of them. Together they cover what
  // the rank holds: its whole arena of parameters (ZeRO 0-2) or its shard of every segment
  // (ZeRO 3), and its moments (ZeRO 0) or its ZeRO shard of them. A checkpoint writes and reads
  // these pointers directly, so no rank ever materialises more than its own state. Among the dp
  // replicas of an element exactly one slice is marked `saver`: the ZeRO owner of that range
  // (ZeRO 0: the dp ranks split the arena evenly), so the ranks share the writing. This is the
  // checkpoint's only view of the ZeRO shard buffers: a change to their layout goes here too
  // (tests/dist/dist_checkpoint_resume.cpp saves and loads under ZeRO 0-3).
  enum class StateKind { params, m, v };
  struct StateSlice {
    int chunk = 0;
    StateKind kind = StateKind::params;
    int64_t begin = 0, end = 0;  // [begin, end) of the chunk's arena
    float* data = nullptr;       // this rank's copy of arena[begin, end)
    bool saver = false;          // this rank writes it (one saver among the dp replicas)
  };
  std::vector<StateSlice> state_slices();
  // True when this rank's copy of entry p is saved at all: tp rank 0 for tp-replicated entries,
  // not the last stage's copy of a tied embedding (the slices' `saver` splits the rest over dp).
  bool saves_entry(int chunk, const ParamInfo& p) const;

  // Called by the chunks' hooks (public for them; not for users).
  void on_before_layer(int chunk, int64_t unit, ParallelHooks::Pass pass);
  void on_after_layer(int chunk, int64_t unit, ParallelHooks::Pass pass);

 private:
  void run_micro_batches(double* loss_sum, double* compute_s, double* bubble_s);
  void reduce_gradients();
  double grad_norm_squared();
  void optimizer_step(float lr, float clip_scale);
  void tied_embedding_sum();
  void setup_zero3(Chunk& ch);
  void gather_segment(Chunk& ch, int segment);
  void release_segment(Chunk& ch, int segment);
  void reduce_scatter_segment(Chunk& ch, int segment);
  void reduce_sp_partial(Chunk& ch, int64_t unit);
  void hand_over_gradients(Chunk& ch, int64_t unit, bool backward);

  Backend& be_;
  ParallelRuntime& rt_;
  DistOptions opt_;
  TokenSource& data_;
  const RuntimePlan& plan_;
  int64_t B_, T_, m_;
  int64_t step_ = 0;
  int64_t world_ops_ = 0;  // raw MPI calls on the world so far (the watchdog's op index)
  std::vector<std::unique_ptr<Chunk>> chunks_;
  std::vector<int32_t> tokens_, targets_;  // [m][B*T]
  std::vector<TraceEvent>* trace_ = nullptr;
  double trace_origin_ = 0;
};

}  // namespace exatrain::parallel
