// The trainer: one rank's part of a training step under a resolved plan (dp x tp x pp, vp chunks,
// ZeRO 0-3, sequence parallelism, recomputation), for 1..N ranks: a single-rank run is the
// world-size-1 case of the same code. Built on the engine's Gpt stages (the model has no parallel
// code), the parallel runtime's groups and one GradSync strategy chosen from the plan:
//
//   1. every rank reads the m micro-batches of its data-parallel replica (dp_rank of dp);
//   2. pp = 1: forward/backward of each micro-batch in turn; pp > 1: run_pipeline with this rank's
//      action table (GPipe, 1F1B or interleaved), one Gpt per model chunk, one activation slot per
//      micro-batch. Each micro-batch's loss is scaled by 1 / (m * dp), so the sums below are the
//      global mean's gradient (times fp16's loss scale S, train/loss_scaler.hpp);
//   3. the model's layer-boundary hooks drive the data-parallel side: before a pass reads a unit
//      (layer, embedding, head) GradSync::before_unit (ZeRO 3 gathers it); after a unit's backward
//      the trainer finishes its tensor-parallel partial sums (sequence parallelism) when GradSync
//      hands the unit over, records an event and GradSync::unit_backward_done starts its reduction;
//      at the end GradSync::finish completes them and sums the tied embedding's two copies (first
//      and last stage, a point-to-point exchange on the pp group);
//   4. global gradient norm: every rank's GradSync::grad_norm_squared (each element counted once)
//      summed over the world (fp16: non-finite = an overflow on some rank, the step is skipped and
//      S backs off); clipping, the learning-rate schedule and GradSync::apply (the Optimizer on
//      this rank's regions with the gradients unscaled by 1 / S, then the parameter gathers).
// The reported loss is the global mean over the step's m * dp micro-batches.
//
// Owns: the step, the micro-batch loop, evaluation. May use: backend/, model/, optim/, parallel/,
// data/ (TokenSource), plan/ (the plan and its stage split), train/machine_peak.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "data/token_source.hpp"
#include "job/job.hpp"
#include "model/gpt.hpp"
#include "optim/optimizer.hpp"
#include "parallel/compressor.hpp"
#include "parallel/executor.hpp"
#include "parallel/grad_sync.hpp"
#include "parallel/optimizer_comm.hpp"
#include "parallel/runtime.hpp"
#include "parallel/trace.hpp"
#include "plan/plan.hpp"
#include "train/loss_scaler.hpp"

