// ZeRO 2 (DeepSpeed stage 2), dp > 1: every micro-batch's gradients are reduce-scattered bucket
// by bucket as backward completes them (GradBucketer, BucketOp::reduce_scatter); rank r keeps the
// sum of its chunk of every bucket in a shard-sized buffer and the bucket's arena pages go back to
// the OS once its reduce-scatter has completed, so a rank holds 1/dp of the gradients plus the
// buckets in flight. The optimizer runs on those chunks, then they are all-gathered bucket by
// bucket. A tied embedding (at offset 0 on the first and the last stage) ends a bucket, so its
// buckets, and the chunks a dp rank owns of them, are the same on both stages: the tied gradient
// exchange then moves only those chunks (the start of the shard). Mixed precision: a rank keeps
// the fp32 masters of its chunks only, and the all-gather moves the 16-bit copy
// (parallel/master_shards.hpp, one gather group per bucket).
#include <algorithm>
#include <memory>

#include "core/check.hpp"
#include "parallel/grad_sync_stages.hpp"
#include "parallel/master_shards.hpp"
#include "parallel/zero.hpp"

namespace exatrain::parallel {
namespace {

class Zero2Sync final : public GradSync {
 public:
  explicit Zero2Sync(GradSyncSetup setup) : GradSync(std::move(setup)) {
    const int p = dp().size();
    // Not clamped to the arena: the tied embedding's buckets must not depend on the stage's size.
    // dp divides it: equal chunks (bar the buckets that end at a split or at the arena's end).
    const int64_t bucket = std::max<int64_t>(p, s_.bucket_floats - s_.bucket_floats % p);
    masters_.resize(s_.chunks.size());
    for (SyncChunk& ch : s_.chunks) {
      Gpt& g = *ch.model;
      EXA_CHECK(ch.tied.len == 0 || ch.tied.offset == 0,
                "ZeRO 2: the tied embedding's copy must start the arena (it is at offset {})", ch.tied.offset);
      std::vector<int64_t> splits;
      if (ch.tied.len > 0) splits.push_back(ch.tied.len);
      Chunk k;
      k.bucketer = std::make_unique<GradBucketer>(be(), dp(), *s_.compressor, g.grads(), g.num_params(), bucket,
                                                  BucketOp::reduce_scatter, splits, s_.buckets_in_flight, &g.layout());
      k.owned = k.bucketer->owned_ranges(dp().rank());
      k.first_region = regions_.size();
      int64_t at = 0;  // the owned ranges lie back to back in the shard
      for (const ShardRange& r : k.owned) {
        regions_.push_back({&g.layout(), r.begin, r.end, g.params() + r.begin, k.bucketer->shard_grads() + at});
        at += r.size();
        if (r.end <= ch.tied.len) k.tied_shard = at;  // my chunks of the embedding's buckets
      }
      if (g.params_half()) {  // dp > 1 here (ZeRO 2 at dp 1 is ZeRO 1): each bucket cut into the ranks' chunks
        std::vector<std::vector<ShardRange>> of(static_cast<size_t>(p));
        for (int q = 0; q < p; q++) of[size_t(q)] = k.bucketer->owned_ranges(q);
        std::vector<GatherGroup> groups;
        for (size_t b = 0; b < k.owned.size(); b++) {
          GatherGroup gg{of[0][b].begin, {}};
          for (int q = 0; q < p; q++) gg.counts.push_back(of[size_t(q)][b].size());
          groups.push_back(std::move(gg));
        }
        masters_[chunks_.size()] = std::make_unique<MasterShards>(be(), dp(), g, std::move(groups));
      }
      chunks_.push_back(std::move(k));
    }
    init_optimizer(regions_, /*replicated=*/false);
  }
  const char* name() const override { return "ZeRO 2"; }

  // The arena reads 0 after every micro-batch (its pages returned); zeroing it would make the
  // whole arena resident. The step's sums live in the shards.
  void begin_step() override {
    for (Chunk& k : chunks_) k.bucketer->zero_shard();
  }

  // Every micro-batch's gradients go to their owners as backward makes them (the tied copy too:
  // its two stages' sums are added on the shards afterwards).
  void unit_backward_done(int c, int64_t unit, bool) override {
    s_.finish_local(c, unit);
    const SyncChunk& ch = s_.chunks[size_t(c)];
    auto it = ch.units.find(unit);
    if (it == ch.units.end()) return;
    for (const Range& r : it->second) chunks_[size_t(c)].bucketer->mark_ready(r.offset, r.len);
  }
  void micro_batch_done(int c) override { chunks_[size_t(c)].bucketer->end_micro_batch(); }

  void finish() override {
    for (Chunk& k : chunks_) k.bucketer->finish(1.0f);
    for (size_t c = 0; c < chunks_.size(); c++)
      if (s_.chunks[c].tied.len > 0) s_.tied_sum(int(c), chunks_[c].bucketer->shard_grads(), chunks_[c].tied_shard);
  }

  double grad_norm_squared() override {
    double s = 0;
    for (size_t c = 0; c < chunks_.size(); c++) {
      const float* g = chunks_[c].bucketer->shard_grads();
      for (const ShardRange& r : chunks_[c].owned) {
        s += counted_squares(int(c), g, r.begin, r.end);
        g += r.size();
      }
    }
    return s;
  }

  void apply(const OptimStep& step) override {
    s_.optimizer->step(regions_, step);
    for (size_t c = 0; c < chunks_.size(); c++) {
      if (masters_[c]) {
        masters_[c]->publish();
        continue;
      }
      chunks_[c].bucketer->gather_params(s_.chunks[c].model->params());
      s_.chunks[c].model->params_changed();
    }
  }

  // The parameters over the whole arena (saver on my chunks), the state of my chunks.
  std::vector<StateSlice> state_slices() override {
    std::vector<StateSlice> out;
    const size_t states = s_.optimizer->state_names().size();
    for (size_t c = 0; c < chunks_.size(); c++) {
      Gpt& g = *s_.chunks[c].model;
      std::vector<Range> saved;
      for (const ShardRange& r : chunks_[c].owned) saved.push_back({r.begin, r.size()});
      add_arena_slices(out, int(c), -1, g.params(), g.num_params(), saved);
      for (size_t i = 0; i < chunks_[c].owned.size(); i++) {
        const ShardRange& r = chunks_[c].owned[i];
        for (size_t st = 0; st < states; st++)
          out.push_back({int(c), int(st), r.begin, r.end, s_.optimizer->state(chunks_[c].first_region + i, st), true});
      }
    }
    return out;
  }

  int64_t buckets_launched_early() const override {
    int64_t n = 0;
    for (const Chunk& k : chunks_) n += k.bucketer->launched_early();
    return n;
  }

 private:
  struct Chunk {
    std::unique_ptr<GradBucketer> bucketer;
    std::vector<ShardRange> owned;  // my chunk of every bucket, in arena order
    size_t first_region = 0;        // regions_[first_region + i] is owned[i]
    int64_t tied_shard = 0;         // floats at the shard's start that are the tied embedding's
  };
  std::vector<Chunk> chunks_;
  std::vector<ParamRegion> regions_;
};

}  // namespace

std::unique_ptr<GradSync> make_zero2_sync(GradSyncSetup setup) { return std::make_unique<Zero2Sync>(std::move(setup)); }

}  // namespace exatrain::parallel
