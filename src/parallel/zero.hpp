// ZeRO (Rajbhandari et al. 2020) as offset arithmetic over a flat arena, plus the bucketed,
// non-blocking data-parallel gradient reduction (all-reduce or reduce-scatter) whose per-bucket
// reduction is the compressor slot (parallel/compressor.hpp). All memory here is device memory,
// touched only through Backend ops.
//
// Owns: shard arithmetic, gradient buckets. May use: backend/, parallel/comm, parallel/compressor.
//
// ZeRO sharding: the arena of `total` floats is padded to `padded` = a multiple of dp * align so
// that every rank owns one equal, aligned shard [r * shard, (r+1) * shard). The padding tail is
// zero and belongs to the last shard(s); `owned(r)` clamps to the real elements. The caller
// allocates the arena with `padded` floats (reduce-scatter / all-gather need equal blocks).
//   ZeRO 1:   reduce_scatter_grads (grads -> my shard summed) once per step, step on my shard,
//             all_gather_params (every shard -> everyone's arena).
//   ZeRO 2:   GradBucketer in reduce_scatter mode (below): every micro-batch, bucket by bucket.
//   ZeRO 3:   the same all-gather per unit range before use; Backend::release returns it after.
// ZeroLayout::aligned cuts shards only between parameter entries instead (one owner per matrix,
// for optimizers that need whole matrices): shards of unequal size, reduced with
// reduce_scatter_v / all_gather_v.
#pragma once
#include <cstdint>
#include <map>
#include <vector>

#include "backend/backend.hpp"
#include "parallel/comm.hpp"
#include "parallel/compressor.hpp"

namespace exatrain::parallel {

struct ShardRange {
  int64_t begin = 0, end = 0;  // [begin, end) in arena elements
  int64_t size() const { return end - begin; }
};

struct ZeroLayout {
  int64_t total = 0;   // real elements
  int64_t padded = 0;  // multiple of dp * align, >= total (aligned layouts: = total)
  int64_t shard = 0;   // padded / dp (aligned layouts: the largest shard)
  int dp = 1;
  // Aligned layouts only: rank r owns [bounds[r], bounds[r+1]) (dp + 1 entries, cut between
  // parameter entries); empty for the even layout of make().
  std::vector<int64_t> bounds;

