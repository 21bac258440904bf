// Sharded fp32 masters under mixed precision: ZeRO 1 and 2 at dp > 1 (Megatron's distributed
// optimizer: each data-parallel rank keeps the fp32 main parameters of its shard only, beside the
// whole 16-bit model), and the 16-bit gathers ZeRO 3 runs per unit (HalfGathers, below). The model reads the layer matrices, the head and the embeddings through
// their 16-bit copy only (Gpt::reads_float32), so outside its shard a rank needs no fp32 master of
// those; it keeps the entries the passes read in fp32 (norms and biases, as torch.autocast does;
// about 0.1% of a GPT-2's parameters) whole. After each optimizer step (publish):
//   1. each rank rounds its shard's updated masters into the 16-bit copy,
//   2. the 16-bit copy is all-gathered over dp (2 bytes per parameter, where the fp32 gather sent 4),
//   3. the fp32-read entries are all-gathered in fp32 (their own pieces only, packed into one
//      all-gather per group),
// and the fp32 pages of the 16-bit-only entries outside the shard stay released (Backend::release,
// whole pages then read 0, partial ones NaN; Gpt refuses to convert a stale entry from them,
// Gpt::keep_half_externally). The result is bit for bit the fp32 gather's: rounding is
// elementwise, so who rounds does not matter.
//
// The shards are given as gather groups: contiguous ranges of the arena cut into dp consecutive
// pieces in rank order (ZeRO 1: one group, the whole arena; ZeRO 2: one per gradient bucket;
// ZeRO 3: one per segment). Every rank builds the same groups, so every collective is called in
// the same order everywhere.
//
// Owns: which fp32 masters a rank keeps under ZeRO 1/2, and the 16-bit gathers that refresh the
// rest (ZeRO 1-3). May use: backend/, model/ (Gpt, its layout), parallel/comm (the dp group).
#pragma once
#include <cstdint>
#include <vector>

#include "backend/backend.hpp"
#include "model/gpt.hpp"
#include "parallel/comm.hpp"

namespace exatrain::parallel {

struct GatherGroup {
  int64_t begin = 0;            // arena element where rank 0's piece starts
  std::vector<int64_t> counts;  // [dp]: rank r's piece is counts[r] elements, after rank r-1's
};

struct ArenaSpan {
  int64_t begin = 0, len = 0;  // elements [begin, begin + len) of a model's arena
};

// The 16-bit all-gathers of a mixed-precision model whose fp32 masters are sharded over dp by
// gather groups (disjoint ranges of the arena, each cut into dp consecutive pieces in rank order).
// publish(i), with this rank's piece of group i's fp32 masters in the arena (or at own_masters:
// ZeRO 3 keeps them in its shard buffers, and the arena then receives only the fp32-read
// entries, every rank's parts): steps 1-3 above for group i. Used by MasterShards (ZeRO 1/2: every group after each step) and by ZeRO 3 (a unit's
// segments before each pass over it, parallel/zero3_sync.cpp).
class HalfGathers {
 public:
  HalfGathers(Backend& be, Group& dp, Gpt& model, std::vector<GatherGroup> groups);
  size_t size() const { return groups_.size(); }
  const GatherGroup& group(size_t i) const { return groups_[i]; }
  ArenaSpan own(size_t i) const { return own_[i]; }  // this rank's piece of group i (len may be 0)
  // The spans of the entries the passes read in fp32 (norms, biases), in arena order.
  const std::vector<ArenaSpan>& f32_runs() const { return f32_runs_; }
  void publish(size_t i, const float* own_masters = nullptr);

 private:
  // One group's fp32-read entries: runs of them cut by the ranks' pieces, and each rank's total.
  struct F32Gather {
    std::vector<GatherGroup> runs;
    std::vector<int64_t> counts;  // [dp]: rank r's parts of all runs
  };
  F32Gather f32_gather(const GatherGroup& g) const;
  // from: where rank r's parts are read when packing (null: the arena).
  void pack(const F32Gather& f, int r, bool to_staging, const float* from = nullptr, int64_t from_begin = 0);
  Backend& be_;
  Group& dp_;
  Gpt& model_;
  std::vector<GatherGroup> groups_;
  std::vector<ArenaSpan> own_;       // [groups]
  std::vector<ArenaSpan> f32_runs_;
  std::vector<F32Gather> f32_;       // [groups]: runs empty where the group has no fp32-read entry
  DeviceBuffer staging_;             // [widest packed gather]
};

// ZeRO 1 and 2: the groups tile the arena; this rank keeps in fp32 its pieces and the fp32-read
// entries, and releases the rest.
class MasterShards {
 public:
  MasterShards(Backend& be, Group& dp, Gpt& model, std::vector<GatherGroup> groups);

  // After the optimizer updated this rank's pieces: steps 1-3 above; the model's 16-bit copy is
  // current (Gpt::half_written).
  void publish();
  // The fp32 arena holds every master (initialised, loaded from a checkpoint, gathered): the
  // 16-bit copy from all of it, then the masters this rank does not keep released.
  void masters_written();
  // Every fp32 master into the arena (collective): for tests and tools that read whole weights.
  void gather_full();
  // The fp32 masters this rank does not keep, back to the system.
  void release();
  // Bytes of the fp32 arena this rank does not keep (for the accounted memory).
  int64_t released_bytes() const { return int64_t(sizeof(float)) * released_floats_; }

 private:
  Backend& be_;
  Group& dp_;
  Gpt& model_;
  HalfGathers gathers_;
  std::vector<ArenaSpan> dropped_;  // not kept in fp32: neither own nor read in fp32
  int64_t released_floats_ = 0;
};

}  // namespace exatrain::parallel
