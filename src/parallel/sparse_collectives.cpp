#include "parallel/sparse_collectives.hpp"

#include <algorithm>
#include <cfloat>
#include <vector>

#include "core/check.hpp"

namespace exatrain::parallel {
namespace {

// Scratch slots of the collectives (the compressors use slots below 100).
enum Slot : int {
  kCounts = 100,     // i32 [P] or [2 P]: the counts exchanged
  kGatherIdx,        // i32: all-gathered indices
  kGatherVal,        // f32: all-gathered values
  kRecvIdx,          // i32: split-and-reduce, pairs received for my region
  kRecvVal,
  kRegion,           // f32 [region]: split_reduce_all's summed region
  kKeepIdx,          // i32: the region's kept entries
  kKeepVal,
  kWords,            // i32: all-gathered packed messages
};

constexpr int kTagIdx = 9301, kTagVal = 9302;

// counts[0, n) as int32 into host[0, n): what the count exchanges send (each below 2^31).
void stage_counts(const std::vector<int64_t>& counts, HostBuffer<int32_t>& host) {
  for (size_t i = 0; i < counts.size(); i++) {
    EXA_CHECK(counts[i] >= 0 && counts[i] < (int64_t(1) << 31), "sparse collective: count {} out of range", counts[i]);
    host[int64_t(i)] = int32_t(counts[i]);
  }
}

// Every rank's `mine` (host) through a device buffer: out[P * m] (host), rank after rank.
std::vector<int64_t> all_gather_counts(Group& g, Backend& be, const std::vector<int64_t>& mine, Scratch& s) {
  const int64_t m = int64_t(mine.size()), p = g.size();
  HostBuffer<int32_t> host(be, p * m);
  stage_counts(mine, host);
  int32_t* dev = s.ints(kCounts, p * m);
  be.upload(dev + g.rank() * m, host.data(), sizeof(int32_t) * size_t(m));
  g.all_gather(nullptr, dev, m, DType::i32);
  be.download(host.data(), dev, sizeof(int32_t) * size_t(p * m));
  std::vector<int64_t> out(size_t(p * m));
  for (int64_t i = 0; i < p * m; i++) out[size_t(i)] = host[i];
  return out;
}

// What every rank sends me, from what I send every rank (sends[r]: my count for rank r): one
// all-to-all of P counts through a device buffer, not an all-gather of the P x P matrix, so a
// rank's bytes for the counts grow as P, not P^2 (4 KB, not 4 MB, at P = 1024).
std::vector<int64_t> exchange_counts(Group& g, Backend& be, const std::vector<int64_t>& sends, Scratch& s) {
  const int64_t p = g.size();
  HostBuffer<int32_t> host(be, p);
  stage_counts(sends, host);
  int32_t* dev = s.ints(kCounts, 2 * p);  // [0, p): mine to each rank; [p, 2p): each rank's to me
  be.upload(dev, host.data(), sizeof(int32_t) * size_t(p));
  g.all_to_all(dev, dev + p, 1, DType::i32);
  be.download(host.data(), dev + p, sizeof(int32_t) * size_t(p));
  return std::vector<int64_t>(host.data(), host.data() + p);
}

}  // namespace

float* Scratch::floats(int slot, int64_t n) {
  DeviceBuffer& b = bufs_[slot];
  if (b.size() < std::max<int64_t>(n, 1)) b = DeviceBuffer(be_, std::max<int64_t>(n, 1), "compression scratch");
  return b.data();
}

int32_t* Scratch::ints(int slot, int64_t n) {
  static_assert(sizeof(int32_t) == sizeof(float), "int32 indices share float storage");
  return reinterpret_cast<int32_t*>(floats(slot, n));
}

SparsePairs allgather_pairs_sum(Group& g, Backend& be, SparsePairs mine, int64_t n, float* out, Scratch& s) {
  const std::vector<int64_t> counts = all_gather_counts(g, be, {mine.k}, s);
  int64_t total = 0, at = 0;
  for (int r = 0; r < g.size(); r++) {
    if (r == g.rank()) at = total;
    total += counts[size_t(r)];
  }
  int32_t* idx = s.ints(kGatherIdx, total);
  float* val = s.floats(kGatherVal, total);
  if (mine.k > 0) {
    be.copy(idx + at, mine.idx, sizeof(int32_t) * size_t(mine.k));
    be.copy(val + at, mine.val, sizeof(float) * size_t(mine.k));
  }
  g.all_gather_v(idx, counts, DType::i32);
  g.all_gather_v(val, counts, DType::f32);
  be.fill(out, 0.0f, n);
  be.scatter_add(out, n, idx, val, total, 0);  // rank order: the same bits on every rank
  return {idx, val, total};
}

SparsePairs allgather_packed_sum(Group& g, Backend& be, SparsePairs mine, int64_t n,
                                 const std::vector<PairSegment>& segments, PairFormat format, float* out, Scratch& s) {
  HostBuffer<int32_t> my_idx(be, mine.k);
  HostBuffer<float> my_val(be, mine.k);
  if (mine.k > 0) {
    be.download(my_idx.data(), mine.idx, sizeof(int32_t) * size_t(mine.k));
    be.download(my_val.data(), mine.val, sizeof(float) * size_t(mine.k));
  }
  return allgather_packed_sum(g, be, my_idx.data(), my_val.data(), mine.k, n, segments, format, out, s);
}

SparsePairs allgather_packed_sum(Group& g, Backend& be, const int32_t* my_idx, const float* my_val, int64_t k,
                                 int64_t n, const std::vector<PairSegment>& segments, PairFormat format, float* out,
                                 Scratch& s) {
  const std::vector<uint32_t> words = encode_pairs(my_idx, my_val, k, segments, format);
  const std::vector<int64_t> counts = all_gather_counts(g, be, {int64_t(words.size())}, s);
  std::vector<int64_t> first(size_t(g.size()) + 1, 0);
  for (int r = 0; r < g.size(); r++) first[size_t(r) + 1] = first[size_t(r)] + counts[size_t(r)];
  const int64_t total_words = first[size_t(g.size())];
  int32_t* wire = s.ints(kWords, total_words);
  if (!words.empty()) be.upload(wire + first[size_t(g.rank())], words.data(), sizeof(uint32_t) * words.size());
  g.all_gather_v(wire, counts, DType::i32);
  HostBuffer<uint32_t> all(be, total_words);
  if (total_words > 0) be.download(all.data(), wire, sizeof(uint32_t) * size_t(total_words));
  std::vector<int32_t> idx;
  std::vector<float> val;
  for (int r = 0; r < g.size(); r++)  // rank order: every rank adds the same pairs in the same order
    decode_pairs(all.data() + first[size_t(r)], counts[size_t(r)], segments, format, idx, val);
  const int64_t total = int64_t(idx.size());
  int32_t* gidx = s.ints(kGatherIdx, total);
  float* gval = s.floats(kGatherVal, total);
  if (total > 0) {
    be.upload(gidx, idx.data(), sizeof(int32_t) * size_t(total));
    be.upload(gval, val.data(), sizeof(float) * size_t(total));
  }
  be.fill(out, 0.0f, n);
  be.scatter_add(out, n, gidx, gval, total, 0);
  return {gidx, gval, total};
}

void allgather_blocks_sum(Group& g, Backend& be, const int32_t* blocks, const float* val, int64_t kb, int64_t block,
                          int64_t n, float* out, Scratch& s) {
  const std::vector<int64_t> counts = all_gather_counts(g, be, {kb}, s);
  std::vector<int64_t> value_counts;
  int64_t total = 0, at = 0;
  for (int r = 0; r < g.size(); r++) {
    if (r == g.rank()) at = total;
    total += counts[size_t(r)];
    value_counts.push_back(counts[size_t(r)] * block);
  }
  int32_t* ids = s.ints(kGatherIdx, total);
  float* vals = s.floats(kGatherVal, total * block);
  if (kb > 0) {
    be.copy(ids + at, blocks, sizeof(int32_t) * size_t(kb));
    be.copy(vals + at * block, val, sizeof(float) * size_t(kb * block));
  }
  g.all_gather_v(ids, counts, DType::i32);
  g.all_gather_v(vals, value_counts, DType::f32);
  be.fill(out, 0.0f, n);
  be.scatter_add_blocks(out, n, ids, vals, total, block);
}

void shared_index_all_reduce(Group& g, Backend& be, const int32_t* idx, float* val, int64_t k, int64_t n, float* out) {
  g.all_reduce(val, k, DType::f32, ReduceOp::sum);
  be.fill(out, 0.0f, n);
  be.scatter_add(out, n, idx, val, k, 0);
}

void split_reduce_scatter(Group& g, Backend& be, SparsePairs mine, int64_t n, int64_t region, float* out_region,
                          Scratch& s) {
  const int p = g.size(), me = g.rank();
  EXA_CHECK(region >= 1 && region * p >= n, "split_reduce_scatter: {} regions of {} do not cover {} elements", p,
            region, n);
  // My pairs per region (the indices are ascending): region r is [first[r], first[r+1]).
  std::vector<int64_t> bounds(size_t(p) + 1), first(size_t(p) + 1);
  for (int r = 0; r <= p; r++) bounds[size_t(r)] = std::min<int64_t>(n, int64_t(r) * region);
  be.count_below(first.data(), mine.idx, mine.k, bounds.data(), p + 1);
  first[size_t(p)] = mine.k;
  std::vector<int64_t> sends(static_cast<size_t>(p));
  for (int r = 0; r < p; r++) sends[size_t(r)] = first[size_t(r) + 1] - first[size_t(r)];
  const std::vector<int64_t> receives = exchange_counts(g, be, sends, s);  // receives[r]: rank r's to me
  // What region `me` receives from each rank, back to back in rank order (mine in its place).
  std::vector<int64_t> at(size_t(p) + 1, 0);
  for (int r = 0; r < p; r++) at[size_t(r) + 1] = at[size_t(r)] + receives[size_t(r)];
  int32_t* idx = s.ints(kRecvIdx, at[size_t(p)]);
  float* val = s.floats(kRecvVal, at[size_t(p)]);
  // Every exchange as one batch (Group::post_p2p: one NCCL group, so that no receive waits for a
  // send queued behind it; to each peer the indices, then the values, both ways alike).
  std::vector<P2pCall> calls;
  for (int r = 0; r < p; r++) {
    const int64_t c = receives[size_t(r)], mine_c = sends[size_t(r)];
    if (r == me) {
      if (c > 0) {
        be.copy(idx + at[size_t(r)], mine.idx + first[size_t(r)], sizeof(int32_t) * size_t(c));
        be.copy(val + at[size_t(r)], mine.val + first[size_t(r)], sizeof(float) * size_t(c));
      }
      continue;
    }
    if (c > 0) {
      calls.push_back(P2pCall::recv_into(idx + at[size_t(r)], c, DType::i32, r, kTagIdx));
      calls.push_back(P2pCall::recv_into(val + at[size_t(r)], c, DType::f32, r, kTagVal));
    }
    if (mine_c > 0) {
      calls.push_back(P2pCall::send_from(mine.idx + first[size_t(r)], mine_c, DType::i32, r, kTagIdx));
      calls.push_back(P2pCall::send_from(mine.val + first[size_t(r)], mine_c, DType::f32, r, kTagVal));
    }
  }
  std::vector<Request> reqs = g.post_p2p(calls);
  g.wait_all(reqs);
  // The received indices are global: out_region starts at the region's first element.
  const int64_t begin = bounds[size_t(me)], len = bounds[size_t(me) + 1] - begin;
  be.fill(out_region, 0.0f, region);
  be.scatter_add(out_region, len, idx, val, at[size_t(p)], begin);
}

SparsePairs split_reduce_all(Group& g, Backend& be, SparsePairs mine, int64_t n, int64_t keep, float* out, Scratch& s) {
  const int p = g.size();
  const int64_t region = (n + p - 1) / p;
  float* sum = s.floats(kRegion, region);
  split_reduce_scatter(g, be, mine, n, region, sum, s);
  const int64_t begin = std::min<int64_t>(n, int64_t(g.rank()) * region);
  const int64_t len = std::min<int64_t>(n, begin + region) - begin;
  int32_t* idx = s.ints(kKeepIdx, std::max<int64_t>(keep, 1));
  float* val = s.floats(kKeepVal, std::max<int64_t>(keep, 1));
  // The region's nonzeros when they are few, else its `keep` largest.
  int64_t k = len > 0 ? be.select_abs_at_least(idx, val, sum, len, FLT_TRUE_MIN, keep, begin) : 0;
  if (k > keep) {
    be.topk_abs(idx, val, sum, len, keep, begin);
    k = keep;
  }
  return allgather_pairs_sum(g, be, {idx, val, k}, n, out, s);
}

}  // namespace exatrain::parallel
