// The sparsifying compressors of parallel/compressors.hpp: topk, dgc, blocktopk, temporal.
#include <algorithm>
#include <cmath>

#include "core/check.hpp"
#include "core/splitmix.hpp"
#include "parallel/compress_common.hpp"

namespace exatrain::parallel::compress {
namespace {

// A bucket's previous selection (for the overlap figure) and, for temporal, the shared index set.
struct SparseExtra final : Bucket::Extra {
  DeviceBuffer previous;   // int32 [k]: this rank's last selection (temporal: the shared set)
  int64_t previous_k = 0;
  int64_t refreshed_at = -1;  // temporal: the step that chose `previous`
  DeviceBuffer u;          // dgc: the momentum-corrected velocity [len]
};

class SparseCompressor final : public CompressorBase {
 public:
  SparseCompressor(const CommSpec& spec, const CompressorContext& ctx)
      : CompressorBase(spec, ctx, rules_of(spec), spec.compressor == "dgc" || spec.error_feedback),
        format_{pair_indices_from(spec.indices), pair_values_from(spec.values)} {}

 protected:
  void reduce(Group& dp, Backend& be, const BucketReduce& b, Bucket& st, float* acc, float* sum) override {
    if (!st.extra) st.extra = std::make_unique<SparseExtra>();
    SparseExtra& x = static_cast<SparseExtra&>(*st.extra);
    if (spec_.compressor == "blocktopk") return reduce_blocks(dp, be, st, acc, sum);
    if (spec_.compressor == "temporal" && x.refreshed_at >= 0 && step_ - x.refreshed_at < spec_.refresh_every)
      return reuse(dp, be, st, x, acc, sum);
    std::vector<int64_t> ks;
    for (const Piece& p : st.plan.pieces) ks.push_back(p.dense ? 0 : k_of(p));
    Scratch& s = scratch(be);
    const uint64_t seed = splitmix64_mix(ctx_.seed ^ (uint64_t(st.serial) << 32) ^ uint64_t(step_));
    const SparsePairs mine = select_topk(be, s, st.plan, acc, ks, spec_.selection == "sample", spec_.sample_fraction,
                                         seed, &stats_.fallbacks);
    stats_.selected += double(mine.k);
    if (spec_.compressor == "temporal") return refresh(dp, be, st, x, mine, acc, sum);
    overlap(be, x, mine);
    exchange(dp, be, b, st, mine, acc, sum);
    if (spec_.compressor == "dgc") be.scatter_fill(x.u.data(), st.plan.len, mine.idx, mine.k, 0.0f);  // masking
  }

 private:
  static PlanRules rules_of(const CommSpec& spec) {
    PlanRules r;
    r.per_entry = spec.scope == "entry";
    r.min_compress = spec.compressor == "blocktopk" ? 0 : spec.min_compress;
    return r;
  }

  // DGC (Lin et al. 2018, Algorithm 1 with momentum correction): local clipping of this rank's
  // gradient g (section 3.2: to N^-1/2 of the global threshold; here the bucket's share of it,
  // grad_clip sqrt(len / total) / sqrt(P)), u = m u + g, v += u; returns v (the accumulator).
  float* accumulate(Group& dp, Backend& be, const BucketReduce& b, Bucket& st) override {
    if (spec_.compressor != "dgc") return CompressorBase::accumulate(dp, be, b, st);
    const int64_t len = st.plan.len;
    if (!st.extra) st.extra = std::make_unique<SparseExtra>();
    SparseExtra& x = static_cast<SparseExtra&>(*st.extra);
    const bool adam = compresses_momentum();
    if (x.u.empty()) {
      x.u = DeviceBuffer(be, len, "DGC velocity");
      // compress = "momentum": u is this rank's share of AdamW's m, started from the synchronised
      // m of the dense warm-up (m / P: the ranks' velocities sum to it).
      auto m = momenta_.find(b.layout);
      if (adam && m != momenta_.end() && m->second) {
        be.copy(x.u.data(), m->second + b.begin, sizeof(float) * size_t(len));
        be.scale(x.u.data(), 1.0f / float(dp.size()), len);
      }
    }
    float* v = st.residual.data();
    float* g = b.data;
    if (ctx_.grad_clip > 0 && ctx_.total_params > 0) {
      const double limit = ctx_.grad_clip / std::sqrt(double(dp.size())) *
                           std::sqrt(double(len) / double(ctx_.total_params));
      const double norm = std::sqrt(be.sum_squares(g, len));
      if (norm > limit) be.scale(g, float(limit / norm), len);
    }
    // compress = "momentum": u = b1 u + (1 - b1) g with AdamW's b1 ([train] beta1), its moving average (the group's sum of the
    // sent v is then AdamW's m, as the sum of the sent v is SGD's step in DGC).
    const float mu = adam ? float(ctx_.beta1) : float(spec_.momentum);
    be.momentum_update(x.u.data(), x.u.data(), g, len, mu, false, adam ? 1.0f - mu : 1.0f);
    be.add_inplace(v, x.u.data(), len);
    return v;
  }

