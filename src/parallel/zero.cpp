#include "parallel/zero.hpp"

#include <algorithm>
#include <iterator>

#include <sys/mman.h>
#include <unistd.h>

#include "core/check.hpp"

namespace exatrain::parallel {

ZeroLayout ZeroLayout::make(int64_t total, int dp, int64_t align) {
  EXA_CHECK(total >= 0 && dp >= 1 && align >= 1, "bad ZeRO layout: total {} dp {} align {}", total,
            dp, align);
  ZeroLayout z;
  z.total = total;
  z.dp = dp;
  int64_t unit = dp * align;
  z.padded = (total + unit - 1) / unit * unit;
  z.shard = z.padded / dp;
  return z;
}

ShardRange ZeroLayout::owned(int rank) const {
  ShardRange r = range(rank);
  r.begin = std::min(r.begin, total);
  r.end = std::min(r.end, total);
  return r;
}

void reduce_scatter_grads(Group& dp, const ZeroLayout& z, const float* grads, float* shard_out,
                          float scale) {
  EXA_CHECK(dp.size() == z.dp, "ZeRO layout made for dp {} used on a group of {}", z.dp, dp.size());
  dp.reduce_scatter_sum(grads, shard_out, z.shard);
  if (scale != 1.0f) {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < z.shard; i++) shard_out[i] *= scale;
  }
}

void all_gather_params(Group& dp, const ZeroLayout& z, float* params) {
  EXA_CHECK(dp.size() == z.dp, "ZeRO layout made for dp {} used on a group of {}", z.dp, dp.size());
  dp.all_gather(nullptr, params, z.shard);
}

GradBucketer::GradBucketer(Group& dp, float* grads, int64_t n, int64_t bucket_floats, BucketOp op)
    : dp_(dp), grads_(grads), n_(n), bucket_(bucket_floats), op_(op) {
  EXA_CHECK(bucket_floats >= 1, "gradient bucket must hold >= 1 float, got {}", bucket_floats);
  if (op == BucketOp::reduce_scatter) {
    int p = dp.size();
    EXA_CHECK(bucket_floats % p == 0 && n % p == 0,
              "ZeRO-2 buckets need dp to divide the bucket and the arena: bucket {} % dp {} = {}, "
              "arena {} % dp {} = {}",
              bucket_floats, p, bucket_floats % p, n, p, n % p);
  }
  if (op == BucketOp::reduce_scatter) shard_.assign(size_t(n / dp.size()), 0.0f);
  int64_t nb = (n + bucket_ - 1) / bucket_;
  ready_.assign(nb, 0);
  reqs_.resize(nb);
  next_launch_ = nb - 1;
}

int64_t GradBucketer::bucket_size(int64_t b) const {
  return std::min(n_, (b + 1) * bucket_) - b * bucket_;
}

void GradBucketer::mark_ready(int64_t offset, int64_t len) {
  EXA_CHECK(offset >= 0 && len >= 0 && offset + len <= n_,
            "mark_ready({}, {}) outside the gradient arena of {} floats", offset, len, n_);
  if (len == 0) return;
  // A range marked twice would be summed twice: refuse overlaps with earlier ranges.
  auto next = marked_.lower_bound(offset);
  bool overlaps = (next != marked_.end() && next->first < offset + len) ||
                  (next != marked_.begin() && std::prev(next)->second > offset);
  EXA_CHECK(!overlaps, "gradient range {}+{} marked ready twice (overlaps an earlier range)", offset,
            len);
  marked_[offset] = offset + len;
  // Split the range over the buckets it touches.
  for (int64_t pos = offset; pos < offset + len;) {
    int64_t b = pos / bucket_;
    int64_t end = std::min(offset + len, (b + 1) * bucket_);
    ready_[b] += end - pos;
    pos = end;
  }
  launch_ready();
  // Poke the launched requests: Open MPI progresses non-blocking collectives only inside MPI calls.
  for (int64_t b = next_launch_ + 1; b < buckets(); b++) dp_.test(reqs_[b]);
}

void GradBucketer::launch(int64_t b) {
  float* base = grads_ + b * bucket_;
  if (op_ == BucketOp::all_reduce)
    reqs_[b] = dp_.iall_reduce_sum(base, bucket_size(b));
  else  // in place: the summed chunk r lands at the bucket's start, moved into place in finish()
    reqs_[b] = dp_.ireduce_scatter_sum(nullptr, base, bucket_size(b) / dp_.size());
}

void GradBucketer::launch_ready() {
  while (next_launch_ >= 0 && ready_[next_launch_] == bucket_size(next_launch_)) {
    launch(next_launch_);
    next_launch_--;
  }
}

std::vector<ShardRange> GradBucketer::owned_ranges(int rank) const {
  EXA_CHECK(op_ == BucketOp::reduce_scatter, "owned_ranges() is for ZeRO-2 (reduce_scatter) buckets");
  std::vector<ShardRange> out;
  for (int64_t b = 0; b < buckets(); b++) {
    int64_t chunk = bucket_size(b) / dp_.size();
    out.push_back({b * bucket_ + rank * chunk, b * bucket_ + (rank + 1) * chunk});
  }
  return out;
}

void GradBucketer::gather_params(float* params) {
  EXA_CHECK(op_ == BucketOp::reduce_scatter, "gather_params() is for ZeRO-2 (reduce_scatter) buckets");
  std::vector<Request> reqs;
  for (int64_t b = buckets() - 1; b >= 0; b--)
    reqs.push_back(dp_.iall_gather(nullptr, params + b * bucket_, bucket_size(b) / dp_.size()));
  dp_.wait_all(reqs);
}

void GradBucketer::finish(float scale) {
  launched_early_ = buckets() - 1 - next_launch_;
  for (int64_t b = next_launch_; b >= 0; b--) launch(b);
  for (int64_t b = buckets() - 1; b >= 0; b--) dp_.wait(reqs_[b]);
  if (op_ == BucketOp::all_reduce) {
    if (scale != 1.0f) {
#pragma omp parallel for simd schedule(static)
      for (int64_t i = 0; i < n_; i++) grads_[i] *= scale;
    }
  } else {
    // Each bucket's summed chunk (at the bucket's start: in-place reduce-scatter) goes, scaled, to
    // its place in the shard; then the arena's whole pages go back to the OS. Pages at the arena's
    // two ends may be shared with other allocations: they stay (and keep stale partial sums).
    int64_t k = 0;
    for (int64_t b = 0; b < buckets(); b++) {
      int64_t chunk = bucket_size(b) / dp_.size();
      const float* base = grads_ + b * bucket_;
      for (int64_t i = 0; i < chunk; i++) shard_[size_t(k + i)] = base[i] * scale;
      k += chunk;
    }
    const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
    const uintptr_t lo = (uintptr_t(grads_) + page - 1) / page * page;
    const uintptr_t hi = uintptr_t(grads_ + n_) / page * page;
    if (hi > lo)
      EXA_SYSCHECK(madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED) == 0,
                   "madvise(MADV_DONTNEED) of {} reduce-scattered ZeRO-2 gradient bytes", hi - lo);
  }
  std::fill(ready_.begin(), ready_.end(), 0);
  marked_.clear();
  next_launch_ = buckets() - 1;
}

}  // namespace exatrain::parallel
