// ZeRO 1 (Megatron's distributed optimizer): the replicas accumulate the step's micro-batches
// locally, then one reduce-scatter of each chunk's gradient arena gives every rank the sum of its
// shard; the optimizer runs on that shard (its state is 1/dp of the whole) and an all-gather
// brings every rank the updated weights. The shards are equal (padded when dp does not divide the
// arena), or cut between parameter entries (align_to_entries: one owner per matrix). Mixed
// precision at dp > 1: a rank keeps the fp32 masters of its shard only, and the all-gather moves
// the 16-bit copy (parallel/master_shards.hpp).
#include <memory>

#include "core/check.hpp"
#include "parallel/grad_sync_stages.hpp"
#include "parallel/master_shards.hpp"
#include "parallel/zero.hpp"

namespace exatrain::parallel {
namespace {

class Zero1Sync final : public GradSync {
 public:
  explicit Zero1Sync(GradSyncSetup setup) : GradSync(std::move(setup)) {
    const int dp_size = dp().size(), r = dp().rank();
    masters_.resize(s_.chunks.size());
    for (SyncChunk& ch : s_.chunks) {
      Gpt& g = *ch.model;
      const int64_t n = g.num_params();
      Shard sh;
      // align 1: no padding when dp divides the arena, so the bytes equal the planner's flat buffer
      // and the collectives work on the model's arenas themselves (padded copies otherwise).
      sh.zl = s_.align_to_entries ? ZeroLayout::aligned(g.layout(), 0, n, dp_size) : ZeroLayout::make(n, dp_size, 1);
      std::unique_ptr<MasterShards>& masters = masters_[shards_.size()];
      if (g.params_half() && dp_size > 1) {  // the shard's masters on the arena itself: no padded copy
        GatherGroup all{0, {}};
        for (int q = 0; q < dp_size; q++) all.counts.push_back(sh.zl.owned(q).size());
        masters = std::make_unique<MasterShards>(be(), dp(), g, std::vector<GatherGroup>{all});
      }
      if (sh.zl.padded != n) {
        sh.grad_pad = DeviceBuffer(be(), sh.zl.padded, "ZeRO-1 padded gradients");
        if (!masters) sh.param_pad = DeviceBuffer(be(), sh.zl.padded, "ZeRO-1 padded parameters");
      }
      sh.grads = DeviceBuffer(be(), sh.zl.range(r).size(), "ZeRO-1 gradient shard");
      sh.own = sh.zl.owned(r);
      float* params = sh.param_pad.empty() ? g.params() : sh.param_pad.data();
      regions_.push_back({&g.layout(), sh.own.begin, sh.own.end, params + sh.own.begin,
                          sh.grads.data() + (sh.own.begin - sh.zl.range(r).begin)});
      shards_.push_back(std::move(sh));
    }
    init_optimizer(regions_, /*replicated=*/false);
  }
  const char* name() const override { return "ZeRO 1"; }

  void begin_step() override {
    for (SyncChunk& ch : s_.chunks) ch.model->zero_grad();
  }
  void unit_backward_done(int c, int64_t unit, bool last) override {
    if (last) s_.finish_local(c, unit);
  }

  // The tied copies summed on the full arenas (the shards need the whole sum), then one
  // reduce-scatter per chunk, straight from the arena unless it needs padding.
  void finish() override {
    for (size_t c = 0; c < s_.chunks.size(); c++) {
      const SyncChunk& ch = s_.chunks[c];
      if (ch.tied.len > 0) s_.tied_sum(int(c), ch.model->grads() + ch.tied.offset, ch.tied.len);
    }
    for (size_t c = 0; c < s_.chunks.size(); c++) {
      Gpt& g = *s_.chunks[c].model;
      Shard& sh = shards_[c];
      float* grads = g.grads();
      if (!sh.grad_pad.empty()) {
        be().copy(sh.grad_pad.data(), grads, sizeof(float) * size_t(g.num_params()));
        grads = sh.grad_pad.data();
      }
      if (!sh.zl.even()) {  // shards cut between entries: unequal counts (make_grad_sync refuses a compressor)
        reduce_scatter_grads(be(), dp(), sh.zl, grads, sh.grads.data(), 1.0f);
        continue;
      }
      BucketReduce b;
      b.kind = ReduceKind::reduce_scatter;
      b.layout = &g.layout();
      b.begin = 0, b.end = g.num_params();
      b.data = grads, b.out = sh.grads.data();
      b.n = sh.zl.padded, b.shard = sh.zl.shard;
      b.blocking = true;
      if (std::unique_ptr<Reduction> r = s_.compressor->start(dp(), be(), b)) r->wait();
    }
  }

  double grad_norm_squared() override {
    double s = 0;
    for (size_t c = 0; c < shards_.size(); c++) {
      const Shard& sh = shards_[c];
      s += counted_squares(int(c), sh.grads.data() + (sh.own.begin - sh.zl.range(dp().rank()).begin), sh.own.begin,
                           sh.own.end);
    }
    return s;
  }

  // The optimizer on this rank's shard (in the model's arena unless it needs padding), then every
  // rank's shard back to all.
  void apply(const OptimStep& step) override {
    for (size_t c = 0; c < shards_.size(); c++)
      if (!shards_[c].param_pad.empty())
        be().copy(shards_[c].param_pad.data(), s_.chunks[c].model->params(),
                  sizeof(float) * size_t(s_.chunks[c].model->num_params()));
    s_.optimizer->step(regions_, step);
    for (size_t c = 0; c < shards_.size(); c++) {
      Gpt& g = *s_.chunks[c].model;
      Shard& sh = shards_[c];
      if (masters_[c]) {
        masters_[c]->publish();
        continue;
      }
      all_gather_params(dp(), sh.zl, sh.param_pad.empty() ? g.params() : sh.param_pad.data());
      if (!sh.param_pad.empty()) be().copy(g.params(), sh.param_pad.data(), sizeof(float) * size_t(g.num_params()));
      g.params_changed();
    }
  }

  std::vector<StateSlice> state_slices() override {
    std::vector<StateSlice> out;
    const size_t states = s_.optimizer->state_names().size();
    for (size_t c = 0; c < shards_.size(); c++) {
      Gpt& g = *s_.chunks[c].model;
      const ShardRange own = shards_[c].own;
      std::vector<Range> saved;
      if (own.size() > 0) saved.push_back({own.begin, own.size()});
      add_arena_slices(out, int(c), -1, g.params(), g.num_params(), saved);
      if (own.size() > 0)
        for (size_t st = 0; st < states; st++) out.push_back({int(c), int(st), own.begin, own.end, s_.optimizer->state(c, st), true});
    }
    return out;
  }

 private:
  struct Shard {
    ZeroLayout zl;
    ShardRange own;
    DeviceBuffer grads;                // [zl.range(rank).size()]: this rank's summed shard
    DeviceBuffer grad_pad, param_pad;  // [zl.padded] when dp does not divide the arena
  };
  std::vector<Shard> shards_;
  std::vector<ParamRegion> regions_;  // per chunk: its shard
};

}  // namespace

std::unique_ptr<GradSync> make_zero1_sync(GradSyncSetup setup) { return std::make_unique<Zero1Sync>(std::move(setup)); }

}  // namespace exatrain::parallel