  // |S_t ∩ S_t-1| / |S_t-1| of this rank's successive selections of the bucket.
  void overlap(Backend& be, SparseExtra& x, SparsePairs mine) {
    if (x.previous_k > 0) {
      stats_.overlap_common += double(be.count_common(reinterpret_cast<const int32_t*>(x.previous.data()),
                                                     x.previous_k, mine.idx, mine.k));
      stats_.overlap_previous += double(x.previous_k);
    }
    if (x.previous.size() < mine.k) x.previous = DeviceBuffer(be, std::max<int64_t>(mine.k, 1), "previous selection");
    if (mine.k > 0) be.copy(x.previous.data(), mine.idx, sizeof(int32_t) * size_t(mine.k));
    x.previous_k = mine.k;
  }

  // This rank's pairs to the group's sum, by the chosen collective; the residual keeps what was
  // not used (split-and-reduce's second selection may drop some of mine: they are added back).
  void exchange(Group& dp, Backend& be, const BucketReduce& b, Bucket& st, SparsePairs mine, float* acc, float* sum) {
    const int64_t len = st.plan.len;
    Scratch& s = scratch(be);
    if (spec_.collective == "allgather" && spec_.packs_pairs()) {
      return exchange_packed(dp, be, st, mine, acc, sum);
    } else if (spec_.collective == "allgather") {
      allgather_pairs_sum(dp, be, mine, len, sum, s);
    } else if (b.kind == ReduceKind::reduce_scatter) {  // the shard is the region: nothing dropped
      float* region = s.floats(kTmp, b.shard);
      split_reduce_scatter(dp, be, mine, len, b.shard, region, s);
      const int64_t lo = std::min(len, dp.rank() * b.shard), hi = std::min(len, lo + b.shard);
      if (hi > lo) be.copy(sum + lo, region, sizeof(float) * size_t(hi - lo));
    } else {
      int64_t k_total = 0;
      for (const Piece& p : st.plan.pieces) k_total += p.dense ? 0 : k_of(p);
      const SparsePairs kept = split_reduce_all(dp, be, mine, len, (k_total + dp.size() - 1) / dp.size(), sum, s);
      if (ef_) {  // mine outside the kept set go back into the residual
        be.scatter_fill(acc, len, mine.idx, mine.k, 0.0f);
        float* back = s.floats(kTmp, len);
        be.fill(back, 0.0f, len);
        be.scatter_add(back, len, mine.idx, mine.val, mine.k, 0);
        be.scatter_fill(back, len, kept.idx, kept.k, 0.0f);
        be.add_inplace(acc, back, len);
      }
      return;
    }
    if (ef_) be.scatter_fill(acc, len, mine.idx, mine.k, 0.0f);
  }

  // The pairs packed (parallel/pair_codec.hpp): the values rounded to what the wire carries (bf16,
  // or sign x the piece's mean magnitude), the pieces as the segments; with error feedback the
  // residual keeps what was not sent and what the rounding lost (acc - the sent value).
  void exchange_packed(Group& dp, Backend& be, Bucket& st, SparsePairs mine, float* acc, float* sum) {
    std::vector<PairSegment> segments;
    for (const Piece& p : st.plan.pieces)
      if (!p.dense) segments.push_back({p.offset, p.offset + p.len});
    const int64_t k = mine.k;
    HostBuffer<int32_t> idx(be, k);
    HostBuffer<float> val(be, k), lost(be, k);
    if (k > 0) {
      be.download(idx.data(), mine.idx, sizeof(int32_t) * size_t(k));
      be.download(val.data(), mine.val, sizeof(float) * size_t(k));
    }
    for (int64_t i = 0; i < k; i++) lost[i] = val[i];
    quantize_pairs(idx.data(), val.data(), k, segments, format_.values);
    for (int64_t i = 0; i < k; i++) lost[i] -= val[i];
    Scratch& s = scratch(be);
    allgather_packed_sum(dp, be, idx.data(), val.data(), k, st.plan.len, segments, format_, sum, s);
    if (!ef_) return;
    be.scatter_fill(acc, st.plan.len, mine.idx, k, 0.0f);
    float* back = s.floats(kRoundingLoss, k);  // acc - the sent value, at the sent indices
    if (k > 0) be.upload(back, lost.data(), sizeof(float) * size_t(k));
    be.scatter_add(acc, st.plan.len, mine.idx, back, k, 0);
  }

