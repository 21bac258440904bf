#include "parallel/master_shards.hpp"

#include <algorithm>
#include <limits>

#include "core/check.hpp"

namespace exatrain::parallel {
namespace {

int64_t total(const std::vector<int64_t>& counts) {
  int64_t n = 0;
  for (int64_t c : counts) n += c;
  return n;
}

// The part of group g inside [lo, hi), cut by the ranks' pieces (consecutive, in rank order, so
// it is a gather group itself).
GatherGroup cut(const GatherGroup& g, int64_t lo, int64_t hi) {
  GatherGroup part{lo, std::vector<int64_t>(g.counts.size(), 0)};
  int64_t p0 = g.begin;
  for (size_t r = 0; r < g.counts.size(); r++) {
    const int64_t p1 = p0 + g.counts[r];
    part.counts[r] = std::max<int64_t>(0, std::min(hi, p1) - std::max(lo, p0));
    p0 = p1;
  }
  return part;
}

}  // namespace

HalfGathers::HalfGathers(Backend& be, Group& dp, Gpt& model, std::vector<GatherGroup> groups)
    : be_(be), dp_(dp), model_(model), groups_(std::move(groups)) {
  EXA_CHECK(model.params_half() != nullptr, "sharded masters: the model has no 16-bit copy (precision fp32)");
  // The entries read in fp32, as runs of adjacent ones (fewer, larger gathers).
  for (const ParamInfo& p : model.layout().entries()) {
    if (!Gpt::reads_float32(p)) continue;
    if (!f32_runs_.empty() && f32_runs_.back().begin + f32_runs_.back().len == p.offset)
      f32_runs_.back().len += p.numel;
    else
      f32_runs_.push_back({p.offset, p.numel});
  }
  int64_t widest = 0;
  for (const GatherGroup& g : groups_) {
    EXA_CHECK(int(g.counts.size()) == dp.size(), "sharded masters: gather group at {} has {} pieces over dp {}",
              g.begin, g.counts.size(), dp.size());
    int64_t piece = g.begin;
    for (int r = 0; r < dp.rank(); r++) piece += g.counts[size_t(r)];
    own_.push_back({piece, g.counts[size_t(dp.rank())]});
    f32_.push_back(f32_gather(g));
    widest = std::max(widest, total(f32_.back().counts));
  }
  staging_ = DeviceBuffer(be, widest, "sharded masters: fp32 gather staging");
  model.keep_half_externally();
}

// The fp32-read runs' parts of group g, each cut by the ranks' pieces, gathered in one
// all_gather_v: rank r's parts of every run packed in run order form its piece. They are norms
// and biases (a few thousand elements each: latency-bound), about 0.1% of a GPT-2's parameters,
// so they also ride in the 16-bit gather rather than cutting it into many small ones.
HalfGathers::F32Gather HalfGathers::f32_gather(const GatherGroup& g) const {
  F32Gather f;
  f.counts.assign(size_t(dp_.size()), 0);
  const int64_t end = g.begin + total(g.counts);
  for (const ArenaSpan& run : f32_runs_) {
    const int64_t lo = std::max(run.begin, g.begin), hi = std::min(run.begin + run.len, end);
    if (lo >= hi) continue;
    GatherGroup part = cut(g, lo, hi);
    for (int r = 0; r < dp_.size(); r++) f.counts[size_t(r)] += part.counts[size_t(r)];
    f.runs.push_back(std::move(part));
  }
  return f;
}

// Copies rank r's parts of f's runs between the arena and its piece of the packed staging buffer
// (to_staging: arena -> staging; or from[] -> staging, from[0] being arena element from_begin).
void HalfGathers::pack(const F32Gather& f, int r, bool to_staging, const float* from, int64_t from_begin) {
  float* params = model_.params();
  float* packed = staging_.data();
  for (int q = 0; q < r; q++) packed += f.counts[size_t(q)];
  for (const GatherGroup& run : f.runs) {
    int64_t at = run.begin;  // rank r's part of the run starts after the lower ranks' parts
    for (int q = 0; q < r; q++) at += run.counts[size_t(q)];
    const size_t bytes = sizeof(float) * size_t(run.counts[size_t(r)]);
    const float* src = from ? from + (at - from_begin) : params + at;
    if (bytes > 0) to_staging ? be_.copy(packed, src, bytes) : be_.copy(params + at, packed, bytes);
    packed += run.counts[size_t(r)];
  }
}

void HalfGathers::publish(size_t i, const float* own_masters) {
  uint16_t* half = model_.params_half();
  const ArenaSpan& o = own_[i];
  const float* own = own_masters ? own_masters : model_.params() + o.begin;
  if (o.len > 0) be_.f32_to_half(model_.half_format(), half + o.begin, own, o.len);
  // 2-byte elements moved as they are (the fp16 bits too: an all-gather computes nothing).
  dp_.all_gather_v(half + groups_[i].begin, groups_[i].counts, DType::bf16);
  const F32Gather& f = f32_[i];
  if (f.runs.empty()) return;
  pack(f, dp_.rank(), true, own_masters, o.begin);
  dp_.all_gather_v(staging_.data(), f.counts, DType::f32);
  for (int r = 0; r < dp_.size(); r++)
    if (r != dp_.rank() || own_masters) pack(f, r, false);
}

MasterShards::MasterShards(Backend& be, Group& dp, Gpt& model, std::vector<GatherGroup> groups)
    : be_(be), dp_(dp), model_(model), gathers_(be, dp, model, std::move(groups)) {
  const int64_t n = model.num_params();
  std::vector<ArenaSpan> kept = gathers_.f32_runs();  // in fp32 on this rank: the fp32-read runs and its own pieces
  int64_t at = 0;                                     // the groups tile [0, n) in order
  for (size_t i = 0; i < gathers_.size(); i++) {
    const GatherGroup& g = gathers_.group(i);
    EXA_CHECK(g.begin == at, "sharded masters: gather group at {} does not continue the tiling at {}", g.begin, at);
    at = g.begin + total(g.counts);
    if (gathers_.own(i).len > 0) kept.push_back(gathers_.own(i));
  }
  EXA_CHECK(at == n, "sharded masters: the gather groups cover [0, {}) of an arena of {}", at, n);
  std::sort(kept.begin(), kept.end(), [](const ArenaSpan& a, const ArenaSpan& b) { return a.begin < b.begin; });
  int64_t covered = 0;  // the complement of the kept spans in [0, n)
  for (const ArenaSpan& k : kept) {
    if (k.begin > covered) dropped_.push_back({covered, k.begin - covered});
    covered = std::max(covered, k.begin + k.len);
  }
  if (covered < n) dropped_.push_back({covered, n - covered});
  for (const ArenaSpan& d : dropped_) released_floats_ += d.len;
}

void MasterShards::publish() {
  for (size_t i = 0; i < gathers_.size(); i++) gathers_.publish(i);
  model_.half_written();
}

void MasterShards::masters_written() {
  be_.f32_to_half(model_.half_format(), model_.params_half(), model_.params(), model_.num_params());
  model_.half_written();
  release();
}

void MasterShards::gather_full() {
  for (size_t i = 0; i < gathers_.size(); i++) {
    const GatherGroup& g = gathers_.group(i);
    dp_.all_gather_v(model_.params() + g.begin, g.counts, DType::f32);
  }
}

void MasterShards::release() {
  for (const ArenaSpan& d : dropped_)
    be_.release(model_.params() + d.begin, d.len, std::numeric_limits<float>::quiet_NaN());
}

}  // namespace exatrain::parallel