  // align: shard sizes are multiples of it (e.g. 16 floats = one 64-byte cache line).
  static ZeroLayout make(int64_t total, int dp, int64_t align = 16);
  // Shards of [begin, end) of `layout`'s arena (offsets relative to begin) that cut only between
  // entries: each rank's share as close to (end - begin) / dp as whole entries allow (a rank may
  // own nothing when entries are large). The entries must tile [begin, end).
  static ZeroLayout aligned(const ParamLayout& layout, int64_t begin, int64_t end, int dp);
  bool even() const { return bounds.empty(); }
  ShardRange range(int rank) const {
    return even() ? ShardRange{rank * shard, (rank + 1) * shard} : ShardRange{bounds[size_t(rank)], bounds[size_t(rank) + 1]};
  }
  // The real (unpadded) elements of that shard; may be empty for the last ranks of a tiny arena.
  ShardRange owned(int rank) const;
  std::vector<int64_t> counts() const;  // aligned: every rank's shard size
};

// grads[padded] (this rank's full gradient) -> shard_out[shard] = sum over dp ranks of my shard,
// multiplied by `scale` (1/dp for a mean).
void reduce_scatter_grads(Backend& be, Group& dp, const ZeroLayout& z, const float* grads, float* shard_out,
                          float scale);
// params[padded]: this rank's shard is already at params + rank * shard; fills the others.
void all_gather_params(Group& dp, const ZeroLayout& z, float* params);

// Bucketed, non-blocking gradient all-reduce over the dp group (PyTorch DDP style). The arena is
// cut into buckets of at most `bucket_floats`, also ending at each offset in `splits` (e.g. the
// tied embedding's end, so that its buckets are the same on every stage that holds a copy).
// Backward calls mark_ready for every gradient range it finishes; when a bucket is complete it is
// launched with MPI_Iallreduce. MPI requires every rank to launch collectives in the same order, so
// buckets are launched strictly from the last to the first (the order backward produces them when
// the arena is in forward order); a complete bucket waits for its successors. finish() launches
// the rest, waits and scales by `scale`. One object serves every step: finish() re-arms it.
// Call mark_ready from the thread that initialised MPI (MPI_THREAD_FUNNELED), e.g. between the
// OpenMP-parallel kernels of backward, not from inside a parallel region.
//
// ZeRO 2 (BucketOp::reduce_scatter) = DeepSpeed stage 2: each complete bucket is reduce-scattered
// instead, EVERY micro-batch, so rank r owns chunk r of every bucket ([begin + r*c, begin +
// (r+1)*c) with c = ceil(size / p), clamped to the bucket; listed by owned_ranges(r)): the
// optimizer steps on those ranges only, and gather_params() all-gathers the updated parameters
// bucket by bucket. A bucket dp does not divide goes through a zero-padded copy of p*c floats (at
// most a few: choose bucket_floats divisible by dp). As soon as a bucket's reduce-scatter has completed
// (mark_ready tests the launched ones while backward goes on; at most `max_in_flight` stay in
// flight, the oldest is waited for beyond that; end_micro_batch() waits for the rest) its summed
// chunk is ACCUMULATED into shard_grads() (about n / dp floats, the owned ranges back to back, as the
// optimizer's moments are laid out) and its whole pages in the arena go back to the OS (a page it
// shares with a neighbouring bucket once that one is done too); the rest reads 0 for the next
// micro-batch. So the gradient arena holds only the buckets being written or in flight, and a
// rank keeps 1/dp of the gradients in the shard, for any number of micro-batches. By the ledger's
// convention the step's reduce-scatters add up to m reduce-scatters of the whole arena, as the
// planner counts ZeRO 2 (exactly when dp divides every bucket; a padded bucket sends its padding
// too). The arena must read 0 at the first micro-batch (a fresh or released one).
enum class BucketOp { all_reduce, reduce_scatter };

class GradBucketer {
 public:
  // grads: device [n]. Each bucket's reduction goes through `compressor` (the identity: the
  // dense collective); layout (may be null) tells it which entries a bucket holds.
  GradBucketer(Backend& be, Group& dp, Compressor& compressor, float* grads, int64_t n, int64_t bucket_floats,
               BucketOp op = BucketOp::all_reduce, const std::vector<int64_t>& splits = {},
               int max_in_flight = 2, const ParamLayout* layout = nullptr);
  void mark_ready(int64_t offset, int64_t len);
  // reduce_scatter mode, after each micro-batch's backward: launch what is left, wait for every
  // bucket, accumulate and release them; re-arms for the next micro-batch.
  void end_micro_batch();
  // all_reduce mode: launch the rest, wait, scale the arena. reduce_scatter mode: end the micro-batch
  // if anything was marked since the last end_micro_batch(), then scale the shard.
  void finish(float scale);
  // reduce_scatter mode: the shard's gradients to 0, before a step's first micro-batch.
  void zero_shard();
  int64_t buckets() const { return static_cast<int64_t>(ready_.size()); }
  ShardRange bucket(int64_t b) const { return {bounds_[size_t(b)], bounds_[size_t(b) + 1]}; }
  // reduce_scatter mode: the arena ranges rank r owns (one per bucket, in arena order).
  std::vector<ShardRange> owned_ranges(int rank) const;
  // reduce_scatter mode: params[n] holds this rank's updated owned ranges; fills in the rest.
  void gather_params(float* params);
  // reduce_scatter mode: the step's summed gradients of owned_ranges(rank) in that order, back to
  // back (scaled by finish()).
  const float* shard_grads() const { return shard_.data(); }
  float* shard_grads() { return shard_.data(); }
  int64_t shard_size() const { return shard_.size(); }
  // Buckets started so far in this micro-batch / step (before finish()).
  int64_t launched() const { return buckets() - 1 - next_launch_; }
  // Buckets launched before finish() (all_reduce) or before end_micro_batch() (reduce_scatter,
  // summed over the step's micro-batches) in the last step: the overlap achieved.
  int64_t launched_early() const { return launched_early_; }

 private:
  void launch_ready();
  void launch(int64_t b);
  int64_t bucket_of(int64_t pos) const;  // the bucket holding arena element pos
  int64_t bucket_size(int64_t b) const { return bounds_[size_t(b) + 1] - bounds_[size_t(b)]; }
  int64_t chunk(int64_t b) const;                // reduce_scatter: ceil(bucket size / dp)
  ShardRange owned(int64_t b, int rank) const;   // reduce_scatter: rank's chunk of bucket b, clamped
  void poll();             // reduce_scatter: retire completed buckets, bound those in flight
  void retire(int64_t b);  // reduce_scatter: accumulate b's chunk into the shard, free its pages

  Backend& be_;
  Group& dp_;
  Compressor& compressor_;
  const ParamLayout* layout_;
  float* grads_;
  int64_t n_;
  BucketOp op_;
  int max_in_flight_;
  std::vector<int64_t> bounds_;  // bucket b = [bounds_[b], bounds_[b+1])
  std::vector<int64_t> shard_at_;  // reduce_scatter: bucket b's chunk starts at shard_[shard_at_[b]]
  std::vector<int64_t> ready_;  // elements marked ready per bucket
  std::map<int64_t, int64_t> marked_;  // begin -> end of every range marked this micro-batch
  std::vector<std::unique_ptr<Reduction>> reqs_;  // per bucket, while in flight
  std::vector<uint8_t> retired_;   // reduce_scatter: bucket done this micro-batch
  std::vector<int64_t> in_flight_; // reduce_scatter: launched, not retired, oldest first
  DeviceBuffer shard_;             // reduce_scatter mode: this rank's summed chunks [sum of owned sizes]
  std::vector<DeviceBuffer> staging_;  // reduce_scatter: [dp * chunk] for buckets dp does not divide
  int64_t next_launch_;         // highest bucket index not launched yet (-1: all launched)
  int64_t early_ = 0;           // reduce_scatter: launched before end_micro_batch, this step
  int64_t launched_early_ = 0;
};

}  // namespace exatrain::parallel
