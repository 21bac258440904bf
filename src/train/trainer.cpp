#include "train/trainer.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/check.hpp"
#include "parallel/compressors.hpp"
#include "parallel/schedule.hpp"
#include "parallel/tp_hooks.hpp"
#include "plan/stages.hpp"
#include "train/every_rank.hpp"
#include "train/machine_peak.hpp"

namespace exatrain {

using parallel::Range;


// The engine's ParallelHooks over the tp group (MpiParallelHooks: the named tensor-parallel
// regions) plus the layer boundaries, which drive the data-parallel side.
class TrainerHooks final : public parallel::MpiParallelHooks {
 public:
  TrainerHooks(parallel::Group& tp, Trainer& owner, int chunk) : MpiParallelHooks(tp), owner_(owner), chunk_(chunk) {}
  TrainerHooks(parallel::Group& tp, Backend& be, Half wire, Trainer& owner, int chunk)
      : MpiParallelHooks(tp, be, wire), owner_(owner), chunk_(chunk) {}
  void before_layer(int64_t unit, Pass pass) override { owner_.on_before_layer(chunk_, unit, pass); }
  void after_layer(int64_t unit, Pass pass) override { owner_.on_after_layer(chunk_, unit, pass); }

 private:
  Trainer& owner_;
  int chunk_;
};

struct Trainer::Chunk {
  int stage = 0;
  std::unique_ptr<TrainerHooks> hooks;
  std::unique_ptr<Gpt> model;
  std::map<int64_t, std::vector<Range>> sp_partial;  // unit -> gradients that are partial sums over tp
  int backward_count = 0;                            // backwards of this step so far (the m-th is the last)
};

TrainerOptions trainer_options(const Job& job, const plan::Plan& plan) {
  TrainerOptions o;
  o.model = job.model;
  o.train = job.train;
  o.plan = plan;
  o.skip_nonfinite = job.train.nan_policy == "skip";
  return o;
}

plan::Plan single_rank_plan(int64_t micro_batch, int64_t micro_batches, Recompute recompute) {
  plan::Plan p;
  p.micro_batch = micro_batch;
  p.global_batch = micro_batch * micro_batches;
  p.recompute = recompute;
  p.precision = Precision::fp32;
  return p;
}

std::string metrics_json(const StepMetrics& m) {
  nlohmann::json j = {{"step", m.step},       {"loss", m.loss},
                      {"grad_norm", m.grad_norm}, {"lr", m.lr},
                      {"tokens_per_s", m.tokens_per_s}, {"mfu", m.mfu},
                      {"seconds", m.seconds}, {"gflops", m.gflops},
                      {"peak_rss_bytes", m.peak_rss_bytes}, {"accounted_bytes", m.accounted_bytes}};
  if (m.loss_scale > 0) {  // fp16 loss scaling
    j["loss_scale"] = m.loss_scale;
    j["skipped"] = m.skipped;
    j["skipped_steps"] = m.skipped_steps;
  }
  return j.dump();
}

Trainer::Trainer(Backend& backend, parallel::ParallelRuntime& rt, const TrainerOptions& options, TokenSource& data)
    : be_(backend), rt_(rt), opt_(options), data_(data) {
  const plan::Plan& p = opt_.plan;
  B_ = p.micro_batch;
  T_ = opt_.seq > 0 ? opt_.seq : opt_.model.seq_len;
  m_ = p.micro_batches();
  act_ = (p.seq_parallel ? B_ * T_ / p.tp : B_ * T_) * opt_.model.hidden;
  optimizer_ = opt_.optimizer ? opt_.optimizer(be_) : make_optimizer(be_, opt_.train);
  build_chunks();
  // fp16: loss scaling (train/loss_scaler.hpp); bf16 has fp32's exponent range and needs none.
  if (p.precision == Precision::fp16) scaler_ = LossScaler(opt_.train.loss_scale);
  // The job's [comm] compressor (parallel/compressors.hpp) unless one is injected.
  compressor_ = opt_.compressor ? opt_.compressor
                                : parallel::make_compressor(opt_.train.comm, {opt_.train.seed, opt_.train.grad_clip,
                                                                              params_on_rank(),
                                                                              opt_.train.grad_reduce_dtype == "bf16",
                                                                              opt_.train.beta1});
  for (auto& ch : chunks_) ch->model->set_linear_observer(optimizer_->linear_observer());  // K-FAC's factors
  optimizer_comm_ = std::make_unique<parallel::GroupReplicaComm>(rt_.dp(), rt_.world(), rt_.ledger());
  parallel::GradSyncSetup s;
  s.be = &be_, s.dp = &rt_.dp(), s.compressor = compressor_.get(), s.optimizer = optimizer_.get();
  s.optimizer_comm = optimizer_comm_.get();
  const bool tied = opt_.model.tie_embeddings && p.pp * p.vp > 1;
  for (auto& ch : chunks_) s.chunks.push_back(parallel::chunk_view(*ch->model, rt_.mesh().coord.tp, tied));
  s.bucket_floats = opt_.bucket_floats;
  s.buckets_in_flight = opt_.buckets_in_flight;
  s.seed = opt_.train.seed;
  s.align_to_entries = opt_.align_shards_to_entries;
  s.finish_local = [this](int c, int64_t unit) { finish_local(c, unit); };
  s.tied_sum = [this](int c, float* g, int64_t n) { tied_sum(c, g, n); };
  sync_ = parallel::make_grad_sync(int(p.zero), std::move(s));
  unit_done_ = be_.create_event();
  // Pipeline messages in the 16-bit format under mixed precision (Megatron-core's pipeline_dtype =
  // params_dtype) unless [train] pipeline_dtype = "fp32" (Plan::pipeline_fp32, as the planner counts them).
  const std::optional<Half> wire = p.pipeline_fp32 ? std::nullopt : half_format(p.precision);
  messages_ = std::make_unique<parallel::BufferPool>(be_, act_, wire);
  // The schedule as data, built once (the plan was validated when it was resolved). Over MPI the
  // receives are posted a compute early (the message can arrive while it runs, where MPI's weak
  // progress moves it then: docs/parallel.md); over NCCL, whose calls wait in posting order on one
  // stream, that order deadlocks: there it is posted in Megatron's steps (parallel/schedule.hpp
  // in_steps, parallel/stream_order.hpp).
  if (p.pp > 1) {
    parallel::PipelineTable t = parallel::build_pipeline(parallel::pipeline_plan(p));
    pipeline_ = std::make_unique<parallel::PipelineTable>(rt_.pp().p2p_in_stream_order() ? parallel::in_steps(t) : t);
  }
  tokens_.resize(size_t(m_ * B_ * T_));
  targets_.resize(size_t(m_ * B_ * T_));
}

Trainer::~Trainer() = default;

// One Gpt per model chunk of this pipeline rank: contiguous layer ranges for the pp * vp stages
// ([parallel] layers_per_stage, else balanced by cost with the embedding and the LM head counted,
// plan/stages.hpp: the split the planner predicts and counts bytes for), the rank's tp shard.
void Trainer::build_chunks() {
  const plan::Plan& p = opt_.plan;
  const parallel::PipelinePlan pipe = parallel::pipeline_plan(p);
  const int S = pipe.stages();
  const std::vector<plan::StageLayers> stages =
      plan::pipeline_stages(opt_.model, int(p.pp), int(p.vp), p.layers_per_stage);
  // The GradSync strategy decides what the arenas must be (ZeRO 2/3 keep them mostly empty).
  const parallel::ArenaPolicy arenas = parallel::arena_policy(int(p.zero), rt_.dp().size());
  for (int c = 0; c < pipe.vp; c++) {
    auto ch = std::make_unique<Chunk>();
    ch->stage = parallel::stage_of(pipe, rt_.mesh().coord.pp, c);
    GptOptions g;
    g.model = opt_.model;
    g.tp = TensorParallel{rt_.mesh().coord.tp, int(p.tp), p.seq_parallel};
    const plan::StageLayers& st = stages[size_t(ch->stage)];
    g.stage = StageRange{st.first, st.end, ch->stage == 0, ch->stage == S - 1};
    g.recompute = p.recompute;
    g.micro_batch = B_;
    g.seq = T_;
    g.activation_slots = p.pp > 1 ? m_ : 1;  // pipeline: micro-batch mb keeps slot mb
    g.lazy_params = arenas.lazy_params;
    g.lazy_grads = arenas.lazy_grads;
    g.precision = p.precision;  // mixed precision: the model's 16-bit copy and GEMMs (model/gpt.hpp)
    g.fp32_residual = p.residual_fp32;  // [train] residual_dtype, as the planner counts it
    // The tensor-parallel regions' messages in the 16-bit format under mixed precision
    // (Megatron's) unless [train] tp_comm_dtype = "fp32" (Plan::tp_comm_fp32, as the planner counts them).
    if (const std::optional<Half> wire = p.tp_comm_fp32 ? std::nullopt : half_format(p.precision))
      ch->hooks = std::make_unique<TrainerHooks>(rt_.tp(), be_, *wire, *this, c);
    else
      ch->hooks = std::make_unique<TrainerHooks>(rt_.tp(), *this, c);
    ch->model = std::make_unique<Gpt>(be_, g, ch->hooks.get());
    if (arenas.init_weights) ch->model->init_weights(opt_.train.seed);
    for (const ParamInfo& e : ch->model->layout().entries())
      if (e.sp_partial_grad) ch->sp_partial[e.unit].push_back({e.offset, e.numel});
    chunks_.push_back(std::move(ch));
  }
}

Gpt& Trainer::chunk(int c) { return *chunks_.at(size_t(c))->model; }

int64_t Trainer::params_on_rank() const {
  int64_t n = 0;
  for (const auto& ch : chunks_) n += ch->model->num_params();
  return n;
}

int64_t Trainer::accounted_bytes() const {
  int64_t b = optimizer_->state_bytes() + optimizer_->scratch_bytes() + be_.scratch_bytes();
  for (const auto& ch : chunks_) {
    const ModelMemory m = ch->model->memory();
    b += m.params + m.grads + m.activations;
  }
  return b;
}

bool Trainer::saves_entry(const ParamInfo& p) const {
  return (p.split_dim >= 0 || rt_.mesh().coord.tp == 0) && !p.tied_copy;
}

// Sequence parallelism: a unit's norm and row-parallel-bias gradients are partial sums over the
// tp ranks' sequence rows (Megatron's allreduce_sequence_parallel_grads).
void Trainer::finish_local(int c, int64_t unit) {
  Chunk& ch = *chunks_[size_t(c)];
  auto it = ch.sp_partial.find(unit);
  if (it == ch.sp_partial.end()) return;
  float* g = ch.model->grads();
  for (const Range& r : it->second) rt_.tp().all_reduce_sum(g + r.offset, r.len);
}

// The first and last stage each hold the tied embedding; the full gradient is the sum of both
// copies' (Megatron's embedding group). Both ranks compute a + b (commutative: identical bits).
// Counted under "pp_send" (a point-to-point message on the pp group: the whole copy, each side),
// as plan::bytes_sent_per_step counts it on the first and last stage.
void Trainer::tied_sum(int c, float* grads, int64_t n) {
  const int peer = chunks_[size_t(c)]->stage == 0 ? int(opt_.plan.pp) - 1 : 0;
  if (tied_other_.size() < n) tied_other_ = DeviceBuffer(be_, n, "tied embedding exchange");
  rt_.pp().send_recv(grads, tied_other_.data(), n, parallel::DType::f32, peer, 7001, "pp_send");
  be_.add_inplace(grads, tied_other_.data(), n);
}

// (Under mixed precision ZeRO 3 gathers the unit's 16-bit copy itself: parallel/zero3_sync.cpp.)
void Trainer::on_before_layer(int c, int64_t unit, ParallelHooks::Pass) { sync_->before_unit(c, unit); }

// The float32 masters were written from outside the optimizer since the last forward (the
// initial weights, a checkpoint loaded, weights set by a test); an optimizer step refreshes the
// 16-bit copies itself (GradSync::apply).
void Trainer::refresh_masters() {
  if (!masters_pending_) return;
  sync_->masters_written();
  masters_pending_ = false;
}

// After a unit's backward: an event marks its gradients final, then GradSync hands them over
// (every micro-batch, or after the last one: the strategy decides); then the unit's parameters
// may be released (ZeRO 3), whatever the pass.
void Trainer::on_after_layer(int c, int64_t unit, ParallelHooks::Pass pass) {
  if (pass == ParallelHooks::Pass::backward) {
    Chunk& ch = *chunks_[size_t(c)];
    be_.record(*unit_done_, be_.compute_stream());
    rt_.dp().after(*unit_done_);
    sync_->unit_backward_done(c, unit, ch.backward_count == m_);
  }
  sync_->after_unit(c, unit);
  if (pass == ParallelHooks::Pass::backward && opt_.after_backward_unit) opt_.after_backward_unit(c, unit);
}

void Trainer::run_micro_batches(double* loss_sum, double* compute_s, double* bubble_s) {
  if (opt_.plan.pp > 1) return run_pipeline_step(loss_sum, compute_s, bubble_s);
  const int64_t n = B_ * T_;
  Chunk& ch = *chunks_[0];
  const double t0 = omp_get_wtime();
  for (int mb = 0; mb < int(m_); mb++) {
    const double f0 = trace_ ? parallel::trace_us_since(trace_origin_) : 0;
    *loss_sum += double(ch.model->forward(tokens_.data() + mb * n, nullptr, targets_.data() + mb * n, 0));
    const double b0 = trace_ ? parallel::trace_us_since(trace_origin_) : 0;
    ch.backward_count++;
    ch.model->backward(nullptr, backward_scale_, 0);
    sync_->micro_batch_done(0);
    if (trace_) {
      trace_->push_back({fmt::format("F mb{}", mb), "compute", f0, b0 - f0});
      trace_->push_back({fmt::format("B mb{}", mb), "compute", b0, parallel::trace_us_since(trace_origin_) - b0});
    }
  }
  *compute_s = omp_get_wtime() - t0;
  *bubble_s = 0;
}

// pp > 1: this rank's action table (GPipe, 1F1B or interleaved), activations through the pool.
void Trainer::run_pipeline_step(double* loss_sum, double* compute_s, double* bubble_s) {
  const int64_t n = B_ * T_;
  const int S = pipeline_->plan.stages();
  auto fwd = [&](int mb, int c, const float* in, float* out) {
    Chunk& ch = *chunks_[size_t(c)];
    const bool first = ch.stage == 0, last = ch.stage == S - 1;
    const float loss = ch.model->forward(first ? tokens_.data() + mb * n : nullptr, in,
                                         last ? targets_.data() + mb * n : nullptr, mb);
    if (last) *loss_sum += double(loss);
    if (out) be_.copy(out, ch.model->output(mb), sizeof(float) * size_t(act_));
  };
  auto bwd = [&](int mb, int c, const float* grad_out, float* grad_in) {
    Chunk& ch = *chunks_[size_t(c)];
    ch.backward_count++;
    ch.model->backward(grad_out, backward_scale_, mb);
    sync_->micro_batch_done(c);
    if (grad_in) be_.copy(grad_in, ch.model->input_grad(), sizeof(float) * size_t(act_));
  };
  parallel::PipelineTiming timing;
  timing.events = trace_;
  timing.trace_origin = trace_origin_;
  parallel::run_pipeline(rt_.pp(), *messages_, *pipeline_, parallel::StageCallbacks{fwd, bwd}, &timing);
  *compute_s = timing.compute_s;
  *bubble_s = timing.bubble_s;
}

StepMetrics Trainer::train_step() {
  const double t0 = omp_get_wtime();
  rt_.ledger().reset();
  compressor_->begin_step(step_ + 1);
  sync_->begin_step();
  optimizer_->begin_step(step_ + 1);
  for (auto& ch : chunks_) ch->backward_count = 0;
  refresh_masters();
  // Every rank reads its replica's m micro-batches (all pipeline ranks alike, to stay in step).
  const int64_t n = B_ * T_;
  for (int64_t mb = 0; mb < m_; mb++) data_.next_batch(B_, T_, tokens_.data() + mb * n, targets_.data() + mb * n);

  // d(global mean loss) / d(micro-batch mean loss), times the fp16 loss scale: the backward's
  // initial dlogits are scaled, nothing else (Gpt::backward's loss_scale). S / x is S * (1 / x)
  // exactly for a power-of-two S, so fp32 and bf16 (S = 1) are unchanged bit for bit.
  backward_scale_ = float(scaler_.scale()) / float(m_ * rt_.dp().size());
  double loss_sum = 0, compute_s = 0, bubble_s = 0;
  run_micro_batches(&loss_sum, &compute_s, &bubble_s);
  // dp time spent inside the micro-batches (ZeRO 2's waits for its reduce-scatters, ZeRO 3's
  // gathers and reduce-scatters): the ledger was reset at the step's start.
  const double dp_in_micro_batches = parallel::comm_breakdown_s(rt_.ledger())["dp_comm"];
  sync_->finish();

  // The global mean loss: the last stage's sums over dp (tp rank 0 only: tp ranks agree).
  StepMetrics s;
  const bool reports = rt_.holds_loss() && rt_.mesh().coord.tp == 0;
  s.loss = rt_.world().sum(reports ? loss_sum : 0.0) / double(m_ * rt_.dp().size());
  const double t_opt = omp_get_wtime();
  // The norm of the unscaled gradients: the scaled ones' over S (exact for a power-of-two S).
  s.loss_scale = scaler_.enabled() ? scaler_.scale() : 0.0;
  s.grad_norm = std::sqrt(global_grad_norm_squared()) / scaler_.scale();
  if (opt_.inject_nan_at_step == step_ + 1) {
    s.loss = std::nan("");
    opt_.inject_nan_at_step = -1;  // once: a skipped step is retried with the next batch
  }
  // fp16: a finite loss with inf/NaN gradients is an overflow of the scaled backward.
  if (scaler_.enabled() && std::isfinite(s.loss) && !std::isfinite(s.grad_norm)) return skip_overflow(s, t0);
  // A non-finite loss or gradient never reaches the weights. Both numbers are global (summed over
  // the world), so every rank takes the same branch: no rank updates while another skips.
  if (!std::isfinite(s.loss) || !std::isfinite(s.grad_norm)) {
    sync_->discard();
    s.nonfinite = true;
    s.skipped = opt_.skip_nonfinite;
    s.step = step_;
    s.seconds = omp_get_wtime() - t0;
    return s;
  }
  double clip_scale = 1.0;  // as torch.nn.utils.clip_grad_norm_
  if (opt_.train.grad_clip > 0) clip_scale = std::min(1.0, opt_.train.grad_clip / (s.grad_norm + 1e-6));
  const TrainSpec& ts = opt_.train;
  s.lr = lr_at(step_, ts.lr, ts.min_lr, ts.warmup_steps, ts.steps);
  // Unscaling folded into the optimizer's gradient factor (every optimizer multiplies each gradient
  // by grad_scale first, optim/optimizer.hpp): g (clip / S) equals (g / S) clip bit for bit when S
  // is a power of two (the defaults keep it one; other initial/growth/backoff settings round once
  // more, at fp32's rounding); one pass over the gradients fewer than unscaling them in place.
  sync_->apply(OptimStep{step_ + 1, float(s.lr), float(clip_scale) / float(scaler_.scale())});
  scaler_.update(false);  // a good step: the growth counter (GradScaler.update after step)
  s.skipped_steps = scaler_.state().skipped_steps;
  step_ += 1;
  s.step = step_;
  return finish_metrics(s, t0, t_opt, compute_s, bubble_s, dp_in_micro_batches);
}

// Every rank's share of the norm^2 of the (scaled) gradients, summed over the world: every rank
// that holds gradients (dp, tp, pp) takes part, each element counted once (GradSync's counting).
// The squares and the sum are float64 (Backend::sum_squares), so the sum is non-finite exactly
// when some element on some rank is inf or NaN (a float's square is finite in float64): this one
// all-reduce is also fp16's overflow check, the found_inf flag GradScaler and Megatron all-reduce
// with MAX.
double Trainer::global_grad_norm_squared() {
  double local = sync_->grad_norm_squared();
  if (opt_.inject_overflow_at_step == step_ + 1) {
    if (rt_.world().rank() == opt_.inject_overflow_rank) local = std::numeric_limits<double>::infinity();
    opt_.inject_overflow_at_step = -1;
  }
  return rt_.world().sum(local);
}

// fp16 overflow (the same verdict on every rank: the norm is global): the step is not applied,
// the optimizer is not called (its state and step count stay), the step counter and so the
// learning-rate schedule do not advance (Megatron steps its scheduler only after a successful
// update), the batch is consumed (as GradScaler's and Megatron's loops), and the scale backs off.
// A backoff below min_loss_scale stops the run on every rank alike (EveryRankError).
StepMetrics Trainer::skip_overflow(StepMetrics s, double t0) {
  sync_->discard();
  on_every_rank([&] { scaler_.update(true); });
  s.overflow = s.skipped = s.nonfinite = true;
  s.skipped_steps = scaler_.state().skipped_steps;
  s.step = step_;
  s.seconds = omp_get_wtime() - t0;
  return s;
}

StepMetrics Trainer::finish_metrics(StepMetrics s, double t0, double t_opt, double compute_s, double bubble_s,
                                    double dp_in_micro_batches) {
  const double t1 = omp_get_wtime();
  s.seconds = t1 - t0;
  s.tokens_per_s = double(m_ * rt_.dp().size() * B_ * T_) / s.seconds;
  s.breakdown_s = parallel::comm_breakdown_s(rt_.ledger());
  // Communication inside the compute callbacks (tp collectives, dp waits, pipeline waits) is
  // reported under its own name, so compute excludes it (run_pipeline's compute_s already
  // excludes its pipeline waits).
  s.breakdown_s["compute"] = std::max(0.0, compute_s - s.breakdown_s["tp_comm"] - dp_in_micro_batches);
  s.breakdown_s["optimizer"] = t1 - t_opt;
  s.breakdown_s["pp_bubble"] = std::max(s.breakdown_s["pp_bubble"], bubble_s);
  s.bytes = rt_.ledger().bytes;
  s.buckets_launched_early = sync_->buckets_launched_early();
  s.compression = compressor_->step_stats();
  s.optimizer_fallbacks = optimizer_->fallbacks();
  s.gflops = local_flops_per_step() / s.seconds / 1e9;
  if (opt_.peak_gflops <= 0) opt_.peak_gflops = cached_sgemm_peak_gflops(be_, omp_get_max_threads());
  s.mfu = s.gflops / opt_.peak_gflops;
  s.peak_rss_bytes = peak_rss_bytes();
  s.accounted_bytes = accounted_bytes();
  return s;
}

double Trainer::local_flops_per_step() const {
  double f = 0;
  for (const auto& ch : chunks_) f += ch->model->flops_per_step();  // per micro-batch of B x T
  return f * double(m_);
}

// Forward only, stage by stage: the owner of stage s receives stage s-1's output from its owner
// (a blocking receive on the pp group), runs its chunk and sends the result on. One chain at a
// time, so no schedule is needed and no deadlock is possible. Every rank of a dp replica group runs
// the same number of passes (ZeRO 3 gathers each layer collectively over dp): a replica whose share
// of the batches ends early runs batch 0 again and does not count it.
double Trainer::evaluate(int64_t batches, const ValBatchFn& val_batch) {
  EXA_CHECK(batches > 0, "evaluate: batches must be > 0, got {}", batches);
  const int64_t n = B_ * T_;
  const parallel::PipelinePlan pipe = parallel::pipeline_plan(opt_.plan);
  const int S = pipe.stages(), dp = rt_.dp().size(), dp_rank = rt_.dp().rank(), pp_rank = rt_.mesh().coord.pp;
  std::vector<std::pair<int, int>> owner(size_t(S), {-1, -1});  // owner[s] = (pp rank, chunk) of stage s
  for (int r = 0; r < pipe.pp; r++)
    for (int c = 0; c < pipe.vp; c++) owner[size_t(parallel::stage_of(pipe, r, c))] = {r, c};
  std::vector<int32_t> tokens(static_cast<size_t>(n)), targets(static_cast<size_t>(n));
  DeviceBuffer in = messages_->take(), out = messages_->take();
  refresh_masters();
  double sum = 0;
  for (int64_t round = 0; round < (batches + dp - 1) / dp; round++) {
    const int64_t i = round * dp + dp_rank;
    const bool counted = i < batches;
    val_batch(counted ? i : 0, tokens.data(), targets.data());
    for (int s = 0; s < S; s++) {
      const auto [r, c] = owner[size_t(s)];
      if (r != pp_rank) continue;
      if (s > 0 && owner[size_t(s - 1)].first != pp_rank) {
        DeviceBuffer w = messages_->take_wire();
        rt_.pp().recv(w.data(), act_, messages_->wire_dtype(), owner[size_t(s - 1)].first, 7101);
        messages_->give(std::move(in));
        in = messages_->from_wire(std::move(w));
      } else if (s > 0) {
        be_.copy(in.data(), out.data(), sizeof(float) * size_t(act_));
      }
      Gpt& g = *chunks_[size_t(c)]->model;
      const float loss = g.forward(s == 0 ? tokens.data() : nullptr, s == 0 ? nullptr : in.data(),
                                   s == S - 1 ? targets.data() : nullptr, 0);
      if (s == S - 1) {
        if (counted && rt_.mesh().coord.tp == 0) sum += double(loss);
        continue;
      }
      be_.copy(out.data(), g.output(0), sizeof(float) * size_t(act_));
      if (owner[size_t(s + 1)].first != pp_rank) {  // as the training pipeline sends it
        DeviceBuffer w = messages_->to_wire(std::move(out));
        rt_.pp().send(w.data(), act_, messages_->wire_dtype(), owner[size_t(s + 1)].first, 7101, "pp_eval");
        messages_->give_wire(std::move(w));
        out = messages_->take();
      }
    }
  }
  messages_->give(std::move(in));
  messages_->give(std::move(out));
  return rt_.world().sum(sum) / double(batches);
}

}  // namespace exatrain