  // temporal, a refresh step: the exchange of a top-k step, then the new shared set: the top k of
  // the group's sum in every piece (the same on every rank), or split-and-reduce's kept set.
  void refresh(Group& dp, Backend& be, Bucket& st, SparseExtra& x, SparsePairs mine, float* acc, float* sum) {
    const int64_t len = st.plan.len;
    Scratch& s = scratch(be);
    SparsePairs set;
    if (spec_.collective == "allgather") {
      allgather_pairs_sum(dp, be, mine, len, sum, s);
      if (ef_) be.scatter_fill(acc, len, mine.idx, mine.k, 0.0f);
      std::vector<int64_t> ks;
      for (const Piece& p : st.plan.pieces) ks.push_back(p.dense ? 0 : k_of(p));
      double unused = 0;
      set = select_topk(be, s, st.plan, sum, ks, false, 0, 0, &unused);
    } else {
      int64_t k_total = 0;
      for (const Piece& p : st.plan.pieces) k_total += p.dense ? 0 : k_of(p);
      set = split_reduce_all(dp, be, mine, len, (k_total + dp.size() - 1) / dp.size(), sum, s);
      if (ef_) {
        be.scatter_fill(acc, len, mine.idx, mine.k, 0.0f);
        float* back = s.floats(kTmp, len);
        be.fill(back, 0.0f, len);
        be.scatter_add(back, len, mine.idx, mine.val, mine.k, 0);
        be.scatter_fill(back, len, set.idx, set.k, 0.0f);
        be.add_inplace(acc, back, len);
      }
    }
    if (x.previous_k > 0) {
      stats_.overlap_common +=
          double(be.count_common(reinterpret_cast<const int32_t*>(x.previous.data()), x.previous_k, set.idx, set.k));
      stats_.overlap_previous += double(x.previous_k);
    }
    if (x.previous.size() < set.k) x.previous = DeviceBuffer(be, std::max<int64_t>(set.k, 1), "temporal index set");
    if (set.k > 0) be.copy(x.previous.data(), set.idx, sizeof(int32_t) * size_t(set.k));
    x.previous_k = set.k;
    x.refreshed_at = step_;
    stats_.refreshed = 1;
  }

  // temporal, between refreshes: every rank sends its values at the shared set, summed by one
  // all-reduce of k floats (no indices on the wire).
  void reuse(Group& dp, Backend& be, Bucket& st, SparseExtra& x, float* acc, float* sum) {
    const int64_t len = st.plan.len, k = x.previous_k;
    const int32_t* set = reinterpret_cast<const int32_t*>(x.previous.data());
    float* val = scratch(be).floats(kVal, k);
    be.gather(val, acc, len, set, k);
    if (ef_) be.scatter_fill(acc, len, set, k, 0.0f);
    shared_index_all_reduce(dp, be, set, val, k, len, sum);
    stats_.selected += double(k);
  }

  // blocktopk: blocks of block_size tile the bucket; the blocks that start in a piece compete for
  // its density (scope "entry") or all of them for the bucket's; one block index per block sent.
  void reduce_blocks(Group& dp, Backend& be, Bucket& st, float* acc, float* sum) {
    const int64_t len = st.plan.len, B = spec_.block_size, nb = (len + B - 1) / B;
    Scratch& s = scratch(be);
    float* norms = s.floats(kTmp, nb);
    be.block_sum_squares(norms, acc, len, B);
    int32_t* blocks = s.ints(kBlocks, nb);
    float* unused = s.floats(kVal, nb);
    int64_t kb = 0;
    for (const Piece& p : st.plan.pieces) {
      const int64_t b0 = (p.offset + B - 1) / B, b1 = (p.offset + p.len + B - 1) / B;  // blocks starting here
      if (b1 <= b0) continue;
      Piece group = p;
      group.len = b1 - b0;
      const int64_t want = k_of(group);
      be.topk_abs(blocks + kb, unused + kb, norms + b0, b1 - b0, want, b0);
      kb += want;
    }
    float* val = s.floats(kBlockVal, kb * B);
    be.gather_blocks(val, acc, len, blocks, kb, B);
    allgather_blocks_sum(dp, be, blocks, val, kb, B, len, sum, s);
    if (ef_) be.fill_blocks(acc, len, blocks, kb, B, 0.0f);
    stats_.selected += double(std::min(kb * B, len));
  }

  const PairFormat format_;  // [comm] indices, values: the wire's format of the pairs (pair_codec.hpp)
};

}  // namespace

std::shared_ptr<Compressor> make_sparse(const CommSpec& spec, const CompressorContext& ctx) {
  return std::make_shared<SparseCompressor>(spec, ctx);
}

}  // namespace exatrain::parallel::compress
