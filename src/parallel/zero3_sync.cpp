// ZeRO 3 (DeepSpeed stage 3 / FSDP): every unit's (layer's, embedding's, head's) contiguous arena
// range is a segment sharded on its own over dp; this rank keeps only its shard of each segment's
// parameters (the master copy, initialised from the seed without ever writing the full arena),
// gradients and optimizer state. A pass gathers a unit's segments before it reads them
// (before_unit) and releases them after (after_unit: their pages go back to the OS, released
// values on pages shared with neighbours read NaN); every micro-batch's backward reduce-scatters
// the unit's gradients into the owners' shards and returns their pages. A tied embedding's copy
// (first and last stage) is a segment of its own with the same layout on both stages, so a dp rank
// owns the same shard of it on each and the tied gradient exchange moves only that shard.
// Under mixed precision a pass needs the unit's 16-bit copy only (and its norms and biases in
// fp32), so that is what is gathered (FSDP's param_dtype = bf16: 2 bytes per parameter where the
// fp32 gather sent 4; parallel/master_shards.hpp's HalfGathers, one group per segment), and
// released after the pass like the fp32 arena.
#include <algorithm>
#include <limits>

#include "core/check.hpp"
#include "parallel/grad_sync_stages.hpp"
#include "parallel/master_shards.hpp"
#include "parallel/zero.hpp"

namespace exatrain::parallel {
namespace {

class Zero3Sync final : public GradSync {
 public:
  explicit Zero3Sync(GradSyncSetup setup) : GradSync(std::move(setup)) {
    for (size_t c = 0; c < s_.chunks.size(); c++) chunks_.push_back(make_chunk(s_.chunks[c]));
    for (size_t c = 0; c < chunks_.size(); c++)
      for (Segment& seg : chunks_[c].segments) {
        const ShardRange own = seg.zl.owned(dp().rank());
        regions_.push_back({&s_.chunks[c].model->layout(), seg.range.offset + own.begin, seg.range.offset + own.end,
                            seg.param.data(), seg.grad.data()});
      }
    init_optimizer(regions_, /*replicated=*/false);
    for (size_t c = 0; c < chunks_.size(); c++) half_.push_back(make_half_gathers(int(c)));
    // Every segment starts released (its pages returned to the OS, its partial pages NaN).
    for (size_t c = 0; c < chunks_.size(); c++)
      for (size_t i = 0; i < chunks_[c].segments.size(); i++) release_segment(int(c), int(i));
  }
  const char* name() const override { return "ZeRO 3"; }

  void begin_step() override {
    for (Chunk& k : chunks_)
      for (Segment& seg : k.segments) be().zero(seg.grad.data(), sizeof(float) * size_t(seg.grad.size()));
  }
  void before_unit(int c, int64_t unit) override {
    for (int i : chunks_[size_t(c)].gather[unit]) half_[size_t(c)] ? gather_half(c, i) : gather_segment(c, i);
  }
  void after_unit(int c, int64_t unit) override {
    for (int i : chunks_[size_t(c)].gather[unit]) release_segment(c, i);
  }
  // Gradients leave for their owners after every micro-batch (the owner only sees the sum).
  void unit_backward_done(int c, int64_t unit, bool) override {
    s_.finish_local(c, unit);
    for (int i : chunks_[size_t(c)].own[unit]) reduce_scatter_segment(c, i);
  }
  void finish() override {
    for (size_t c = 0; c < chunks_.size(); c++)
      if (chunks_[c].tied_segment >= 0) {
        Segment& seg = chunks_[c].segments[size_t(chunks_[c].tied_segment)];
        s_.tied_sum(int(c), seg.grad.data(), seg.zl.shard);
      }
  }
  double grad_norm_squared() override {
    double s = 0;
    for (size_t c = 0; c < chunks_.size(); c++)
      for (const Segment& seg : chunks_[c].segments) {
        const ShardRange own = seg.zl.owned(dp().rank());
        const int64_t base = seg.zl.range(dp().rank()).begin;
        s += counted_squares(int(c), seg.grad.data() + (own.begin - base), seg.range.offset + own.begin,
                             seg.range.offset + own.end);
      }
    return s;
  }
  // fp32: the 16-bit copy is unused; mixed precision: a unit's copy is gathered from the updated
  // shards at its next pass (gather_half), so marking it stale here only guards against a read
  // outside a gather.
  void apply(const OptimStep& step) override {
    s_.optimizer->step(regions_, step);
    masters_written();
  }
  std::vector<StateSlice> state_slices() override;
  void gather_full_params() override {
    for (size_t c = 0; c < chunks_.size(); c++)
      for (size_t i = 0; i < chunks_[c].segments.size(); i++) gather_segment(int(c), int(i));
  }
  void release_full_params() override {
    for (size_t c = 0; c < chunks_.size(); c++)
      for (size_t i = 0; i < chunks_[c].segments.size(); i++) release_segment(int(c), int(i));
  }

