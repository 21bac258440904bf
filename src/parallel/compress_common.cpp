#include "parallel/compress_common.hpp"

#include <algorithm>
#include <cmath>

#include "core/check.hpp"
#include "core/splitmix.hpp"
#include "plan/comm.hpp"

namespace exatrain::parallel {
namespace compress {
namespace {

// Adds [a, b) of the bucket as one piece.
void add_piece(BucketPlan& plan, int64_t a, int64_t b, ParamRole role, int64_t rows, int64_t cols, bool dense,
               const PlanRules& rules) {
  if (a >= b) return;
  Piece p;
  p.offset = a, p.len = b - a, p.role = role, p.rows = rows, p.cols = cols;
  p.dense = dense || p.len < rules.min_compress;
  plan.pieces.push_back(p);
}

// Entry e's part of the bucket: arena [lo, hi) with the bucket starting at `begin`. PowerSGD
// (matrix_rows) keeps whole rows of a 2-D shard as a matrix and sends the partial rows and
// vectors dense (PyTorch's hook all-reduces 1-D tensors uncompressed).
void add_entry(BucketPlan& plan, const ParamInfo& e, int64_t lo, int64_t hi, int64_t begin, const PlanRules& rules) {
  if (!rules.matrix_rows) return add_piece(plan, lo - begin, hi - begin, e.role, 0, 0, false, rules);
  if (e.shard_shape.size() != 2 || e.shard_shape[1] <= 0)
    return add_piece(plan, lo - begin, hi - begin, e.role, 0, 0, true, rules);
  const int64_t cols = e.shard_shape[1];
  const int64_t r0 = (lo - e.offset + cols - 1) / cols, r1 = (hi - e.offset) / cols;
  if (r1 <= r0) return add_piece(plan, lo - begin, hi - begin, e.role, 0, 0, true, rules);
  const int64_t body_lo = e.offset + r0 * cols, body_hi = e.offset + r1 * cols, rows = r1 - r0;
  add_piece(plan, lo - begin, body_lo - begin, e.role, 0, 0, true, rules);
  // PyTorch's _should_compress with min_compression_rate 2: (rows + cols) r * 2 < rows cols.
  const bool worth = 2 * (rows + cols) * rules.rank < rows * cols;
  add_piece(plan, body_lo - begin, body_hi - begin, e.role, rows, cols, !worth, rules);
  add_piece(plan, body_hi - begin, hi - begin, e.role, 0, 0, true, rules);
}

}  // namespace

BucketPlan plan_bucket(const BucketReduce& b, const PlanRules& rules) {
  BucketPlan plan;
  plan.len = b.end - b.begin;
  EXA_CHECK(plan.len > 0 && plan.len <= b.n && plan.len < (int64_t(1) << 31),
            "compressor: bucket [{}, {}) of {} elements (expected 0 < end - begin <= n < 2^31)", b.begin, b.end, b.n);
  if (!b.layout || !rules.per_entry) {
    add_piece(plan, 0, plan.len, ParamRole::matrix, 0, 0, rules.matrix_rows, rules);
  } else {
    int64_t at = b.begin;  // covered so far (arena coordinates); a gap would go dense
    for (const ParamInfo& e : b.layout->entries()) {
      const int64_t lo = std::max(b.begin, e.offset), hi = std::min(b.end, e.offset + e.numel);
      if (lo >= hi) continue;
      if (lo > at) add_piece(plan, at - b.begin, lo - b.begin, ParamRole::matrix, 0, 0, true, rules);
      add_entry(plan, e, lo, hi, b.begin, rules);
      at = hi;
    }
    if (at < b.end) add_piece(plan, at - b.begin, plan.len, ParamRole::matrix, 0, 0, true, rules);
  }
  for (const Piece& p : plan.pieces)
    if (!p.dense) plan.compressible += p.len;
  return plan;
}

Scratch& CompressorBase::scratch(Backend& be) {
  if (!scratch_) scratch_ = std::make_unique<Scratch>(be);
  EXA_CHECK(&scratch_->backend() == &be, "compressor \"{}\" used with two backends", name());
  return *scratch_;
}

// DGC's warm-up (Lin et al. 2018, section 3.3: sparsity 75%, 93.75%, 98.4375%, 99.6%, 99.9% over the
// first epochs): the density falls geometrically from 25% to the target over warmup_steps.
double CompressorBase::density_of(const Piece& p) const {
  auto it = spec_.role_density.find(to_string(p.role));
  double d = it != spec_.role_density.end() ? it->second : spec_.density;
  if (spec_.warmup == "exponential" && step_ <= spec_.warmup_steps && spec_.warmup_steps > 0 && spec_.density < 0.25) {
    const double w = 0.25 * std::pow(spec_.density / 0.25, double(step_) / double(spec_.warmup_steps));
    d = std::max(d, w);
  }
  return std::min(1.0, d);
}

int64_t CompressorBase::k_of(const Piece& p) const {
  return std::clamp<int64_t>(int64_t(std::ceil(density_of(p) * double(p.len))), 1, p.len);
}

std::unique_ptr<Reduction> CompressorBase::start(Group& dp, Backend& be, const BucketReduce& b) {
  if (dp.size() == 1) return identity_.start(dp, be, b);  // nothing to reduce over
  const int p = dp.size(), r = dp.rank();
  stats_.dense_equivalent_bytes +=
      4.0 * double(b.kind == ReduceKind::all_reduce ? plan::ring_all_reduce_sent(b.n, p, r)
                                                     : plan::ring_reduce_scatter_sent(b.shard * p, p, r));
  const auto key = std::make_tuple(b.layout ? uintptr_t(b.layout) : uintptr_t(b.data), b.begin, b.end, int(b.kind));
  auto found = buckets_.find(key);
  if (found == buckets_.end()) {
    Bucket fresh;
    fresh.plan = plan_bucket(b, rules_);
    fresh.serial = int64_t(buckets_.size());
    if (ef_) fresh.residual = DeviceBuffer(be, fresh.plan.len, "error-feedback residual");
    found = buckets_.emplace(key, std::move(fresh)).first;
  }
  Bucket& st = found->second;
  const int64_t len = st.plan.len;
  // The warm-up, or nothing worth compressing (compressed momentum reduces every bucket's momentum,
  // its dense pieces included: the optimizer takes the whole step's buckets as m; small_pieces =
  // "sign" sends a bucket of small pieces only as signs).
  if (dense_step() || (st.plan.compressible == 0 && !compresses_momentum() && spec_.small_pieces != "sign")) {
    stats_.dense_warmup = dense_step() ? 1 : stats_.dense_warmup;
    return identity_.start(dp, be, b);
  }
  gradient_overlap(be, b, st);
  if (compresses_momentum()) {  // DGC's velocity is its own local momentum (sparse_compressors.cpp)
    if (spec_.compressor != "dgc") local_momentum(dp, be, b, st);
    delivered_momentum_ = true;
  }
  float* acc = accumulate(dp, be, b, st);
  Scratch& s = scratch(be);
  float* sum = s.floats(kSum, len);
  stats_.elements += double(st.plan.compressible);
  if (st.plan.compressible > 0) {
    KindTag tag(dp, spec_.compressor);
    reduce(dp, be, b, st, acc, sum);
  }
  reduce_dense_pieces(dp, be, st, acc, sum);
  if (ef_) st.residual_squares = be.sum_squares(st.residual.data(), len);
  write_result(dp, be, b, sum);
  return nullptr;
}

// The temporal hypothesis measured (large gradients stay where they are): the overlap of the raw
// gradient's top-k sets (this rank's, before error feedback, every compressible piece at its
// density) at steps N-1 and N, every N = overlap_every steps. The sent sets' overlap
// (index_overlap) answers another question: with error feedback what was sent is cleared, so the
// next selection favours what accumulated elsewhere.
void CompressorBase::gradient_overlap(Backend& be, const BucketReduce& b, Bucket& st) {
  const int64_t every = spec_.overlap_every;
  const bool sparse = spec_.compressor == "topk" || spec_.compressor == "dgc" || spec_.compressor == "blocktopk" ||
                      spec_.compressor == "temporal";
  if (!sparse || every <= 0 || (step_ % every != 0 && (step_ + 1) % every != 0)) return;
  if (st.gradient_step == step_) return;  // ZeRO 2: the step's first micro-batch
  std::vector<int64_t> ks;
  int64_t total = 0;
  for (const Piece& p : st.plan.pieces) ks.push_back(p.dense ? 0 : k_of(p)), total += ks.back();
  double unused = 0;
  const SparsePairs set = select_topk(be, scratch(be), st.plan, b.data, ks, false, 0, 0, &unused);
  if (st.gradient_step == step_ - 1 && step_ % every == 0 && st.gradient_k > 0) {
    stats_.gradient_common += double(be.count_common(reinterpret_cast<const int32_t*>(st.gradient_topk.data()),
                                                     st.gradient_k, set.idx, set.k));
    stats_.gradient_previous += double(st.gradient_k);
  }
  if (st.gradient_topk.size() < total) st.gradient_topk = DeviceBuffer(be, std::max<int64_t>(total, 1), "gradient top-k");
  if (set.k > 0) be.copy(st.gradient_topk.data(), set.idx, sizeof(int32_t) * size_t(set.k));
  st.gradient_k = set.k, st.gradient_step = step_;
}

// Compressed momentum: this rank's local momentum replaces its gradient in the bucket,
// b1/P m + (1 - b1) g_i with m the synchronised momentum of the previous step (the optimizer's
// exp_avg, bind_momentum): summed over the P ranks it is AdamW's b1 m + (1 - b1) g, g the gradient
// sum the reduction would have made (1-bit Adam's local momentum, Tang et al. 2021, Algorithm 1,
// in the sum convention of the reduction). The error feedback that follows (accumulate) keeps
// the momentum this rank did not send.
void CompressorBase::local_momentum(Group& dp, Backend& be, const BucketReduce& b, const Bucket& st) {
  auto it = momenta_.find(b.layout);
  EXA_CHECK(b.kind == ReduceKind::all_reduce && it != momenta_.end() && it->second,
            "[comm] compress = \"momentum\": bucket [{}, {}) has no optimizer momentum to read (only ZeRO 0 keeps "
            "the whole first moment on every rank and binds it: expected [parallel] zero = 0)", b.begin, b.end);
  const int64_t len = st.plan.len;
  const float beta1 = float(ctx_.beta1);  // as AdamWConfig holds it: the same (1 - b1) as its update
  float* m = scratch(be).floats(kMomentum, len);
  be.copy(m, it->second + b.begin, sizeof(float) * size_t(len));
  be.scale(m, beta1 / float(dp.size()), len);
  be.scale(b.data, 1.0f - beta1, len);
  be.add_inplace(b.data, m, len);
}

float* CompressorBase::accumulate(Group&, Backend& be, const BucketReduce& b, Bucket& st) {
  if (!ef_) return b.data;
  be.add_inplace(st.residual.data(), b.data, st.plan.len);
  return st.residual.data();
}

// The dense pieces in one fp32 all-reduce ("dp_all_reduce"); with error feedback their residual
// is then 0 (everything was sent). [comm] small_pieces = "sign": as scaled signs instead, all-gathered
// under the compressor's kind (1-bit Adam sends every tensor so), their rounding kept by error feedback.
void CompressorBase::reduce_dense_pieces(Group& dp, Backend& be, const Bucket& st, float* acc, float* sum) {
  if (!st.plan.has_dense()) return;
  if (spec_.small_pieces == "sign") {
    std::vector<const Piece*> pieces;
    for (const Piece& p : st.plan.pieces)
      if (p.dense) pieces.push_back(&p);
    KindTag tag(dp, spec_.compressor);
    sign_exchange(dp, be, scratch(be), pieces, acc, sum, ef_);
    return;
  }
  const int64_t n = st.plan.len - st.plan.compressible;
  float* buf = scratch(be).floats(kDense, n);
  int64_t at = 0;
  for (const Piece& p : st.plan.pieces)
    if (p.dense) be.copy(buf + at, acc + p.offset, sizeof(float) * size_t(p.len)), at += p.len;
  dp.all_reduce_sum(buf, n);
  at = 0;
  for (const Piece& p : st.plan.pieces) {
    if (!p.dense) continue;
    be.copy(sum + p.offset, buf + at, sizeof(float) * size_t(p.len));
    if (ef_) be.fill(acc + p.offset, 0.0f, p.len);
    at += p.len;
  }
}

// all_reduce: the sum into the bucket; reduce_scatter: this rank's shard of it into out (the
// padding past the bucket's real elements is 0).
void CompressorBase::write_result(Group& dp, Backend& be, const BucketReduce& b, const float* sum) {
  const int64_t len = b.end - b.begin;
  if (b.kind == ReduceKind::all_reduce) {
    be.copy(b.data, sum, sizeof(float) * size_t(len));
    return;
  }
  const int64_t lo = std::min(len, dp.rank() * b.shard), hi = std::min(len, (dp.rank() + 1) * b.shard);
  if (hi > lo) be.copy(b.out, sum + lo, sizeof(float) * size_t(hi - lo));
  if (b.shard > hi - lo) be.fill(b.out + (hi - lo), 0.0f, b.shard - (hi - lo));
}

std::map<std::string, double> CompressorBase::step_stats() const {
  double residual = 0;
  for (const auto& [key, bucket] : buckets_) residual += bucket.residual_squares;
  std::map<std::string, double> out = {
      {"elements", stats_.elements},
      {"density", stats_.elements > 0 ? stats_.selected / stats_.elements : 1.0},
      {"residual_norm", std::sqrt(residual)},
      {"dense_equivalent_bytes", stats_.dense_equivalent_bytes},
      {"warmup", stats_.dense_warmup}};
  if (stats_.overlap_previous > 0) out["index_overlap"] = stats_.overlap_common / stats_.overlap_previous;
  if (stats_.gradient_previous > 0) out["gradient_overlap"] = stats_.gradient_common / stats_.gradient_previous;
  if (spec_.compressor == "temporal") out["refreshed"] = stats_.refreshed;
  if (spec_.selection == "sample") out["threshold_fallbacks"] = stats_.fallbacks;
  return out;
}

SparsePairs select_topk(Backend& be, Scratch& s, const BucketPlan& plan, const float* acc,
                        const std::vector<int64_t>& ks, bool sampled, double sample_fraction, uint64_t seed,
                        double* fallbacks) {
  int64_t cap = 0;
  for (size_t i = 0; i < plan.pieces.size(); i++) cap += plan.pieces[i].dense ? 0 : 2 * ks[i];
  int32_t* idx = s.ints(kIdx, cap);
  float* val = s.floats(kVal, cap);
  int64_t k = 0;
  for (size_t i = 0; i < plan.pieces.size(); i++) {
    const Piece& p = plan.pieces[i];
    if (p.dense) continue;
    const float* x = acc + p.offset;
    const int64_t want = ks[i];
    if (sampled && want < p.len) {
      // DGC's threshold: the (1 - density) quantile of a sample of |x| (Lin et al. 2018, "we
      // sample only 0.1% to 1% of the gradients"); the count it selects varies around k.
      const int64_t n_s = std::clamp<int64_t>(int64_t(std::ceil(sample_fraction * double(p.len))), 1, p.len);
      HostBuffer<float> host(be, n_s);
      float* dev = s.floats(kSamples, n_s);
      be.sample_abs(dev, x, p.len, n_s, splitmix64_mix(seed + uint64_t(i)));
      be.download(host.data(), dev, sizeof(float) * size_t(n_s));
      const int64_t rank = std::clamp<int64_t>(int64_t(std::ceil(double(want) * double(n_s) / double(p.len))), 1, n_s);
      std::nth_element(host.data(), host.data() + (rank - 1), host.data() + n_s, std::greater<float>());
      const float threshold = host[rank - 1];
      const int64_t got = threshold > 0 ? be.select_abs_at_least(idx + k, val + k, x, p.len, threshold, 2 * want, p.offset) : 0;
      if (got >= 1 && got <= 2 * want) {
        k += got;
        continue;
      }
      *fallbacks += 1;  // nothing above it, or more than twice k: the exact selection
    }
    be.topk_abs(idx + k, val + k, x, p.len, want, p.offset);
    k += want;
  }
  return {idx, val, k};
}

}  // namespace compress

std::shared_ptr<Compressor> make_compressor(const CommSpec& spec, const CompressorContext& ctx) {
  const std::string& c = spec.compressor;
  EXA_CHECK(spec.compress == "gradient" || (spec.compress == "momentum" && c != "none"),
            "[comm] compress = \"{}\" with compressor = \"{}\": expected compress = \"gradient\", or \"momentum\" "
            "with one of topk, dgc, blocktopk, temporal, powersgd, sign", spec.compress, c);
  if (c == "none" && ctx.reduce_bf16) return std::make_shared<Bf16ReduceCompressor>();
  if (c == "none") return std::make_shared<IdentityCompressor>();
  if (c == "topk" || c == "dgc" || c == "blocktopk" || c == "temporal") return compress::make_sparse(spec, ctx);
  if (c == "powersgd") return compress::make_powersgd(spec, ctx);
  if (c == "sign") return compress::make_sign(spec, ctx);
  EXA_FAIL("[comm] compressor = \"{}\": expected one of none, topk, dgc, blocktopk, temporal, powersgd, sign", c);
}

}  // namespace exatrain::parallel
