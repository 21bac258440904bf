#include "parallel/zero.hpp"

#include <algorithm>
#include <iterator>

#include <sys/mman.h>
#include <unistd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

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

void return_pages(float* arena, int64_t n, float partial_fill, const char* what) {
  const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
  float* end = arena + n;
  const uintptr_t lo = (uintptr_t(arena) + page - 1) / page * page, hi = uintptr_t(end) / page * page;
  if (hi <= lo) {
    std::fill(arena, end, partial_fill);
    return;
  }
  std::fill(arena, reinterpret_cast<float*>(lo), partial_fill);
  std::fill(reinterpret_cast<float*>(hi), end, partial_fill);
  EXA_SYSCHECK(madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED) == 0,
               "madvise(MADV_DONTNEED) of {} bytes of {}", hi - lo, what);
}

GradBucketer::GradBucketer(Group& dp, float* grads, int64_t n, int64_t bucket_floats, BucketOp op,
                           const std::vector<int64_t>& splits, int max_in_flight)
    : dp_(dp), grads_(grads), n_(n), op_(op), max_in_flight_(std::max(1, max_in_flight)) {
  EXA_CHECK(bucket_floats >= 1, "gradient bucket must hold >= 1 float, got {}", bucket_floats);
  // Bucket bounds: every split (inside the arena) ends a bucket; between splits, buckets of
  // bucket_floats and a shorter last one.
  std::vector<int64_t> ends;
  for (int64_t s : splits)
    if (s > 0 && s < n) ends.push_back(s);
  ends.push_back(n);
  std::sort(ends.begin(), ends.end());
  ends.erase(std::unique(ends.begin(), ends.end()), ends.end());
  bounds_.push_back(0);
  for (int64_t e : ends)
    while (bounds_.back() < e) bounds_.push_back(std::min(e, bounds_.back() + bucket_floats));
  const int64_t nb = int64_t(bounds_.size()) - 1;
  if (op == BucketOp::reduce_scatter) {
    int64_t k = 0;
    staging_.resize(size_t(nb));
    for (int64_t b = 0; b < nb; b++) {
      shard_at_.push_back(k);
      k += owned(b, dp.rank()).size();
      // A bucket dp does not divide is reduce-scattered (and gathered) through a zero-padded copy.
      if (bucket_size(b) % dp.size() != 0) staging_[size_t(b)].assign(size_t(chunk(b) * dp.size()), 0.0f);
    }
    shard_.assign(size_t(k), 0.0f);
    retired_.assign(size_t(nb), 0);
  }
  ready_.assign(size_t(nb), 0);
  reqs_.resize(size_t(nb));
  next_launch_ = nb - 1;
}

int64_t GradBucketer::chunk(int64_t b) const {
  return (bucket_size(b) + dp_.size() - 1) / dp_.size();
}

ShardRange GradBucketer::owned(int64_t b, int rank) const {
  const int64_t begin = bounds_[size_t(b)], size = bucket_size(b), c = chunk(b);
  return {begin + std::min(size, rank * c), begin + std::min(size, (rank + 1) * c)};
}

int64_t GradBucketer::bucket_of(int64_t pos) const {
  return int64_t(std::upper_bound(bounds_.begin(), bounds_.end(), pos) - bounds_.begin()) - 1;
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
    int64_t b = bucket_of(pos);
    int64_t end = std::min(offset + len, bounds_[size_t(b) + 1]);
    ready_[size_t(b)] += end - pos;
    pos = end;
  }
  launch_ready();
  if (op_ == BucketOp::reduce_scatter) {
    poll();
    return;
  }
  // Poke the launched requests: Open MPI progresses non-blocking collectives only inside MPI calls.
  for (int64_t b = next_launch_ + 1; b < buckets(); b++) dp_.test(reqs_[size_t(b)]);
}

void GradBucketer::launch(int64_t b) {
  float* base = grads_ + bounds_[size_t(b)];
  if (op_ == BucketOp::all_reduce) {
    reqs_[size_t(b)] = dp_.iall_reduce_sum(base, bucket_size(b));
  } else {  // in place: the summed chunk r lands at the bucket's start, accumulated by retire()
    std::vector<float>& pad = staging_[size_t(b)];
    if (!pad.empty()) {
      std::copy_n(base, bucket_size(b), pad.begin());
      std::fill(pad.begin() + bucket_size(b), pad.end(), 0.0f);
    }
    reqs_[size_t(b)] = dp_.ireduce_scatter_sum(nullptr, pad.empty() ? base : pad.data(), chunk(b));
    in_flight_.push_back(b);
  }
}

void GradBucketer::launch_ready() {
  while (next_launch_ >= 0 && ready_[size_t(next_launch_)] == bucket_size(next_launch_)) {
    launch(next_launch_);
    next_launch_--;
  }
}

void GradBucketer::poll() {
  // MPI_Test drives progress (Open MPI has no progress thread) and tells which are done.
  std::vector<int64_t> still;
  for (int64_t b : in_flight_) {
    if (dp_.test(reqs_[size_t(b)])) retire(b);
    else still.push_back(b);
  }
  in_flight_ = std::move(still);
  // Bounded memory: beyond max_in_flight the oldest is waited for (every rank launched it).
  while (int64_t(in_flight_.size()) > max_in_flight_) {
    const int64_t b = in_flight_.front();
    dp_.wait(reqs_[size_t(b)]);
    retire(b);
    in_flight_.erase(in_flight_.begin());
  }
}