 private:
  struct Segment {
    Range range;                 // in the model's arena
    ZeroLayout zl;
    DeviceBuffer param, grad;    // [zl.shard]: my shard (the master weights; the step's summed gradients)
  };
  struct Chunk {
    std::vector<Segment> segments;
    std::map<int64_t, std::vector<int>> gather;  // unit -> segments its passes read
    std::map<int64_t, std::vector<int>> own;     // unit -> segments whose gradients it makes
    int tied_segment = -1;
    DeviceBuffer param_pad, grad_pad, grad_out;  // staging for segments dp does not divide
  };
  Chunk make_chunk(const SyncChunk& ch);
  Segment make_segment(const SyncChunk& ch, Range x);
  void gather_segment(int c, int i);
  std::unique_ptr<HalfGathers> make_half_gathers(int c);
  void gather_half(int c, int i);
  void release_segment(int c, int i);
  void reduce_scatter_segment(int c, int i);

  std::vector<Chunk> chunks_;
  std::vector<ParamRegion> regions_;  // per segment, in chunk order
  std::vector<std::unique_ptr<HalfGathers>> half_;  // [chunks]: the 16-bit gathers (null at fp32)
};

// Segments: each unit's entries merged where contiguous, the tied embedding's on its own.
Zero3Sync::Chunk Zero3Sync::make_chunk(const SyncChunk& ch) {
  Chunk k;
  int64_t pad = 0, shard = 0;
  auto tied = [&](const Range& r) { return ch.tied.len > 0 && r.offset == ch.tied.offset; };
  for (const auto& [unit, ranges] : ch.units) {
    std::vector<Range> merged;
    for (const Range& x : ranges) {
      if (!merged.empty() && merged.back().end() == x.offset && !tied(x) && !tied(merged.back()))
        merged.back().len += x.len;
      else
        merged.push_back(x);
    }
    for (const Range& x : merged) {
      const int idx = int(k.segments.size());
      if (tied(x)) k.tied_segment = idx;
      k.own[unit].push_back(idx);
      k.gather[unit].push_back(idx);
      k.segments.push_back(make_segment(ch, x));
      pad = std::max(pad, k.segments.back().zl.padded);
      shard = std::max(shard, k.segments.back().zl.shard);
    }
  }
  // The head of a single-stage model reads the tied embedding too.
  const StageRange& st = ch.model->options().stage;
  if (ch.model->options().model.tie_embeddings && st.has_head && st.has_embedding)
    for (int i : k.own[kEmbeddingUnit]) k.gather[kHeadUnit].push_back(i);
  k.param_pad = DeviceBuffer(be(), pad, "ZeRO-3 parameter staging");
  k.grad_pad = DeviceBuffer(be(), pad, "ZeRO-3 gradient staging");
  k.grad_out = DeviceBuffer(be(), shard, "ZeRO-3 reduce-scatter output");
  return k;
}

// My shard's values straight from the seed (init_param_range: the values init_weights would write
// there), entry by entry, through host staging; the model's arena is never written.
Zero3Sync::Segment Zero3Sync::make_segment(const SyncChunk& ch, Range x) {
  Segment seg;
  seg.range = x;
  seg.zl = ZeroLayout::make(x.len, dp().size(), 1);
  seg.param = DeviceBuffer(be(), seg.zl.shard, "ZeRO-3 parameter shard");
  seg.grad = DeviceBuffer(be(), seg.zl.shard, "ZeRO-3 gradient shard");
  const int r = dp().rank();
  const ShardRange own = seg.zl.owned(r);
  const int64_t lo = x.offset + own.begin, hi = x.offset + own.end, base = x.offset + seg.zl.range(r).begin;
  HostBuffer<float> host(be(), seg.zl.shard);
  std::fill(host.data(), host.data() + seg.zl.shard, 0.0f);
  for (const ParamInfo& p : ch.model->layout().entries()) {
    const int64_t a = std::max(lo, p.offset), b = std::min(hi, p.offset + p.numel);
    if (a < b) init_param_range(p, s_.seed, a - p.offset, b - a, host.data() + (a - base));
  }
  be().upload(seg.param.data(), host.data(), sizeof(float) * size_t(seg.zl.shard));
  be().zero(seg.grad.data(), sizeof(float) * size_t(seg.zl.shard));
  return seg;
}

// All-gather a segment's parameters into the model's arena: in place when dp divides it, else
// through the padded staging copy.
void Zero3Sync::gather_segment(int c, int i) {
  Chunk& k = chunks_[size_t(c)];
  Segment& seg = k.segments[size_t(i)];
  const int64_t at = seg.zl.range(dp().rank()).begin, bytes = int64_t(sizeof(float)) * seg.zl.shard;
  float* dst = s_.chunks[size_t(c)].model->params() + seg.range.offset;
  if (seg.zl.padded == seg.range.len) {
    be().copy(dst + at, seg.param.data(), size_t(bytes));
    dp().all_gather(nullptr, dst, seg.zl.shard);
    return;
  }
  be().copy(k.param_pad.data() + at, seg.param.data(), size_t(bytes));
  dp().all_gather(nullptr, k.param_pad.data(), seg.zl.shard);
  be().copy(dst, k.param_pad.data(), sizeof(float) * size_t(seg.range.len));
}

// Mixed precision: one gather group per segment, rank r's piece its owned range.
std::unique_ptr<HalfGathers> Zero3Sync::make_half_gathers(int c) {
  Gpt& model = *s_.chunks[size_t(c)].model;
  if (model.params_half() == nullptr) return nullptr;
  std::vector<GatherGroup> groups;
  for (const Segment& seg : chunks_[size_t(c)].segments) {
    GatherGroup g{seg.range.offset, {}};
    for (int r = 0; r < dp().size(); r++) g.counts.push_back(seg.zl.owned(r).size());
    groups.push_back(std::move(g));
  }
  return std::make_unique<HalfGathers>(be(), dp(), model, std::move(groups));
}

// A pass's gather under mixed precision: the segment's 16-bit copy rounded from every rank's shard
// buffer, and its norms and biases in fp32 into the arena (the rest of the fp32 arena untouched).
void Zero3Sync::gather_half(int c, int i) {
  const Segment& seg = chunks_[size_t(c)].segments[size_t(i)];
  const ArenaSpan own = half_[size_t(c)]->own(size_t(i));
  Gpt& model = *s_.chunks[size_t(c)].model;
  // seg.param[0] is element zl.range(rank).begin of the segment: the owned range starts there
  // (ZeroLayout::make, the even layout: rank r's range begins at r * shard).
  EXA_CHECK(own.len == 0 || own.begin - seg.range.offset == seg.zl.range(dp().rank()).begin,
            "ZeRO 3: rank {}'s piece of a segment at {} starts at {}, its shard at {}", dp().rank(),
            seg.range.offset, own.begin - seg.range.offset, seg.zl.range(dp().rank()).begin);
  half_[size_t(c)]->publish(size_t(i), seg.param.data());
  model.half_written(seg.range.offset, seg.range.end(), true);
}

// The memory of a released segment goes back to the OS (Backend::release); its floats on pages
// shared with neighbours read NaN, so a pass that used a released weight still poisons the loss.
// Mixed precision: its 16-bit copy too (the 2-byte words of whole 4-byte words inside it; Gpt
// refuses to read an entry marked not current, so the values left on shared pages are never used).
void Zero3Sync::release_segment(int c, int i) {
  const Range& x = chunks_[size_t(c)].segments[size_t(i)].range;
  Gpt& model = *s_.chunks[size_t(c)].model;
  be().release(model.params() + x.offset, x.len, std::numeric_limits<float>::quiet_NaN());
  if (!half_[size_t(c)]) return;  // fp32: no 16-bit copy (half_ is filled before the first release)
  model.half_written(x.offset, x.end(), false);
  const auto lo = (reinterpret_cast<uintptr_t>(model.params_half() + x.offset) + 3) & ~uintptr_t(3);
  const auto hi = reinterpret_cast<uintptr_t>(model.params_half() + x.end()) & ~uintptr_t(3);
  if (hi > lo) be().release(reinterpret_cast<float*>(lo), int64_t(hi - lo) / 4, 0.0f);
}

// This micro-batch's gradients of a segment, reduce-scattered over dp and added to my shard; the
// segment's range of the gradient arena then reads 0 again (its pages returned, its floats on
// shared pages set to 0): the arena is never zeroed as a whole.
void Zero3Sync::reduce_scatter_segment(int c, int i) {
  Chunk& k = chunks_[size_t(c)];
  Segment& seg = k.segments[size_t(i)];
  float* g = s_.chunks[size_t(c)].model->grads() + seg.range.offset;
  if (seg.zl.padded == seg.range.len) {  // straight from the arena
    reduce_scatter_grads(be(), dp(), seg.zl, g, k.grad_out.data(), 1.0f);
  } else {  // through a zero-padded staging copy
    be().zero(k.grad_pad.data(), sizeof(float) * size_t(seg.zl.padded));
    be().copy(k.grad_pad.data(), g, sizeof(float) * size_t(seg.range.len));
    reduce_scatter_grads(be(), dp(), seg.zl, k.grad_pad.data(), k.grad_out.data(), 1.0f);
  }
  be().release(g, seg.range.len, 0.0f);
  be().add_inplace(seg.grad.data(), k.grad_out.data(), seg.zl.shard);
}

// Only my shard of every segment, parameters (the master copy) included.
std::vector<StateSlice> Zero3Sync::state_slices() {
  std::vector<StateSlice> out;
  const size_t states = s_.optimizer->state_names().size();
  size_t region = 0;
  for (size_t c = 0; c < chunks_.size(); c++)
    for (Segment& seg : chunks_[c].segments) {
      const ShardRange own = seg.zl.owned(dp().rank());
      if (own.size() > 0) {
        const int64_t k = own.begin - seg.zl.range(dp().rank()).begin, b = seg.range.offset + own.begin;
        const int64_t e = seg.range.offset + own.end;
        out.push_back({int(c), -1, b, e, seg.param.data() + k, true});
        for (size_t st = 0; st < states; st++) out.push_back({int(c), int(st), b, e, s_.optimizer->state(region, st), true});
      }
      region++;
    }
  return out;
}

}  // namespace

std::unique_ptr<GradSync> make_zero3_sync(GradSyncSetup setup) { return std::make_unique<Zero3Sync>(std::move(setup)); }

}  // namespace exatrain::parallel
