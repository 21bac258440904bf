#include "parallel/distributed_trainer.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "core/check.hpp"
#include "optim/adamw.hpp"
#include "parallel/executor.hpp"
#include "parallel/tp_hooks.hpp"
#include "parallel/zero.hpp"

namespace exatrain::parallel {

namespace {
struct Range {
  int64_t offset = 0, len = 0;
};
}  // namespace

// The engine's ParallelHooks over the tp group (MpiParallelHooks) plus the layer boundaries,
// which the trainer uses for the data-parallel side (ZeRO-3 gathers, bucketed gradient launches).
class DistHooks final : public MpiParallelHooks {
 public:
  DistHooks(Group& tp, DistributedTrainer& owner, int chunk) : MpiParallelHooks(tp), owner_(owner), chunk_(chunk) {}
  void before_layer(int64_t unit, Pass pass) override { owner_.on_before_layer(chunk_, unit, pass); }
  void after_layer(int64_t unit, Pass pass) override { owner_.on_after_layer(chunk_, unit, pass); }

 private:
  DistributedTrainer& owner_;
  int chunk_;
};

struct DistributedTrainer::Chunk {
  int stage = 0;
  std::unique_ptr<DistHooks> hooks;
  std::unique_ptr<Gpt> model;
  std::map<int64_t, std::vector<Range>> unit_ranges;  // layer / kEmbedding / kHead -> arena ranges
  std::vector<Range> sp_partial;   // sequence parallel: gradients that are partial sums over tp
  std::vector<Range> counted;      // arena ranges that count in the global grad norm (ascending;
                                   // ranges, not a flag per element: ZeRO 3 keeps nothing full-size)
  Range tied_wte;                  // the tied embedding's range on the first or last stage (len 0: none)
  int backward_count = 0;          // backwards of this step so far (the m-th one is the last)
  std::unique_ptr<GradBucketer> bucketer;  // ZeRO 0 with dp > 1 (all-reduce); ZeRO 2 (reduce-scatter)
  std::vector<ShardRange> owned;           // ZeRO 2 buckets: the arena ranges this rank updates
  std::unique_ptr<AdamW> adamw;            // ZeRO 0
  // ZeRO 1 (and 2 at dp 1): this rank's shard of the gradients and optimizer state; padded copies
  // of the arenas only when dp does not divide them (ZeRO 3: staging for a segment's collectives).
  ZeroLayout zl;
  std::vector<float> grad_pad, param_pad, grad_shard, m, v;
  // ZeRO 3: every unit's contiguous arena range is sharded on its own over dp; this rank keeps
  // only its shard of the parameters (the master copy), gradients and moments.
  struct Segment {
    Range range;          // in the model's arena
    ZeroLayout zl;
    std::vector<float> param, grad, m, v;  // [zl.shard]
  };
  std::vector<Segment> segments;
  std::map<int64_t, std::vector<int>> gather_segments;  // unit -> segments its pass reads
  std::map<int64_t, std::vector<int>> own_segments;     // unit -> segments whose gradients it makes
  int tied_segment = -1;  // the tied embedding copy's segment (first / last stage of a pipeline)
  int64_t tied_shard = 0;  // bucketed ZeRO 2: floats of the shard's start that are the tied copy's
};

static int64_t unit_of(const std::string& name) {
  if (name.rfind("h.", 0) == 0) return std::stoll(name.substr(2, name.find('.', 2) - 2));
  if (name.rfind("ln_f.", 0) == 0 || name.rfind("lm_head.", 0) == 0) return ParallelHooks::kHead;
  return ParallelHooks::kEmbedding;  // wte, wpe
}

DistributedTrainer::DistributedTrainer(Backend& backend, ParallelRuntime& rt, const DistOptions& options,
                                       TokenSource& data)
    : be_(backend), rt_(rt), opt_(options), data_(data), plan_(rt.plan()) {
  const MeshShape& mesh = plan_.mesh;
  EXA_CHECK(mesh.cp == 1, "[parallel] cp = {}: context parallelism is planned but not run by the trainer "
            "(expected cp = 1)", mesh.cp);
  EXA_CHECK(opt_.train.optimizer == "adamw", "train.optimizer = \"{}\": only \"adamw\" is implemented",
            opt_.train.optimizer);
  B_ = plan_.micro_batch;
  T_ = opt_.model.seq_len;
  m_ = plan_.micro_batches;
  const int pp = mesh.pp, vp = plan_.pipeline.vp, S = pp * vp;
  const int pp_rank = rt_.mesh().coord.pp;
  // Contiguous layer ranges for the S stages: [parallel] layers_per_stage, else balanced by cost
  // with the embedding and the LM head counted (plan/stages.hpp) -- the same split the planner
  // predicts and counts bytes for.
  const std::vector<StageLayers> stages =
      plan::pipeline_stages(opt_.model, pp, vp, opt_.layers_per_stage);
  const int dp = rt_.dp().size(), dp_rank = rt_.dp().rank();
  for (int c = 0; c < vp; c++) {
    auto ch = std::make_unique<Chunk>();
    ch->stage = stage_of(plan_.pipeline, pp_rank, c);
    GptOptions g;
    g.model = opt_.model;
    g.tp = TensorParallel{rt_.mesh().coord.tp, mesh.tp, plan_.seq_parallel};
    g.stage = StageRange{stages[size_t(ch->stage)].first, stages[size_t(ch->stage)].end, ch->stage == 0,
                         ch->stage == S - 1};
    g.recompute = plan_.recompute;
    g.micro_batch = B_;
    g.seq = T_;
    g.activation_slots = pp > 1 ? m_ : 1;  // pipeline: micro-batch mb keeps slot mb
    // ZeRO 3 never holds the full parameter arena: each rank initialises its shards (setup_zero3)
    // and gathers one unit at a time. ZeRO 2/3 gradients stay in the arena only until their
    // reduce-scatter, whose pages then go back to the OS.
    g.lazy_params = plan_.zero == 3;
    g.lazy_grads = plan_.zero >= 2;
    ch->hooks = std::make_unique<DistHooks>(rt_.tp(), *this, c);
    ch->model = std::make_unique<Gpt>(be_, g, ch->hooks.get());
    if (plan_.zero != 3) ch->model->init_weights(opt_.train.seed);
    const ParamLayout& layout = ch->model->layout();
    const bool tied_copy = g.stage.has_head && !g.stage.has_embedding && opt_.model.tie_embeddings;
    for (const ParamInfo& p : layout.entries()) {
      int64_t unit = unit_of(p.name);
      if (p.name == "wte.weight" && tied_copy) unit = ParallelHooks::kHead;  // only the head reads it
      ch->unit_ranges[unit].push_back({p.offset, p.numel});
      if (p.sp_partial_grad) ch->sp_partial.push_back({p.offset, p.numel});
      if (p.name == "wte.weight" && opt_.model.tie_embeddings && S > 1) ch->tied_wte = {p.offset, p.numel};
      // Count each global element once: tp-replicated on tp rank 0; the tied copy not at all.
      const bool count = (p.split_dim >= 0 || rt_.mesh().coord.tp == 0) && !(tied_copy && p.name == "wte.weight");
      if (count && !ch->counted.empty() && ch->counted.back().offset + ch->counted.back().len == p.offset)
        ch->counted.back().len += p.numel;
      else if (count)
        ch->counted.push_back({p.offset, p.numel});
    }
    AdamWConfig ac{float(opt_.train.beta1), float(opt_.train.beta2), float(opt_.train.eps),
                   float(opt_.train.weight_decay)};
    if (plan_.zero == 0) {
      ch->adamw = std::make_unique<AdamW>(be_, layout, ac);
      if (dp > 1)
        ch->bucketer = std::make_unique<GradBucketer>(rt_.dp(), ch->model->grads(), layout.total(),
                                                      std::min(opt_.bucket_floats, layout.total()));
    } else if (plan_.zero == 2 && dp > 1) {
      EXA_CHECK(ch->tied_wte.len == 0 || ch->tied_wte.offset == 0,
                "ZeRO 2: the tied embedding's copy must start the arena (it is at offset {})", ch->tied_wte.offset);
      // Not clamped to the arena: the tied embedding's buckets must not depend on the stage's size.
      // dp divides it: equal chunks (bar the buckets that end at a split or at the arena's end).
      const int64_t bucket = std::max<int64_t>(dp, opt_.bucket_floats - opt_.bucket_floats % dp);
      // A tied embedding (at offset 0 on the first and the last stage) ends a bucket, so its
      // buckets, and the chunks a dp rank owns of them, are the same on both stages: the tied
      // gradient exchange then moves only those chunks (the start of the shard).
      std::vector<int64_t> splits;
      if (ch->tied_wte.len > 0) splits.push_back(ch->tied_wte.len);
      ch->bucketer = std::make_unique<GradBucketer>(rt_.dp(), ch->model->grads(), layout.total(), bucket,
                                                    BucketOp::reduce_scatter, splits, opt_.buckets_in_flight);
      ch->owned = ch->bucketer->owned_ranges(dp_rank);
      int64_t mine = 0;
      for (const ShardRange& r : ch->owned) {
        mine += r.size();
        if (r.end <= ch->tied_wte.len) ch->tied_shard = mine;  // my chunks of the embedding's buckets
      }
      ch->m.assign(size_t(mine), 0.0f);
      ch->v.assign(size_t(mine), 0.0f);
    } else if (plan_.zero == 3) {
      setup_zero3(*ch);
    } else {
      // align 1: no padding when dp divides the arena, so the bytes equal the planner's flat buffer
      // and the collectives work on the model's arenas themselves (padded copies otherwise).
      ch->zl = ZeroLayout::make(layout.total(), dp, 1);
      if (ch->zl.padded != layout.total()) {
        ch->grad_pad.assign(size_t(ch->zl.padded), 0.0f);
        ch->param_pad.assign(size_t(ch->zl.padded), 0.0f);
      }
      ch->grad_shard.assign(size_t(ch->zl.shard), 0.0f);
      ch->m.assign(size_t(ch->zl.shard), 0.0f);
      ch->v.assign(size_t(ch->zl.shard), 0.0f);
    }
    chunks_.push_back(std::move(ch));
  }
  tokens_.resize(size_t(m_ * B_ * T_));
  targets_.resize(size_t(m_ * B_ * T_));
}

DistributedTrainer::~DistributedTrainer() = default;

Gpt& DistributedTrainer::chunk(int c) { return *chunks_.at(size_t(c))->model; }
void DistributedTrainer::gather_full_params() {
  if (plan_.zero != 3) return;
  for (auto& ch : chunks_)
    for (int sidx = 0; sidx < int(ch->segments.size()); sidx++) gather_segment(*ch, sidx);
}

void DistributedTrainer::release_full_params() {
  if (plan_.zero != 3) return;
  for (auto& ch : chunks_)
    for (int sidx = 0; sidx < int(ch->segments.size()); sidx++) release_segment(*ch, sidx);
}

// Adds `kind` over the whole arena [0, n) of `data`, cut at the ranges this rank saves (sorted,
// disjoint): the saved ranges are marked saver, the gaps between them not.
static void add_arena_slices(std::vector<DistributedTrainer::StateSlice>& out, int chunk,
                             DistributedTrainer::StateKind kind, float* data, int64_t n,
                             const std::vector<ShardRange>& saved) {
  int64_t at = 0;
  auto add = [&](int64_t b, int64_t e, bool saver) {
    if (b < e) out.push_back({chunk, kind, b, e, data + b, saver});
  };
  for (const ShardRange& r : saved) {
    add(at, r.begin, false);
    add(r.begin, r.end, true);
    at = r.end;
  }
  add(at, n, false);
}

std::vector<DistributedTrainer::StateSlice> DistributedTrainer::state_slices() {
  using K = StateKind;
  std::vector<StateSlice> out;
  const int r = rt_.dp().rank(), dp = rt_.dp().size();
  for (int c = 0; c < chunks(); c++) {
    Chunk& ch = *chunks_[size_t(c)];
    const int64_t n = ch.model->num_params();
    float* params = ch.model->params();
    if (ch.adamw) {  // ZeRO 0: every replica holds everything; replica r saves chunk r of it
      const ShardRange mine = ZeroLayout::make(n, dp, 1).owned(r);
      const std::vector<ShardRange> saved = mine.size() > 0 ? std::vector<ShardRange>{mine} : std::vector<ShardRange>{};
      add_arena_slices(out, c, K::params, params, n, saved);
      add_arena_slices(out, c, K::m, ch.adamw->m(), n, saved);
      add_arena_slices(out, c, K::v, ch.adamw->v(), n, saved);
    } else if (ch.bucketer) {  // bucketed ZeRO 2: my chunk of every bucket, moments back to back
      add_arena_slices(out, c, K::params, params, n, ch.owned);
      int64_t k = 0;
      for (const ShardRange& o : ch.owned) {
        out.push_back({c, K::m, o.begin, o.end, ch.m.data() + k, true});
        out.push_back({c, K::v, o.begin, o.end, ch.v.data() + k, true});
        k += o.size();
      }
    } else if (plan_.zero <= 2) {  // ZeRO 1/2: one shard of the padded arena
      const ShardRange own = ch.zl.owned(r);
      const int64_t base = ch.zl.range(r).begin;
      add_arena_slices(out, c, K::params, params, n, own.size() > 0 ? std::vector<ShardRange>{own} : std::vector<ShardRange>{});
      if (own.size() > 0) {
        out.push_back({c, K::m, own.begin, own.end, ch.m.data() + (own.begin - base), true});
        out.push_back({c, K::v, own.begin, own.end, ch.v.data() + (own.begin - base), true});
      }
    } else {  // ZeRO 3: only my shard of every segment, parameters (the master copy) included
      for (Chunk::Segment& seg : ch.segments) {
        const ShardRange own = seg.zl.owned(r);
        if (own.size() == 0) continue;
        const int64_t k = own.begin - seg.zl.range(r).begin, b = seg.range.offset + own.begin;
        const int64_t e = seg.range.offset + own.end;
        out.push_back({c, K::params, b, e, seg.param.data() + k, true});
        out.push_back({c, K::m, b, e, seg.m.data() + k, true});
        out.push_back({c, K::v, b, e, seg.v.data() + k, true});
      }
    }
  }
  return out;
}

bool DistributedTrainer::saves_entry(int c, const ParamInfo& p) const {
  const Chunk& ch = *chunks_.at(size_t(c));
  if (p.split_dim < 0 && rt_.mesh().coord.tp != 0) return false;
  const StageRange& st = ch.model->options().stage;
  const bool tied_copy = st.has_head && !st.has_embedding && opt_.model.tie_embeddings;
  return !(tied_copy && p.name == "wte.weight");
}

int64_t DistributedTrainer::params_on_rank() const {
  int64_t n = 0;
  for (const auto& ch : chunks_) n += ch->model->num_params();
  return n;
}

void DistributedTrainer::setup_zero3(Chunk& ch) {
  const int dp = rt_.dp().size(), r = rt_.dp().rank();
  const std::vector<ParamInfo>& entries = ch.model->layout().entries();
  for (auto& [unit, ranges] : ch.unit_ranges) {
    std::vector<Range> sorted = ranges;
    std::sort(sorted.begin(), sorted.end(), [](const Range& a, const Range& b) { return a.offset < b.offset; });
    std::vector<Range> merged;
    // A tied embedding's copy (first and last stage) is a segment of its own: the same ZeroLayout
    // on both stages, so a dp rank owns the same shard of it on each and the tied gradient
    // exchange moves only that shard.
    auto tied = [&](const Range& r) { return ch.tied_wte.len > 0 && r.offset == ch.tied_wte.offset; };
    for (const Range& x : sorted) {
      if (!merged.empty() && merged.back().offset + merged.back().len == x.offset && !tied(x) && !tied(merged.back()))
        merged.back().len += x.len;
      else
        merged.push_back(x);
    }
    for (const Range& x : merged) {
      Chunk::Segment seg;
      seg.range = x;
      seg.zl = ZeroLayout::make(x.len, dp, 1);
      const size_t shard = size_t(seg.zl.shard);
      seg.param.assign(shard, 0.0f), seg.grad.assign(shard, 0.0f), seg.m.assign(shard, 0.0f), seg.v.assign(shard, 0.0f);
      // My shard's values straight from the seed (init_param_range: the values init_weights
      // would write there), entry by entry; the model's arena is never written.
      const ShardRange own = seg.zl.owned(r);
      const int64_t lo = x.offset + own.begin, hi = x.offset + own.end, base = x.offset + seg.zl.range(r).begin;
      for (const ParamInfo& p : entries) {
        const int64_t a = std::max(lo, p.offset), b = std::min(hi, p.offset + p.numel);
        if (a < b) init_param_range(p, opt_.train.seed, a - p.offset, b - a, seg.param.data() + (a - base));
      }
      if (tied(x)) ch.tied_segment = int(ch.segments.size());
      ch.own_segments[unit].push_back(int(ch.segments.size()));
      ch.gather_segments[unit].push_back(int(ch.segments.size()));
      ch.segments.push_back(std::move(seg));
    }
  }
  // The head of a single-stage model reads the tied embedding too.
  if (opt_.model.tie_embeddings && ch.model->options().stage.has_head && ch.model->options().stage.has_embedding)
    for (int sidx : ch.own_segments[ParallelHooks::kEmbedding]) ch.gather_segments[ParallelHooks::kHead].push_back(sidx);
  // Every segment starts released (its pages returned to the OS, its partial pages NaN).
  for (int sidx = 0; sidx < int(ch.segments.size()); sidx++) release_segment(ch, sidx);
}

// ZeRO 3: all-gather a segment's parameters into the model's arena: in place when dp divides the
// segment, else through a padded staging copy.
void DistributedTrainer::gather_segment(Chunk& ch, int sidx) {
  Chunk::Segment& seg = ch.segments[size_t(sidx)];
  const int r = rt_.dp().rank();
  if (seg.zl.padded == seg.range.len) {
    float* dst = ch.model->params() + seg.range.offset;
    std::copy(seg.param.begin(), seg.param.end(), dst + seg.zl.range(r).begin);
    rt_.dp().all_gather(nullptr, dst, seg.zl.shard);
    return;
  }
  std::vector<float>& staging = ch.param_pad;
  staging.resize(std::max(staging.size(), size_t(seg.zl.padded)));
  std::copy(seg.param.begin(), seg.param.end(), staging.begin() + seg.zl.range(r).begin);
  rt_.dp().all_gather(nullptr, staging.data(), seg.zl.shard);
  std::copy_n(staging.begin(), seg.range.len, ch.model->params() + seg.range.offset);
}

// ZeRO 3: the memory of a released segment goes back to the OS: the whole pages inside it are
// dropped with madvise(MADV_DONTNEED) (they read 0 until the next gather writes them, and then
// cost a page fault each), the partial pages at its two ends, shared with neighbours, are
// overwritten with NaN so a pass that used a released weight there still poisons the loss.
void DistributedTrainer::release_segment(Chunk& ch, int sidx) {
  const Range& x = ch.segments[size_t(sidx)].range;
  return_pages(ch.model->params() + x.offset, x.len, std::numeric_limits<float>::quiet_NaN(),
               "released ZeRO-3 parameters");
}

// ZeRO 3: this micro-batch's gradients of a segment, reduce-scattered over dp into my shard. The
// segment's range of the gradient arena then reads 0 again for the next micro-batch: its whole
// pages go back to the OS (the arena is never zeroed as a whole), the floats on the partial pages
// it shares with its neighbours are set to 0.
void DistributedTrainer::reduce_scatter_segment(Chunk& ch, int sidx) {
  Chunk::Segment& seg = ch.segments[size_t(sidx)];
  float* g = ch.model->grads() + seg.range.offset;
  std::vector<float>& out = ch.grad_shard;
  out.resize(size_t(seg.zl.shard));
  if (seg.zl.padded == seg.range.len) {  // straight from the arena
    reduce_scatter_grads(rt_.dp(), seg.zl, g, out.data(), 1.0f);
  } else {  // through a zero-padded staging copy
    std::vector<float>& staging = ch.grad_pad;
    staging.assign(size_t(seg.zl.padded), 0.0f);
    std::copy_n(g, seg.range.len, staging.begin());
    reduce_scatter_grads(rt_.dp(), seg.zl, staging.data(), out.data(), 1.0f);
  }
  return_pages(g, seg.range.len, 0.0f, "reduce-scattered ZeRO-3 gradients");
  for (int64_t i = 0; i < seg.zl.shard; i++) seg.grad[size_t(i)] += out[size_t(i)];
}

void DistributedTrainer::on_before_layer(int c, int64_t unit, ParallelHooks::Pass) {
  if (plan_.zero != 3) return;
  Chunk& ch = *chunks_[size_t(c)];
  for (int sidx : ch.gather_segments[unit]) gather_segment(ch, sidx);
}

void DistributedTrainer::reduce_sp_partial(Chunk& ch, int64_t unit) {
  auto it = ch.unit_ranges.find(unit);
  if (it == ch.unit_ranges.end()) return;
  float* g = ch.model->grads();
  for (const Range& r : it->second)
    for (const Range& s : ch.sp_partial)
      if (s.offset >= r.offset && s.offset + s.len <= r.offset + r.len) rt_.tp().all_reduce_sum(g + s.offset, s.len);
}

// After the LAST micro-batch's backward through a unit its gradients are final on this rank:
// finish the sequence-parallel partial sums, then hand the unit to the dp bucketer (ZeRO 0), whose
// all-reduces run while backward continues with the earlier layers.
void DistributedTrainer::on_after_layer(int c, int64_t unit, ParallelHooks::Pass pass) {
  Chunk& ch = *chunks_[size_t(c)];
  const bool backward = pass == ParallelHooks::Pass::backward;
  hand_over_gradients(ch, unit, backward);
  if (backward && opt_.after_backward_unit) opt_.after_backward_unit(c, unit);
}

void DistributedTrainer::hand_over_gradients(Chunk& ch, int64_t unit, bool backward) {
  if (plan_.zero == 3) {
    // ZeRO 3: gradients leave for their owners after every micro-batch; parameters are released.
    if (backward) {
      reduce_sp_partial(ch, unit);  // per micro-batch here: the owner only sees the sum
      for (int sidx : ch.own_segments[unit]) reduce_scatter_segment(ch, sidx);
    }
    for (int sidx : ch.gather_segments[unit]) release_segment(ch, sidx);
    return;
  }
  const bool zero2_buckets = plan_.zero == 2 && ch.bucketer;
  // ZeRO 2 (DeepSpeed stage 2): every micro-batch's gradients go to their owners as backward makes
  // them (the tied embedding's copy too: its two stages' sums are added on the shards afterwards).
  // ZeRO 0: after the last micro-batch only (the replicas accumulate locally first).
  if (!backward || (!zero2_buckets && ch.backward_count != m_)) return;
  reduce_sp_partial(ch, unit);
  auto it = ch.unit_ranges.find(unit);
  if (ch.bucketer && it != ch.unit_ranges.end())
    for (const Range& r : it->second)  // ZeRO 0: the tied embedding waits for the other stage's copy
      if (zero2_buckets || !(ch.tied_wte.len > 0 && r.offset == ch.tied_wte.offset))
        ch.bucketer->mark_ready(r.offset, r.len);
}

void DistributedTrainer::run_micro_batches(double* loss_sum, double* compute_s, double* bubble_s) {
  const int64_t n = B_ * T_;
  const int dp = rt_.dp().size();
  const float scale = 1.0f / float(m_ * dp);  // d(global mean loss) / d(micro-batch mean loss)
  const int S = plan_.pipeline.stages();
  // Floats of one stage boundary message: [B, T, C], or this rank's [B*T/tp, C] rows under sp.
  const int64_t act = (plan_.seq_parallel ? n / plan_.mesh.tp : n) * opt_.model.hidden;
  auto fwd = [&](int mb, int c, const float* in, float* out) {
    Chunk& ch = *chunks_[size_t(c)];
    const bool first = ch.stage == 0, last = ch.stage == S - 1;
    const int64_t slot = plan_.mesh.pp > 1 ? mb : 0;
    const float loss = ch.model->forward(first ? tokens_.data() + mb * n : nullptr, in,
                                         last ? targets_.data() + mb * n : nullptr, slot);
    if (last) *loss_sum += double(loss);
    if (out) be_.copy(out, ch.model->output(slot), sizeof(float) * size_t(act));
  };
  auto bwd = [&](int mb, int c, const float* grad_out, float* grad_in) {
    Chunk& ch = *chunks_[size_t(c)];
    ch.backward_count++;
    const int64_t slot = plan_.mesh.pp > 1 ? mb : 0;
    ch.model->backward(grad_out, scale, slot);
    if (plan_.zero == 2 && ch.bucketer) ch.bucketer->end_micro_batch();  // the shard has this micro-batch
    if (grad_in)
      be_.copy(grad_in, ch.model->input_grad(), sizeof(float) * size_t(act));
  };
  if (plan_.mesh.pp == 1) {
    const double t0 = omp_get_wtime();
    for (int mb = 0; mb < int(m_); mb++) {
      const double f0 = trace_us_since(trace_origin_);
      fwd(mb, 0, nullptr, nullptr);
      const double b0 = trace_us_since(trace_origin_);
      bwd(mb, 0, nullptr, nullptr);
      if (trace_) {
        trace_->push_back({fmt::format("F mb{}", mb), "compute", f0, b0 - f0});
        trace_->push_back({fmt::format("B mb{}", mb), "compute", b0, trace_us_since(trace_origin_) - b0});
      }
    }
    *compute_s = omp_get_wtime() - t0;
    *bubble_s = 0;
    return;
  }
  const PipelineTable table = build_pipeline(plan_.pipeline);
  PipelineTiming timing;
  timing.events = trace_;
  timing.trace_origin = trace_origin_;
  run_pipeline(rt_.pp(), table, act, StageCallbacks{fwd, bwd}, &timing);
  *compute_s = timing.compute_s;
  *bubble_s = timing.bubble_s;
}

// The first and last stage each hold the tied embedding; the full gradient is the sum of both
// copies' (Megatron's embedding group). Both ranks compute a + b (commutative: identical bits).
// Counted under "pp_send" (a point-to-point message on the pp group: the whole copy, each side),
// as plan::bytes_sent_per_step counts it on the first and last stage.
// Bucketed ZeRO 2: the sums are on the shards already; each rank exchanges only the chunks it owns
// of the embedding's buckets (the same on both stages: the first tied_shard floats of its shard)
// with the same dp (and tp) rank of the other stage. ZeRO 3: likewise, the shard of the
// embedding's own segment (the same ZeroLayout on both stages).
void DistributedTrainer::tied_embedding_sum() {
  const int pp = plan_.mesh.pp;
  if (!opt_.model.tie_embeddings || plan_.pipeline.stages() == 1) return;
  for (auto& ch : chunks_) {
    if (ch->tied_wte.len == 0) continue;
    const int peer = ch->stage == 0 ? pp - 1 : 0;
    float* g = ch->model->grads() + ch->tied_wte.offset;
    int64_t len = ch->tied_wte.len;
    if (plan_.zero == 2 && ch->bucketer) {
      g = ch->bucketer->shard_grads();
      len = ch->tied_shard;
    } else if (plan_.zero == 3) {
      Chunk::Segment& seg = ch->segments.at(size_t(ch->tied_segment));
      g = seg.grad.data();
      len = seg.zl.shard;
    }
    std::vector<float> other(static_cast<size_t>(len));
    WatchdogScope watch(rt_.watchdog(), "world", ++world_ops_, "MPI_Sendrecv (tied embedding gradient)");
    const double t0 = MPI_Wtime();
    mpi_check(MPI_Sendrecv(g, int(len), MPI_FLOAT, peer, 7001, other.data(), int(len), MPI_FLOAT, peer, 7001,
                           rt_.pp().comm(), MPI_STATUS_IGNORE),
              "MPI_Sendrecv (tied embedding gradient)");
    rt_.ledger().add("pp_send", int64_t(sizeof(float)) * len);
    rt_.ledger().seconds["pp_send"] += MPI_Wtime() - t0;
    for (int64_t i = 0; i < len; i++) g[i] += other[size_t(i)];
  }
}

void DistributedTrainer::reduce_gradients() {
  if (plan_.zero == 3) {  // reduce-scattered during backward; the tied copies summed on the shards
    tied_embedding_sum();
    return;
  }
  // Bucketed ZeRO 2 reduce-scattered every micro-batch during backward; finish() only takes the
  // step's counters. Its tied embedding is summed on the shards, the others' before the dp
  // reduction (linear, and ZeRO 1 shards need the full sum).
  if (plan_.zero == 2)
    for (auto& ch : chunks_)
      if (ch->bucketer) ch->bucketer->finish(1.0f);
  tied_embedding_sum();
  for (auto& ch : chunks_) {
    if (plan_.zero == 2 && ch->bucketer) continue;
    if (ch->bucketer) {  // ZeRO 0: the tied range, then wait for every bucket
      if (ch->tied_wte.len > 0) ch->bucketer->mark_ready(ch->tied_wte.offset, ch->tied_wte.len);
      ch->bucketer->finish(1.0f);
    } else if (plan_.zero >= 1) {  // ZeRO 1: straight from the arena unless it needs padding
      const float* grads = ch->model->grads();
      if (!ch->grad_pad.empty()) {
        std::copy_n(grads, ch->model->num_params(), ch->grad_pad.begin());
        grads = ch->grad_pad.data();
      }
      reduce_scatter_grads(rt_.dp(), ch->zl, grads, ch->grad_shard.data(), 1.0f);
    }
  }
}

// Sum of squares of g[i - begin] over the arena elements i in [begin, end) that lie in `counted`,
// in ascending order of i.
static double counted_squares(const std::vector<Range>& counted, const float* g, int64_t begin, int64_t end) {
  double s = 0;
  for (const Range& r : counted) {
    const int64_t lo = std::max(begin, r.offset), hi = std::min(end, r.offset + r.len);
    for (int64_t i = lo; i < hi; i++) s += double(g[i - begin]) * double(g[i - begin]);
  }
  return s;
}

double DistributedTrainer::grad_norm_squared() {
  double local = 0;
  const int dp_rank = rt_.dp().rank();
  for (auto& ch : chunks_) {
    if (plan_.zero == 3) {
      for (const Chunk::Segment& seg : ch->segments) {
        const ShardRange own = seg.zl.owned(dp_rank);
        const int64_t base = seg.zl.range(dp_rank).begin;
        local += counted_squares(ch->counted, seg.grad.data() + (own.begin - base), seg.range.offset + own.begin,
                                 seg.range.offset + own.end);
      }
    } else if (plan_.zero == 2 && ch->bucketer) {
      const float* g = ch->bucketer->shard_grads();  // the owned ranges back to back
      for (const ShardRange& r : ch->owned) {
        local += counted_squares(ch->counted, g, r.begin, r.end);
        g += r.size();
      }
    } else if (plan_.zero == 0) {
      if (dp_rank != 0) continue;  // every replica holds the same reduced gradients
      local += counted_squares(ch->counted, ch->model->grads(), 0, ch->model->num_params());
    } else {
      const ShardRange own = ch->zl.owned(dp_rank);
      const int64_t base = ch->zl.range(dp_rank).begin;
      local += counted_squares(ch->counted, ch->grad_shard.data() + (own.begin - base), own.begin, own.end);
    }
  }
  double global = 0;
  WatchdogScope watch(rt_.watchdog(), "world", ++world_ops_, "MPI_Allreduce (grad norm)");
  mpi_check(MPI_Allreduce(&local, &global, 1, MPI_DOUBLE, MPI_SUM, rt_.mesh().world), "MPI_Allreduce (grad norm)");
  return global;
}

void DistributedTrainer::optimizer_step(float lr, float clip_scale) {
  const float b1 = float(opt_.train.beta1), b2 = float(opt_.train.beta2);
  const float bc1 = 1.0f - std::pow(b1, float(step_ + 1));
  const float bc2 = 1.0f - std::pow(b2, float(step_ + 1));
  const int dp_rank = rt_.dp().rank();
  for (auto& ch : chunks_) {
    if (ch->adamw) {
      ch->adamw->set_step(step_);
      ch->adamw->update(ch->model->params(), ch->model->grads(), lr, clip_scale);
      continue;
    }
    if (plan_.zero == 3) {  // AdamW on my shard of every segment, the master copy of the weights
      for (Chunk::Segment& seg : ch->segments) {
        const ShardRange own = seg.zl.owned(dp_rank);
        const int64_t base = seg.zl.range(dp_rank).begin;
        for (const ParamInfo& p : ch->model->layout().entries()) {
          const int64_t lo = std::max(seg.range.offset + own.begin, p.offset);
          const int64_t hi = std::min(seg.range.offset + own.end, p.offset + p.numel);
          if (lo >= hi) continue;
          const size_t k = size_t(lo - seg.range.offset - base);
          be_.adamw_update(seg.param.data() + k, seg.grad.data() + k, seg.m.data() + k, seg.v.data() + k, hi - lo,
                           lr, b1, b2, float(opt_.train.eps), p.decay ? float(opt_.train.weight_decay) : 0.0f, bc1,
                           bc2, clip_scale);
        }
        std::fill(seg.grad.begin(), seg.grad.end(), 0.0f);
      }
      continue;
    }
    if (ch->bucketer) {  // bucketed ZeRO 2: AdamW on my chunk of every bucket, then gather them
      float* params = ch->model->params();
      const float* grads = ch->bucketer->shard_grads();  // laid out as m and v
      int64_t k = 0;  // position in the shard's gradients, m and v
      for (const ShardRange& r : ch->owned) {
        for (const ParamInfo& p : ch->model->layout().entries()) {
          const int64_t lo = std::max(r.begin, p.offset), hi = std::min(r.end, p.offset + p.numel);
          if (lo >= hi) continue;
          be_.adamw_update(params + lo, grads + k + (lo - r.begin), ch->m.data() + k + (lo - r.begin),
                           ch->v.data() + k + (lo - r.begin), hi - lo, lr, b1, b2, float(opt_.train.eps),
                           p.decay ? float(opt_.train.weight_decay) : 0.0f, bc1, bc2, clip_scale);
        }
        k += r.size();
      }
      ch->bucketer->gather_params(params);
      continue;
    }
    // ZeRO 1: AdamW on this rank's shard, entry by entry (weight decay is per parameter), in the
    // model's arena unless it needs padding.
    const ShardRange own = ch->zl.owned(dp_rank);
    const int64_t base = ch->zl.range(dp_rank).begin;
    float* params = ch->model->params();
    if (!ch->param_pad.empty()) {
      std::copy_n(params, ch->model->num_params(), ch->param_pad.begin());
      params = ch->param_pad.data();
    }
    for (const ParamInfo& p : ch->model->layout().entries()) {
      const int64_t lo = std::max(own.begin, p.offset), hi = std::min(own.end, p.offset + p.numel);
      if (lo >= hi) continue;
      be_.adamw_update(params + lo, ch->grad_shard.data() + (lo - base), ch->m.data() + (lo - base),
                       ch->v.data() + (lo - base), hi - lo, lr, b1, b2, float(opt_.train.eps),
                       p.decay ? float(opt_.train.weight_decay) : 0.0f, bc1, bc2, clip_scale);
    }
    all_gather_params(rt_.dp(), ch->zl, params);
    if (!ch->param_pad.empty()) std::copy_n(params, ch->model->num_params(), ch->model->params());
  }
  step_ += 1;
}

DistStepMetrics DistributedTrainer::train_step() {
  const double t0 = omp_get_wtime();
  rt_.ledger().reset();
  for (auto& ch : chunks_) {
    // ZeRO 3 and bucketed ZeRO 2 leave the arena reading 0 after every micro-batch (its pages
    // returned); zeroing it would make the whole arena resident. Their sums live in shards.
    if (plan_.zero == 2 && ch->bucketer) ch->bucketer->zero_shard();
    else if (plan_.zero != 3) ch->model->zero_grad();
    ch->backward_count = 0;
  }
  // Every rank reads its replica's m micro-batches (all pipeline ranks alike, to stay in step).
  const int64_t n = B_ * T_;
  for (int64_t mb = 0; mb < m_; mb++)
    data_.next_batch(B_, T_, tokens_.data() + mb * n, targets_.data() + mb * n);

  double loss_sum = 0, compute_s = 0, bubble_s = 0;
  run_micro_batches(&loss_sum, &compute_s, &bubble_s);
  // dp time spent inside the micro-batches (ZeRO 2's waits for its reduce-scatters, ZeRO 3's
  // gathers and reduce-scatters): the ledger was reset at the step's start.
  const double dp_in_micro_batches = comm_breakdown_s(rt_.ledger())["dp_comm"];
  reduce_gradients();

  // The global mean loss: the last stage's sums over dp (tp rank 0 only: tp ranks agree).
  DistStepMetrics s;
  const bool reports = rt_.holds_loss() && rt_.mesh().coord.tp == 0;
  double mine = reports ? loss_sum : 0.0, total = 0;
  {
    WatchdogScope watch(rt_.watchdog(), "world", ++world_ops_, "MPI_Allreduce (loss)");
    mpi_check(MPI_Allreduce(&mine, &total, 1, MPI_DOUBLE, MPI_SUM, rt_.mesh().world), "MPI_Allreduce (loss)");
  }
  s.loss = total / double(m_ * rt_.dp().size());

  const double t_opt = omp_get_wtime();
  s.grad_norm = std::sqrt(grad_norm_squared());
  if (opt_.inject_nan_at_step == step_ + 1) {
    s.loss = std::nan("");
    opt_.inject_nan_at_step = -1;  // once: a skipped step is retried with the next batch
  }
  // A non-finite loss or gradient never reaches the weights. Both numbers are global (all-reduced
  // over the world), so every rank takes the same branch: no rank updates while another skips.
  if (!std::isfinite(s.loss) || !std::isfinite(s.grad_norm)) {
    for (auto& ch : chunks_)  // ZeRO 3 accumulates its shard's gradients outside the arena
      for (Chunk::Segment& seg : ch->segments) std::fill(seg.grad.begin(), seg.grad.end(), 0.0f);
    s.nonfinite = true;
    s.skipped = opt_.skip_nonfinite;
    s.step = step_;
    s.seconds = omp_get_wtime() - t0;
    return s;
  }
  double clip_scale = 1.0;  // as torch.nn.utils.clip_grad_norm_ and the single-rank trainer
  if (opt_.train.grad_clip > 0) clip_scale = std::min(1.0, opt_.train.grad_clip / (s.grad_norm + 1e-6));
  const TrainSpec& ts = opt_.train;
  s.lr = lr_at(step_, ts.lr, ts.min_lr, ts.warmup_steps, ts.steps);
  optimizer_step(float(s.lr), float(clip_scale));
  s.step = step_;
  const double t1 = omp_get_wtime();
  s.seconds = t1 - t0;
  s.tokens_per_s = double(m_ * rt_.dp().size() * n) / s.seconds;

  s.breakdown_s = comm_breakdown_s(rt_.ledger());
  // Communication inside the compute callbacks (tp collectives, dp waits, pipeline waits) is
  // reported under its own name, so compute excludes it (run_pipeline's compute_s already
  // excludes its pipeline waits).
  s.breakdown_s["compute"] = std::max(0.0, compute_s - s.breakdown_s["tp_comm"] - dp_in_micro_batches);
  s.breakdown_s["optimizer"] = t1 - t_opt;
  s.breakdown_s["pp_bubble"] = std::max(s.breakdown_s["pp_bubble"], bubble_s);
  s.bytes = rt_.ledger().bytes;
  for (auto& ch : chunks_)
    if (ch->bucketer) s.buckets_launched_early += ch->bucketer->launched_early();
  return s;
}

double DistributedTrainer::local_flops_per_step() const {
  double f = 0;
  for (const auto& ch : chunks_) f += ch->model->flops_per_step();  // per micro-batch of B x T
  return f * double(m_);
}

// Forward only, stage by stage: the owner of stage s receives stage s-1's output from its owner
// (blocking MPI_Recv on the pp group), runs its chunk and sends the result on. One chain at a time,
// so no schedule is needed and no deadlock is possible. Every rank of a dp replica group runs the
// same number of passes (ZeRO 3 gathers each layer collectively over dp): a replica whose share of
// the batches ends early runs batch 0 again and does not count it.
double DistributedTrainer::evaluate(int64_t batches, const ValBatchFn& val_batch) {
  EXA_CHECK(batches > 0, "evaluate: batches must be > 0, got {}", batches);
  const int64_t n = B_ * T_;
  const int S = plan_.pipeline.stages(), pp = plan_.mesh.pp;
  const int dp = rt_.dp().size(), dp_rank = rt_.dp().rank(), pp_rank = rt_.mesh().coord.pp;
  const int64_t act = (plan_.seq_parallel ? n / plan_.mesh.tp : n) * opt_.model.hidden;
  // owner[s] = (pp rank, chunk) of stage s.
  std::vector<std::pair<int, int>> owner(size_t(S), {-1, -1});
  for (int r = 0; r < pp; r++)
    for (int c = 0; c < plan_.pipeline.vp; c++) owner[size_t(stage_of(plan_.pipeline, r, c))] = {r, c};
  std::vector<int32_t> tokens(static_cast<size_t>(n)), targets(static_cast<size_t>(n));
  std::vector<float> in(static_cast<size_t>(act)), out(static_cast<size_t>(act));
  double sum = 0;
  const int64_t rounds = (batches + dp - 1) / dp;
  for (int64_t round = 0; round < rounds; round++) {
    const int64_t i = round * dp + dp_rank;
    const bool counted = i < batches;
    val_batch(counted ? i : 0, tokens.data(), targets.data());
    for (int s = 0; s < S; s++) {
      const auto [r, c] = owner[size_t(s)];
      if (r != pp_rank) continue;
      if (s > 0 && owner[size_t(s - 1)].first != pp_rank) {
        WatchdogScope watch(rt_.watchdog(), "world", ++world_ops_, "MPI_Recv (evaluation activations)");
        mpi_check(MPI_Recv(in.data(), int(act), MPI_FLOAT, owner[size_t(s - 1)].first, 7101, rt_.pp().comm(),
                           MPI_STATUS_IGNORE), "MPI_Recv (evaluation activations)");
      } else if (s > 0)
        std::copy(out.begin(), out.end(), in.begin());
      Gpt& g = *chunks_[size_t(c)]->model;
      const float loss = g.forward(s == 0 ? tokens.data() : nullptr, s == 0 ? nullptr : in.data(),
                                   s == S - 1 ? targets.data() : nullptr, 0);
      if (s == S - 1) {
        if (counted && rt_.mesh().coord.tp == 0) sum += double(loss);
      } else {
        be_.copy(out.data(), g.output(0), sizeof(float) * size_t(act));
        if (owner[size_t(s + 1)].first != pp_rank) {
          WatchdogScope watch(rt_.watchdog(), "world", ++world_ops_, "MPI_Send (evaluation activations)");
          mpi_check(MPI_Send(out.data(), int(act), MPI_FLOAT, owner[size_t(s + 1)].first, 7101, rt_.pp().comm()),
                    "MPI_Send (evaluation activations)");
        }
      }
    }
  }
  double total = 0;
  WatchdogScope watch(rt_.watchdog(), "world", ++world_ops_, "MPI_Allreduce (val loss)");
  mpi_check(MPI_Allreduce(&sum, &total, 1, MPI_DOUBLE, MPI_SUM, rt_.mesh().world), "MPI_Allreduce (val loss)");
  return total / double(batches);
}

}  // namespace exatrain::parallel