bool GradBucketer::page_done(uintptr_t page_begin) const {
  const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
  const uintptr_t a = uintptr_t(grads_), z = uintptr_t(grads_ + n_);
  if (page_begin < a || page_begin + page > z) return false;  // shared with other allocations
  const int64_t first = bucket_of(int64_t((page_begin - a) / sizeof(float)));
  const int64_t last = bucket_of(int64_t((page_begin + page - a) / sizeof(float)) - 1);
  for (int64_t k = first; k <= last; k++)
    if (!retired_[size_t(k)]) return false;
  return true;
}

void GradBucketer::retire(int64_t b) {
  float* base = grads_ + bounds_[size_t(b)];
  const float* sum = staging_[size_t(b)].empty() ? base : staging_[size_t(b)].data();
  float* dst = shard_.data() + shard_at_[size_t(b)];
  const int64_t mine = owned(b, dp_.rank()).size();
  for (int64_t i = 0; i < mine; i++) dst[i] += sum[i];
  retired_[size_t(b)] = 1;
  // The bucket's floats on its first and last page read 0 from now on (those pages may be
  // shared with buckets still being written); its inner pages, and an end page once every bucket
  // on it is done, go back to the OS.
  const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
  float* end = base + bucket_size(b);
  const uintptr_t lo = uintptr_t(base) / page * page, hi = (uintptr_t(end) + page - 1) / page * page;
  std::fill(base, std::min(end, reinterpret_cast<float*>(lo + page)), 0.0f);
  std::fill(std::max(base, reinterpret_cast<float*>(hi - page)), end, 0.0f);
  const uintptr_t from = page_done(lo) ? lo : lo + page;
  const uintptr_t to = hi - page > lo ? (page_done(hi - page) ? hi : hi - page) : std::max(from, hi);
  if (to > from)
    EXA_SYSCHECK(madvise(reinterpret_cast<void*>(from), to - from, MADV_DONTNEED) == 0,
                 "madvise(MADV_DONTNEED) of {} reduce-scattered ZeRO-2 gradient bytes", to - from);
}

std::vector<ShardRange> GradBucketer::owned_ranges(int rank) const {
  EXA_CHECK(op_ == BucketOp::reduce_scatter, "owned_ranges() is for ZeRO-2 (reduce_scatter) buckets");
  std::vector<ShardRange> out;
  for (int64_t b = 0; b < buckets(); b++) out.push_back(owned(b, rank));
  return out;
}

void GradBucketer::gather_params(float* params) {
  EXA_CHECK(op_ == BucketOp::reduce_scatter, "gather_params() is for ZeRO-2 (reduce_scatter) buckets");
  std::vector<Request> reqs;
  for (int64_t b = buckets() - 1; b >= 0; b--) {
    std::vector<float>& pad = staging_[size_t(b)];
    if (!pad.empty()) {  // my owned range at its padded place, then every rank's back to params
      const ShardRange own = owned(b, dp_.rank());
      std::copy(params + own.begin, params + own.end, pad.begin() + dp_.rank() * chunk(b));
    }
    reqs.push_back(dp_.iall_gather(nullptr, pad.empty() ? params + bounds_[size_t(b)] : pad.data(), chunk(b)));
  }
  dp_.wait_all(reqs);
  for (int64_t b = 0; b < buckets(); b++)
    if (!staging_[size_t(b)].empty())
      std::copy_n(staging_[size_t(b)].begin(), bucket_size(b), params + bounds_[size_t(b)]);
}

void GradBucketer::end_micro_batch() {
  EXA_CHECK(op_ == BucketOp::reduce_scatter, "end_micro_batch() is for ZeRO-2 (reduce_scatter) buckets");
  early_ += launched();
  for (int64_t b = next_launch_; b >= 0; b--) launch(b);
  for (int64_t b : in_flight_) {
    dp_.wait(reqs_[size_t(b)]);
    retire(b);
  }
  in_flight_.clear();
  std::fill(ready_.begin(), ready_.end(), 0);
  std::fill(retired_.begin(), retired_.end(), 0);
  marked_.clear();
  next_launch_ = buckets() - 1;
}

void GradBucketer::zero_shard() { std::fill(shard_.begin(), shard_.end(), 0.0f); }

void GradBucketer::finish(float scale) {
  if (op_ == BucketOp::reduce_scatter) {
    if (!marked_.empty()) end_micro_batch();
    launched_early_ = early_;
    early_ = 0;
    if (scale != 1.0f)
      for (float& g : shard_) g *= scale;
    return;
  }
  launched_early_ = launched();
  for (int64_t b = next_launch_; b >= 0; b--) launch(b);
  for (int64_t b = buckets() - 1; b >= 0; b--) dp_.wait(reqs_[size_t(b)]);
  if (scale != 1.0f) {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n_; i++) grads_[i] *= scale;
  }
  std::fill(ready_.begin(), ready_.end(), 0);
  marked_.clear();
  next_launch_ = buckets() - 1;
}

}  // namespace exatrain::parallel
