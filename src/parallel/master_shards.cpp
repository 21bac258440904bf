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

MasterShards::MasterShards(Backend& be, Group& dp, Gpt& model, std::vector<GatherGroup> groups)
    : be_(be), dp_(dp), model_(model), groups_(std::move(groups)) {
  EXA_CHECK(model.params_half() != nullptr, "sharded masters: the model has no 16-bit copy (precision fp32)");
  const int64_t n = model.num_params();
  // The entries read in fp32, as runs of adjacent ones (fewer, larger gathers).
  std::vector<Span> f32_runs;
  for (const ParamInfo& p : model.layout().entries()) {
    if (!Gpt::reads_float32(p)) continue;
    if (!f32_runs.empty() && f32_runs.back().begin + f32_runs.back().len == p.offset)
      f32_runs.back().len += p.numel;
    else
      f32_runs.push_back({p.offset, p.numel});
  }
  std::vector<Span> kept = f32_runs;  // in fp32 on this rank: the fp32-read runs and its own pieces
  std::vector<Span> large;            // the large fp32-read runs' parts, in arena order
  int64_t at = 0;                     // the groups tile [0, n) in order
  for (const GatherGroup& g : groups_) {
    EXA_CHECK(int(g.counts.size()) == dp.size() && g.begin == at,
              "sharded masters: gather group at {} with {} pieces does not continue the tiling at {} over dp {}",
              g.begin, g.counts.size(), at, dp.size());
    const int64_t end = g.begin + total(g.counts);
    int64_t piece = g.begin;
    for (int r = 0; r < dp.size(); r++) {
      if (r == dp.rank() && g.counts[size_t(r)] > 0) own_.push_back({piece, g.counts[size_t(r)]});
      piece += g.counts[size_t(r)];
    }
    // The 16-bit gathers skip the large fp32-read runs: their copy is rounded here from the fp32
    // gather (an embedding would otherwise cross the wire twice, in 16 and in 32 bits).
    int64_t from = g.begin;
    for (const Span& big : add_f32_gather(g, end, f32_runs)) {
      if (big.begin > from) half_groups_.push_back(cut(g, from, big.begin));
      from = big.begin + big.len;
      large.push_back(big);
    }
    if (end > from) half_groups_.push_back(cut(g, from, end));
    at = end;
  }
  EXA_CHECK(at == n, "sharded masters: the gather groups cover [0, {}) of an arena of {}", at, n);
  // Step 1 rounds the own pieces less the large runs (those are rounded whole after their gather).
  for (const Span& o : own_) {
    int64_t lo = o.begin;
    const int64_t hi = o.begin + o.len;
    for (const Span& big : large) {
      if (big.begin + big.len <= lo || big.begin >= hi) continue;
      if (big.begin > lo) own_half_.push_back({lo, big.begin - lo});
      lo = std::max(lo, big.begin + big.len);
    }
    if (hi > lo) own_half_.push_back({lo, hi - lo});
  }
  kept.insert(kept.end(), own_.begin(), own_.end());
  std::sort(kept.begin(), kept.end(), [](const Span& a, const Span& b) { return a.begin < b.begin; });
  int64_t covered = 0;  // the complement of the kept spans in [0, n)
  for (const Span& k : kept) {
    if (k.begin > covered) dropped_.push_back({covered, k.begin - covered});
    covered = std::max(covered, k.begin + k.len);
  }
  if (covered < n) dropped_.push_back({covered, n - covered});
  for (const Span& d : dropped_) released_floats_ += d.len;
  int64_t widest = 0;
  for (const F32Gather& f : f32_gathers_)
    if (!f.in_place) widest = std::max(widest, total(f.counts));
  staging_ = DeviceBuffer(be, widest, "sharded masters: fp32 gather staging");
  model.keep_half_externally();
}

// The fp32-read runs' parts of group g ([g.begin, end)), each cut by the ranks' pieces. The small
// ones (norms and biases, a few thousand elements each: latency-bound) are gathered in one
// all_gather_v, rank r's parts of every run packed in run order forming its piece; a large one (an
// embedding) is gathered in place on its own, so the staging buffer stays small. Returns the
// large ones' spans, in order.
std::vector<MasterShards::Span> MasterShards::add_f32_gather(const GatherGroup& g, int64_t end,
                                                             const std::vector<Span>& f32_runs) {
  constexpr int64_t kInPlace = int64_t(1) << 16;  // elements (256 KiB): a gather of its own
  F32Gather f;
  f.counts.assign(size_t(dp_.size()), 0);
  std::vector<Span> large;
  for (const Span& run : f32_runs) {
    const int64_t lo = std::max(run.begin, g.begin), hi = std::min(run.begin + run.len, end);
    if (lo >= hi) continue;
    GatherGroup part = cut(g, lo, hi);
    if (hi - lo >= kInPlace) {
      f32_gathers_.push_back({{part}, part.counts, true});
      large.push_back({lo, hi - lo});
      continue;
    }
    for (int r = 0; r < dp_.size(); r++) f.counts[size_t(r)] += part.counts[size_t(r)];
    f.runs.push_back(std::move(part));
  }
  if (!f.runs.empty()) f32_gathers_.push_back(std::move(f));
  return large;
}

// Copies rank r's parts of f's runs between the arena and its piece of the packed staging buffer
// (to_staging: arena -> staging).
void MasterShards::pack(const F32Gather& f, int r, bool to_staging) {
  float* params = model_.params();
  float* packed = staging_.data();
  for (int q = 0; q < r; q++) packed += f.counts[size_t(q)];
  for (const GatherGroup& run : f.runs) {
    int64_t at = run.begin;  // rank r's part of the run starts after the lower ranks' parts
    for (int q = 0; q < r; q++) at += run.counts[size_t(q)];
    const size_t bytes = sizeof(float) * size_t(run.counts[size_t(r)]);
    if (bytes > 0) to_staging ? be_.copy(packed, params + at, bytes) : be_.copy(params + at, packed, bytes);
    packed += run.counts[size_t(r)];
  }
}

void MasterShards::publish() {
  float* params = model_.params();
  uint16_t* half = model_.params_half();
  for (const Span& s : own_half_) be_.f32_to_half(model_.half_format(), half + s.begin, params + s.begin, s.len);
  // 2-byte elements moved as they are (the fp16 bits too: an all-gather computes nothing).
  for (const GatherGroup& g : half_groups_) dp_.all_gather_v(half + g.begin, g.counts, DType::bf16);
  for (const F32Gather& f : f32_gathers_) {
    if (f.in_place) {  // and its 16-bit copy from the gathered masters
      dp_.all_gather_v(params + f.runs[0].begin, f.counts, DType::f32);
      const int64_t at = f.runs[0].begin;
      be_.f32_to_half(model_.half_format(), half + at, params + at, total(f.counts));
      continue;
    }
    pack(f, dp_.rank(), true);
    dp_.all_gather_v(staging_.data(), f.counts, DType::f32);
    for (int r = 0; r < dp_.size(); r++)
      if (r != dp_.rank()) pack(f, r, false);
  }
  model_.half_written();
}

void MasterShards::masters_written() {
  be_.f32_to_half(model_.half_format(), model_.params_half(), model_.params(), model_.num_params());
  model_.half_written();
  release();
}

void MasterShards::gather_full() {
  for (const GatherGroup& g : groups_) dp_.all_gather_v(model_.params() + g.begin, g.counts, DType::f32);
}

void MasterShards::release() {
  for (const Span& d : dropped_)
    be_.release(model_.params() + d.begin, d.len, std::numeric_limits<float>::quiet_NaN());
}

}  // namespace exatrain::parallel
