// Collectives for sparse data over a Group (docs/compression.md, "Sparse collectives"). Every rank
// holds (index, value) pairs into a buffer of n elements, indices ascending, and every rank ends
// with the same sum, bit for bit (the pairs are added in rank order). Everything goes through the
// Group, so the ledger counts the bytes exactly (by its ring convention, by dtype); the callers tag
// the kinds (Group::KindTag). Buffers are device memory; counts travel through host staging.
//
//   collective             per-rank volume (pairs sent, ring convention)     result
//   allgather_pairs_sum    (P-1) x k  (+ P-1 counts)                        every rank's pairs summed
//   allgather_blocks_sum   (P-1) x kb blocks: kb indices and kb x block values
//   shared-index all-red.  2 (P-1)/P x k values, no indices                  the values at common indices
//   split_reduce_scatter   about k (P-1)/P  (+ P - 1 counts, one all-to-all) region r's sum on rank r
//   split_reduce_all       about 2 k (P-1)/P: split, then the `keep` largest each region's owner
//                          selects are all-gathered (Ok-Topk: does not grow with P)
// (k: pairs per rank, P: ranks.) The all-gather of pairs is the baseline; split-and-reduce follows
// Ok-Topk (Li and Hoefler, PPoPP 2022) with equal regions (Ok-Topk balances the regions by the
// previous step's index distribution) and a per-region top-`keep` for its global selection.
//
// Owns: the sparse collectives. May use: backend/ (ops, device memory), parallel/comm.
#pragma once
#include <cstdint>
#include <map>

#include "backend/backend.hpp"
#include "parallel/comm.hpp"
#include "parallel/pair_codec.hpp"

namespace exatrain::parallel {

// Device scratch for the collectives and the compressors, by slot, grown on demand and kept.
class Scratch {
 public:
  explicit Scratch(Backend& be) : be_(be) {}
  float* floats(int slot, int64_t n);    // >= n floats (at least 1)
  int32_t* ints(int slot, int64_t n);    // >= n int32 (the same storage, 4 bytes each)
  Backend& backend() const { return be_; }

 private:
  Backend& be_;
  std::map<int, DeviceBuffer> bufs_;
};

// This rank's pairs (device): idx[k] ascending in [0, n), val[k].
struct SparsePairs {
  const int32_t* idx = nullptr;
  const float* val = nullptr;
  int64_t k = 0;
};

// 1. All-gather of every rank's pairs (their counts first: ranks may hold different k); out[n] is
// zeroed and every rank's pairs are added in rank order. Returns the gathered pairs, rank after
// rank (in scratch: valid until the next call with this scratch).
SparsePairs allgather_pairs_sum(Group& g, Backend& be, SparsePairs mine, int64_t n, float* out, Scratch& s);

// 1a. The same with the pairs packed (parallel/pair_codec.hpp: Rice-coded gaps, fp32 / bf16 / sign
// values, already quantized by the caller): each rank's message as 32-bit words, the word counts
// all-gathered first, then the words (all_gather_v, i32), decoded in rank order on the host.
// Returns the decoded pairs of every rank, rank after rank (in scratch).
SparsePairs allgather_packed_sum(Group& g, Backend& be, SparsePairs mine, int64_t n,
                                 const std::vector<PairSegment>& segments, PairFormat format, float* out, Scratch& s);
// The same from pairs the caller holds on the host (the packed compressors quantize there): no
// download. idx[k] ascending within each segment, val[k] as the format carries them.
SparsePairs allgather_packed_sum(Group& g, Backend& be, const int32_t* idx, const float* val, int64_t k, int64_t n,
                                 const std::vector<PairSegment>& segments, PairFormat format, float* out, Scratch& s);

// 1b. The same for blocks (blocktopk): block indices blocks[kb] (blocks of `block` elements tiling
// [0, n)) and their values val[kb * block] (0 past n) all-gathered; out[n] = every rank's blocks
// added in rank order. One index per block on the wire.
void allgather_blocks_sum(Group& g, Backend& be, const int32_t* blocks, const float* val, int64_t kb, int64_t block,
                          int64_t n, float* out, Scratch& s);

// 2. Shared-index all-reduce: every rank holds values at the same idx[k] (a common index set, e.g.
// temporal reuse): val[k] summed over the group in place, then out[n] = 0 + val at idx.
void shared_index_all_reduce(Group& g, Backend& be, const int32_t* idx, float* val, int64_t k, int64_t n, float* out);

// 3a. Split and reduce: the index space is cut into regions of `region` elements (region r =
// [r region, min(n, (r+1) region)), one per rank); every rank sends its pairs of region r to rank r
// (point-to-point), which adds them in rank order into out_region[region] (zeroed here). A sparse
// reduce-scatter: rank r ends with the sum of region r.
void split_reduce_scatter(Group& g, Backend& be, SparsePairs mine, int64_t n, int64_t region, float* out_region,
                          Scratch& s);

// 3b. Split and reduce, then every region's owner keeps its `keep` entries of largest magnitude
// (its nonzeros when fewer) and those are all-gathered: out[n] = the sum at the kept indices, 0
// elsewhere. Returns the kept pairs of every rank (ascending: regions in rank order), e.g. for
// error feedback of what was dropped.
SparsePairs split_reduce_all(Group& g, Backend& be, SparsePairs mine, int64_t n, int64_t keep, float* out, Scratch& s);

}  // namespace exatrain::parallel
