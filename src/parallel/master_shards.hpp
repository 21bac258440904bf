// Sharded fp32 masters under mixed precision, ZeRO 1 and 2 at dp > 1 (Megatron's distributed
// optimizer: each data-parallel rank keeps the fp32 main parameters of its shard only, beside the
// whole 16-bit model). The model's GEMMs read the layer matrices and the head through their 16-bit
// copy only (Gpt::reads_float32), so outside its shard a rank needs no fp32 master of those; it
// keeps the entries the passes read in fp32 (embeddings, norms, biases, as torch.autocast does)
// whole. After each optimizer step (publish):
//   1. each rank rounds its shard's updated masters into the 16-bit copy,
//   2. the 16-bit copy is all-gathered over dp (2 bytes per parameter, where the fp32 gather sent 4),
//      less the large fp32-read runs (embeddings),
//   3. the fp32-read entries are all-gathered in fp32 (their own pieces only; the small ones
//      packed into one all-gather per group, an embedding in place and then rounded locally),
// and the fp32 pages of the 16-bit-only entries outside the shard stay released (Backend::release,
// whole pages then read 0, partial ones NaN; Gpt refuses to convert a stale entry from them,
// Gpt::keep_half_externally). The result is bit for bit the
// fp32 gather's: rounding is elementwise, so who rounds does not matter.
//
// The shards are given as gather groups: contiguous ranges of the arena cut into dp consecutive
// pieces in rank order (ZeRO 1: one group, the whole arena; ZeRO 2: one per gradient bucket).
// Every rank builds the same groups, so every collective is called in the same order everywhere.
//
// Owns: which fp32 masters a rank keeps, and the gathers that refresh the rest. May use: backend/,
// model/ (Gpt, its layout), parallel/comm (the dp group).
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
  struct Span {
    int64_t begin = 0, len = 0;
  };
  Backend& be_;
  Group& dp_;
  Gpt& model_;
  std::vector<GatherGroup> groups_;      // the shards (the full fp32 gather's groups)
  std::vector<GatherGroup> half_groups_; // the 16-bit copy's gathers: groups_ less the large fp32-read runs
  // One group's fp32-read entries: runs of them cut by the ranks' pieces, and each rank's total.
  struct F32Gather {
    std::vector<GatherGroup> runs;
    std::vector<int64_t> counts;  // [dp]: rank r's parts of all runs
    bool in_place = false;        // one large run, gathered in the arena without staging
  };
  std::vector<Span> add_f32_gather(const GatherGroup& g, int64_t end, const std::vector<Span>& f32_runs);
  void pack(const F32Gather& f, int r, bool to_staging);
  std::vector<F32Gather> f32_gathers_;   // per group with fp32-read entries: one packed gather
  DeviceBuffer staging_;                 // [widest packed gather]
  std::vector<Span> own_;                // this rank's pieces
  std::vector<Span> own_half_;           // own_ less the large fp32-read runs: rounded in publish step 1
  std::vector<Span> dropped_;            // not kept in fp32: neither own nor read in fp32
  int64_t released_floats_ = 0;
};

}  // namespace exatrain::parallel