namespace exatrain {

struct TrainerOptions {
  ModelSpec model;
  TrainSpec train;    // lr, min_lr, warmup_steps, steps, seed, optimizer and its betas, eps, wd, clip
  plan::Plan plan;    // resolved and valid (plan/resolve.hpp): degrees, ZeRO, micro-batching, stages
  int64_t seq = 0;    // tokens per sequence (0 = model.seq_len; fewer: e.g. a benchmark's short sequences)
  // Gradient bucket size of the overlapped ZeRO-0/2 reductions, in floats. One bucket that holds
  // the whole arena reproduces the planner's single flat all-reduce byte for byte.
  int64_t bucket_floats = 1 << 18;
  // ZeRO 2: reduce-scatters in flight at once; backward waits for the oldest beyond that. Bounds
  // the gradient arena's resident part to about this many buckets (+ the one being filled).
  int buckets_in_flight = 2;
  // The data-parallel reduction's compressor slot (parallel/compressor.hpp); null: the job's
  // [comm] compressor (train.comm, parallel/compressors.hpp), the identity by default.
  std::shared_ptr<parallel::Compressor> compressor;
  // The optimizer; null: the job's (make_optimizer from train). Tests inject one here (e.g. an
  // optimizer with entry states: tests/dist/dist_entry_states.cpp).
  std::function<std::unique_ptr<Optimizer>(Backend&)> optimizer;
  // ZeRO 1: shards cut only between parameter entries (one owner per matrix); forced by an
  // optimizer that needs whole matrices.
  bool align_shards_to_entries = false;
  // train.nan_policy = "skip": a step whose global loss or gradient norm is non-finite applies no
  // update (on every rank: both numbers are global) and is reported with skipped = true; else the
  // step comes back un-applied with skipped = false and nonfinite = true, and the caller stops.
  bool skip_nonfinite = false;
  int64_t inject_nan_at_step = -1;  // test hook: step (1-based) whose loss reads as NaN, once
  // Test hook (fp16): at this step (1-based), once, world rank inject_overflow_rank's share of the
  // global gradient norm reads as +inf, as if only that rank's gradients had overflowed.
  int64_t inject_overflow_at_step = -1;
  int inject_overflow_rank = 0;
  // The MFU denominator (GFLOP/s of this rank's cores); 0: measured (cached) at the first step.
  double peak_gflops = 0;
  // Test hook: called at the end of every unit's backward, after its gradients were handed on
  // (e.g. to sample the gradient arena's resident pages).
  std::function<void(int chunk, int64_t unit)> after_backward_unit;
};

struct StepMetrics {
  int64_t step = 0;            // 1-based optimizer step just completed
  double loss = 0;             // global mean over the step's micro-batches
  double grad_norm = 0;        // global L2 norm before clipping
  double lr = 0, seconds = 0, tokens_per_s = 0;
  double gflops = 0;           // this rank's achieved model GFLOP/s
  double mfu = 0;              // gflops / peak_gflops
  int64_t peak_rss_bytes = 0;
  int64_t accounted_bytes = 0; // this rank's params + grads + optimizer state and scratch + activations
  // The planner's breakdown_s names: compute, tp_comm, pp_comm, pp_bubble, dp_comm, optimizer.
  std::map<std::string, double> breakdown_s;
  std::map<std::string, int64_t> bytes;  // this rank's ledger for the step (kind -> bytes sent)
  int64_t buckets_launched_early = 0;    // dp buckets started during backward (ZeRO 0/2)
  std::map<std::string, double> compression;  // the compressor's figures (Compressor::step_stats)
  // This rank's failed preconditioner computations that kept the previous one (Optimizer::fallbacks:
  // a failed eigendecomposition or a non-finite root or basis) since this process started.
  int64_t optimizer_fallbacks = 0;
  bool skipped = false;                  // non-finite step not applied (skip_nonfinite, or an fp16 overflow)
  bool nonfinite = false;                // non-finite loss or gradient norm: no update applied
  // fp16 loss scaling (train/loss_scaler.hpp); loss_scale 0: none (fp32, bf16).
  double loss_scale = 0;                 // the scale this step's backward used
  bool overflow = false;                 // inf/NaN gradients on some rank at that scale: skipped, backed off
  int64_t skipped_steps = 0;             // overflowing steps skipped so far in the run (resumes included)
};

// The options of a run of `job` under its resolved `plan` (plan/resolve.hpp): the job's model and
// [train], the plan, the NaN policy; the rest at their defaults.
TrainerOptions trainer_options(const Job& job, const plan::Plan& plan);

// The plan of a run on one rank: `micro_batches` micro-batches of `micro_batch` sequences per
// step (gradient accumulation), recomputation as given; for code that builds a Trainer itself.
plan::Plan single_rank_plan(int64_t micro_batch, int64_t micro_batches, Recompute recompute = Recompute::none);

// One metrics.jsonl line (no trailing newline): the contract keys step, loss, grad_norm, lr,
// tokens_per_s, mfu plus seconds, gflops, peak_rss_bytes, accounted_bytes; with fp16 loss
// scaling also loss_scale, skipped (false: this line's step was applied) and skipped_steps.
std::string metrics_json(const StepMetrics& m);

// Fills tokens/targets [B*T] with validation batch i (the same batch on every rank that asks).
using ValBatchFn = std::function<void(int64_t i, int32_t* tokens, int32_t* targets)>;

class Trainer {
 public:
  // data: this rank's replica's micro-batches (a loader opened with dp_rank/dp_size); every rank
  // of a pipeline reads all m micro-batches of a step, so the pipeline's ranks stay in step.
  Trainer(Backend& backend, parallel::ParallelRuntime& rt, const TrainerOptions& options, TokenSource& data);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  StepMetrics train_step();
  // Mean validation loss over `batches` batches of micro_batch x seq_len (val_batch(i) for i <
  // batches), forward only. Collective over the world: the dp replicas split the batches, each
  // pipeline passes them stage by stage.
  double evaluate(int64_t batches, const ValBatchFn& val_batch);
  // Model FLOPs of one step computed by this rank's chunks (forward + backward, as Gpt::flops_per_step).
  double local_flops_per_step() const;
  // Record every forward/backward (and pipeline wait) of the following steps as trace events
  // relative to `origin` (MPI_Wtime after a common barrier); nullptr stops recording.
  void trace_into(std::vector<parallel::TraceEvent>* events, double origin) { trace_ = events, trace_origin_ = origin; }

