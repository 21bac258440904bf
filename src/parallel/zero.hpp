// ZeRO (Rajbhandari et al. 2020) as offset arithmetic over a flat arena, plus the bucketed,
// non-blocking data-parallel gradient all-reduce.
//
// ZeRO sharding: the arena of `total` floats is padded to `padded` = a multiple of dp * align so
// that every rank owns one equal, aligned shard [r * shard, (r+1) * shard). The padding tail is
// zero and belongs to the last shard(s); `owned(r)` clamps to the real elements. The caller
// allocates the arena with `padded` floats (reduce-scatter / all-gather need equal blocks).
//   ZeRO 1/2: reduce_scatter_grads (grads -> my shard summed), step on my shard,
//             all_gather_params (every shard -> everyone's arena).
//   ZeRO 3:   the same all-gather per layer range before use; the caller frees the copy after.
#pragma once
#include <cstdint>
#include <map>
#include <vector>

#include "parallel/comm.hpp"

namespace exatrain::parallel {

struct ShardRange {
  int64_t begin = 0, end = 0;  // [begin, end) in arena elements
  int64_t size() const { return end - begin; }
};

struct ZeroLayout {
  int64_t total = 0;   // real elements
  int64_t padded = 0;  // multiple of dp * align, >= total
  int64_t shard = 0;   // padded / dp
  int dp = 1;

  // align: shard sizes are multiples of it (e.g. 16 floats = one 64-byte cache line).
  static ZeroLayout make(int64_t total, int dp, int64_t align = 16);
  ShardRange range(int rank) const { return {rank * shard, (rank + 1) * shard}; }
  // The real (unpadded) elements of that shard; may be empty for the last ranks of a tiny arena.
  ShardRange owned(int rank) const;
};

// grads[padded] (this rank's full gradient) -> shard_out[shard] = sum over dp ranks of my shard,
// multiplied by `scale` (1/dp for a mean).
void reduce_scatter_grads(Group& dp, const ZeroLayout& z, const float* grads, float* shard_out,
                          float scale);
// params[padded]: this rank's shard is already at params + rank * shard; fills the others.
void all_gather_params(Group& dp, const ZeroLayout& z, float* params);

// Bucketed, non-blocking gradient all-reduce over the dp group (PyTorch DDP style). The arena is
// cut into fixed buckets of `bucket_floats` [b * size, (b+1) * size). Backward calls mark_ready
// for every gradient range it finishes; when a bucket is complete it is launched with
// MPI_Iallreduce. MPI requires every rank to launch collectives in the same order, so buckets are
// launched strictly from the last to the first (the order backward produces them when the arena
// is in forward order); a complete bucket waits for its successors. finish() launches the rest,
// waits and scales by `scale`. One object serves every step: finish() re-arms it.
// Call mark_ready from the thread that initialised MPI (MPI_THREAD_FUNNELED), e.g. between the
// OpenMP-parallel kernels of backward, not from inside a parallel region.
//
// ZeRO 2 (BucketOp::reduce_scatter): each complete bucket is reduce-scattered instead, so rank r
// ends up owning chunk r of EVERY bucket ([b*B + r*B/p, b*B + (r+1)*B/p), listed by
// owned_ranges(r)): the optimizer steps on those ranges only, and gather_params() all-gathers the
// updated parameters bucket by bucket. Needs dp to divide bucket_floats and n (pad the arena, e.g.
// with ZeroLayout). By the ledger's convention the reduce-scatters then add up to exactly one
// reduce-scatter of the whole arena, as the planner counts it. Gradient MEMORY is sharded too:
// finish() moves each bucket's summed chunk into shard_grads() (n / dp floats, the owned ranges
// back to back, as the optimizer's moments are laid out) and returns the arena's whole pages to
// the OS (madvise MADV_DONTNEED: they read 0 until the next backward writes them), so between
// steps a rank keeps 1/dp of the gradients resident. Do not read the arena after finish().
enum class BucketOp { all_reduce, reduce_scatter };

class GradBucketer {
 public:
  GradBucketer(Group& dp, float* grads, int64_t n, int64_t bucket_floats,
               BucketOp op = BucketOp::all_reduce);
  void mark_ready(int64_t offset, int64_t len);
  void finish(float scale);
  int64_t buckets() const { return static_cast<int64_t>(ready_.size()); }
  // reduce_scatter mode: the arena ranges rank r owns (one per bucket, in arena order).
  std::vector<ShardRange> owned_ranges(int rank) const;
  // reduce_scatter mode: params[n] holds this rank's updated owned ranges; fills in the rest.
  void gather_params(float* params);
  // reduce_scatter mode, after finish(): the summed, scaled gradients of owned_ranges(rank) in
  // that order, back to back [n / dp].
  const float* shard_grads() const { return shard_.data(); }
  // Buckets started so far in this step (before finish()).
  int64_t launched() const { return buckets() - 1 - next_launch_; }
  // Buckets launched before finish() in the last step (overlap achieved), for tests and logs.
  int64_t launched_early() const { return launched_early_; }

 private:
  void launch_ready();
  int64_t bucket_size(int64_t b) const;

  void launch(int64_t b);

  Group& dp_;
  float* grads_;
  int64_t n_, bucket_;
  BucketOp op_;
  std::vector<int64_t> ready_;  // elements marked ready per bucket
  std::map<int64_t, int64_t> marked_;  // begin -> end of every range marked this step
  std::vector<Request> reqs_;
  std::vector<float> shard_;    // reduce_scatter mode: this rank's summed chunks [n / dp]
  int64_t next_launch_;         // highest bucket index not launched yet (-1: all launched)
  int64_t launched_early_ = 0;
};

}  // namespace exatrain::parallel
