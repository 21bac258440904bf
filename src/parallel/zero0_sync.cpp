// ZeRO 0 (plain data parallelism, PyTorch DDP): every replica holds everything; after the last
// micro-batch each unit's gradients join the bucketed, non-blocking all-reduce as backward makes
// them (overlapped with the rest of backward), and every rank runs the optimizer on the whole arena.
#include <algorithm>

#include "core/check.hpp"
#include "parallel/grad_sync_stages.hpp"
#include "parallel/zero.hpp"

namespace exatrain::parallel {
namespace {

class Zero0Sync final : public GradSync {
 public:
  explicit Zero0Sync(GradSyncSetup setup) : GradSync(std::move(setup)) {
    for (SyncChunk& ch : s_.chunks) {
      Gpt& g = *ch.model;
      const int64_t n = g.num_params();
      if (dp().size() > 1)
        bucketers_.push_back(std::make_unique<GradBucketer>(be(), dp(), *s_.compressor, g.grads(), n,
                                                            std::min(s_.bucket_floats, n), BucketOp::all_reduce,
                                                            std::vector<int64_t>{}, 2, &g.layout()));
      regions_.push_back({&g.layout(), 0, n, g.params(), g.grads()});
    }
    init_optimizer(regions_, /*replicated=*/true);
    if (s_.compressor->compresses_momentum()) bind_momenta();
  }
  const char* name() const override { return "ZeRO 0"; }

  void begin_step() override {
    for (SyncChunk& ch : s_.chunks) ch.model->zero_grad();
  }

  // After the LAST micro-batch's backward through a unit its gradients are final on this rank:
  // into the buckets, except the tied embedding, which waits for the other stage's copy.
  void unit_backward_done(int c, int64_t unit, bool last) override {
    if (!last) return;
    s_.finish_local(c, unit);
    if (bucketers_.empty()) return;
    const SyncChunk& ch = s_.chunks[size_t(c)];
    auto it = ch.units.find(unit);
    if (it == ch.units.end()) return;
    for (const Range& r : it->second)
      if (!(ch.tied.len > 0 && r.offset == ch.tied.offset)) bucketers_[size_t(c)]->mark_ready(r.offset, r.len);
  }

  // The tied copies summed first (the dp reduction is linear), then every bucket waited for.
  void finish() override {
    for (size_t c = 0; c < s_.chunks.size(); c++) {
      const SyncChunk& ch = s_.chunks[c];
      if (ch.tied.len > 0) s_.tied_sum(int(c), ch.model->grads() + ch.tied.offset, ch.tied.len);
    }
    for (size_t c = 0; c < bucketers_.size(); c++) {
      const Range& t = s_.chunks[c].tied;
      if (t.len > 0) bucketers_[c]->mark_ready(t.offset, t.len);
      bucketers_[c]->finish(1.0f);
    }
  }

  // Every replica holds the same reduced gradients: dp rank 0 counts them.
  double grad_norm_squared() override {
    if (dp().rank() != 0) return 0;
    double s = 0;
    for (size_t c = 0; c < s_.chunks.size(); c++)
      s += counted_squares(int(c), s_.chunks[c].model->grads(), 0, s_.chunks[c].model->num_params());
    return s;
  }

  // A compressed-momentum step left the synchronised momentum in the buckets (at dp 1 nothing is reduced).
  void apply(const OptimStep& step) override {
    OptimStep s = step;
    s.grads_are_momentum = !bucketers_.empty() && s_.compressor->delivered_momentum();
    s_.optimizer->step(regions_, s);
    masters_written();  // every master updated here: the 16-bit copies follow on first use
  }

  // Every replica holds everything; replica r saves chunk r of it.
  std::vector<StateSlice> state_slices() override {
    std::vector<StateSlice> out;
    const size_t states = s_.optimizer->state_names().size();
    for (size_t c = 0; c < s_.chunks.size(); c++) {
      Gpt& g = *s_.chunks[c].model;
      const int64_t n = g.num_params();
      const ShardRange mine = ZeroLayout::make(n, dp().size(), 1).owned(dp().rank());
      std::vector<Range> saved;
      if (mine.size() > 0) saved.push_back({mine.begin, mine.size()});
      add_arena_slices(out, int(c), -1, g.params(), n, saved);
      for (size_t st = 0; st < states; st++) add_arena_slices(out, int(c), int(st), s_.optimizer->state(c, st), n, saved);
    }
    return out;
  }

  int64_t buckets_launched_early() const override {
    int64_t n = 0;
    for (const auto& b : bucketers_) n += b->launched_early();
    return n;
  }

 private:
  // Compressed momentum: the compressor reads each chunk's first moment (AdamW's exp_avg, whole on
  // every replica under ZeRO 0) to form the ranks' local momenta.
  void bind_momenta() {
    const int m = s_.optimizer->momentum_state();
    EXA_CHECK(m >= 0, "[comm] compress = \"momentum\" with optimizer {}: expected adamw (its first moment exp_avg is "
              "what the ranks compress)", s_.optimizer->name());
    for (size_t c = 0; c < s_.chunks.size(); c++)
      s_.compressor->bind_momentum(&s_.chunks[c].model->layout(), s_.optimizer->state(c, size_t(m)));
  }
  std::vector<std::unique_ptr<GradBucketer>> bucketers_;  // per chunk, when dp > 1
  std::vector<ParamRegion> regions_;                      // per chunk: the whole arena
};

}  // namespace

std::unique_ptr<GradSync> make_zero0_sync(GradSyncSetup setup) { return std::make_unique<Zero0Sync>(std::move(setup)); }

}  // namespace exatrain::parallel