  int64_t step() const { return step_; }
  void set_step(int64_t s) { step_ = s; }
  int chunks() const { return int(chunks_.size()); }
  Gpt& chunk(int c);
  Gpt& model() { return chunk(0); }  // the whole model on a single rank
  int64_t params_on_rank() const;    // sum of the chunks' arenas
  int64_t accounted_bytes() const;
  parallel::ParallelRuntime& runtime() { return rt_; }
  Backend& backend() { return be_; }
  const TrainerOptions& options() const { return opt_; }
  Optimizer& optimizer() { return *optimizer_; }
  LossScaler& loss_scaler() { return scaler_; }  // fp16 (enabled()); else scale 1, never skips
  parallel::GradSync& grad_sync() { return *sync_; }
  void set_peak_gflops(double g) { opt_.peak_gflops = g; }

  // Every parameter into the chunks' arenas (collective over dp), e.g. to compare them in tests;
  // release_full_params() drops them again. ZeRO 3, and mixed precision's sharded fp32 masters
  // under ZeRO 1/2 (parallel/master_shards.hpp); no-ops otherwise.
  void gather_full_params() { sync_->gather_full_params(); }
  void release_full_params() { sync_->release_full_params(); }
  // The chunks' fp32 arenas were written from outside the optimizer, each whole on every rank (a
  // checkpoint load, a test; a rank that keeps a shard of the masters has no other source for
  // the rest): before the next forward the 16-bit copies follow them (mixed precision) and a
  // rank that keeps only its shard of the masters drops the rest (GradSync::masters_written).
  void masters_changed() { masters_pending_ = true; }
  // Checkpoints, slice by slice (train/checkpoint_io.hpp): where this rank's parameters and
  // optimizer state live (GradSync::state_slices).
  std::vector<parallel::StateSlice> state_slices() { return sync_->state_slices(); }
  // True when this rank's copy of entry p is saved at all: tp rank 0 for tp-replicated entries,
  // not the head stage's copy of a tied embedding (the slices' `saver` splits the rest over dp).
  bool saves_entry(const ParamInfo& p) const;

  struct Chunk;  // one model chunk (Gpt stage) with its hooks
  // Called by the chunks' hooks (public for them; not for users).
  void on_before_layer(int chunk, int64_t unit, ParallelHooks::Pass pass);
  void on_after_layer(int chunk, int64_t unit, ParallelHooks::Pass pass);

 private:
  void build_chunks();
  void run_micro_batches(double* loss_sum, double* compute_s, double* bubble_s);
  void run_pipeline_step(double* loss_sum, double* compute_s, double* bubble_s);
  void finish_local(int chunk, int64_t unit);
  void refresh_masters();  // GradSync::masters_written once after masters_changed()
  double global_grad_norm_squared();
  StepMetrics skip_overflow(StepMetrics s, double t0);
  void tied_sum(int chunk, float* grads, int64_t n);
  StepMetrics finish_metrics(StepMetrics s, double t0, double t_opt, double compute_s, double bubble_s,
                             double dp_in_micro_batches);

  Backend& be_;
  parallel::ParallelRuntime& rt_;
  TrainerOptions opt_;
  TokenSource& data_;
  int64_t B_, T_, m_;
  int64_t act_;  // floats of one stage-boundary message: [B, T, C], or this rank's rows under sp
  int64_t step_ = 0;
  bool masters_pending_ = true;  // the arenas hold the initial weights: refresh before the first forward
  LossScaler scaler_;            // fp16 only (enabled); see train/loss_scaler.hpp
  float backward_scale_ = 1;     // this step's d(loss the backward starts from) / d(micro-batch mean loss)
  std::vector<std::unique_ptr<Chunk>> chunks_;
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<parallel::GroupReplicaComm> optimizer_comm_;  // the optimizer's view of the replicas
  std::shared_ptr<parallel::Compressor> compressor_;
  std::unique_ptr<parallel::GradSync> sync_;
  std::unique_ptr<Event> unit_done_;      // recorded when a unit's gradients are final
  std::unique_ptr<parallel::BufferPool> messages_;  // pipeline and evaluation activations
  std::unique_ptr<parallel::PipelineTable> pipeline_;  // pp > 1: every rank's actions of a step
  DeviceBuffer tied_other_;               // the other stage's tied-embedding gradient
  std::vector<int32_t> tokens_, targets_;  // [m][B*T]
  std::vector<parallel::TraceEvent>* trace_ = nullptr;
  double trace_origin_ = 0;
};

}  // namespace exatrain
