#include "parallel/zero.hpp"

#include <algorithm>
#include <iterator>

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

ZeroLayout ZeroLayout::aligned(const ParamLayout& layout, int64_t begin, int64_t end, int dp) {
  EXA_CHECK(begin <= end && dp >= 1, "bad aligned ZeRO layout: [{}, {}) over dp {}", begin, end, dp);
  // Entry boundaries inside [begin, end], relative to begin.
  std::vector<int64_t> cuts{0};
  for (const ParamInfo& p : layout.entries()) {
    if (p.offset + p.numel <= begin || p.offset >= end) continue;
    EXA_CHECK(p.offset >= begin && p.offset + p.numel <= end, "aligned ZeRO layout: entry {} [{}, {}) straddles "
              "the range [{}, {})", p.name, p.offset, p.offset + p.numel, begin, end);
    cuts.push_back(p.offset + p.numel - begin);
  }
  EXA_CHECK(cuts.back() == end - begin, "aligned ZeRO layout: the entries cover {} of the {} elements of [{}, {})",
            cuts.back(), end - begin, begin, end);
  ZeroLayout z;
  z.total = z.padded = end - begin;
  z.dp = dp;
  z.bounds.assign(size_t(dp) + 1, z.total);
  z.bounds[0] = 0;
  // Rank r's shard ends at the entry boundary nearest to (r+1) * total / dp (monotone).
  for (int r = 1; r < dp; r++) {
    const double target = double(z.total) * r / dp;
    auto it = std::lower_bound(cuts.begin(), cuts.end(), int64_t(target));
    int64_t c = it == cuts.end() ? cuts.back() : *it;
    if (it != cuts.begin() && target - double(*std::prev(it)) < double(c) - target) c = *std::prev(it);
    z.bounds[size_t(r)] = std::max(c, z.bounds[size_t(r) - 1]);
  }
  for (int r = 0; r < dp; r++) z.shard = std::max(z.shard, z.bounds[size_t(r) + 1] - z.bounds[size_t(r)]);
  return z;
}

ShardRange ZeroLayout::owned(int rank) const {
  ShardRange r = range(rank);
  r.begin = std::min(r.begin, total);
  r.end = std::min(r.end, total);
  return r;
}

std::vector<int64_t> ZeroLayout::counts() const {
  std::vector<int64_t> c;
  for (int r = 0; r < dp; r++) c.push_back(range(r).size());
  return c;
}

void reduce_scatter_grads(Backend& be, Group& dp, const ZeroLayout& z, const float* grads, float* shard_out,
                          float scale) {
  EXA_CHECK(dp.size() == z.dp, "ZeRO layout made for dp {} used on a group of {}", z.dp, dp.size());
  if (z.even()) dp.reduce_scatter_sum(grads, shard_out, z.shard);
  else dp.reduce_scatter_v(grads, shard_out, z.counts(), DType::f32);
  if (scale != 1.0f) be.scale(shard_out, scale, z.range(dp.rank()).size());
}

void all_gather_params(Group& dp, const ZeroLayout& z, float* params) {
  EXA_CHECK(dp.size() == z.dp, "ZeRO layout made for dp {} used on a group of {}", z.dp, dp.size());
  if (z.even()) dp.all_gather(nullptr, params, z.shard);
  else dp.all_gather_v(params, z.counts(), DType::f32);
}

GradBucketer::GradBucketer(Backend& be, Group& dp, Compressor& compressor, float* grads, int64_t n,
                           int64_t bucket_floats, BucketOp op, const std::vector<int64_t>& splits, int max_in_flight,
                           const ParamLayout* layout)
    : be_(be), dp_(dp), compressor_(compressor), layout_(layout), grads_(grads), n_(n), op_(op),
      max_in_flight_(std::max(1, max_in_flight)) {
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
      if (bucket_size(b) % dp.size() != 0) staging_[size_t(b)] = DeviceBuffer(be, chunk(b) * dp.size(), "ZeRO-2 staging");
    }
    shard_ = DeviceBuffer(be, k, "ZeRO-2 gradient shard");
    zero_shard();
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
  // Poke the launched reductions: Open MPI progresses non-blocking collectives only inside MPI calls.
  for (int64_t b = next_launch_ + 1; b < buckets(); b++)
    if (reqs_[size_t(b)]) reqs_[size_t(b)]->test();
}

void GradBucketer::launch(int64_t b) {
  float* base = grads_ + bounds_[size_t(b)];
  BucketReduce r;
  r.index = b;
  r.layout = layout_;
  r.begin = bounds_[size_t(b)];
  r.end = bounds_[size_t(b) + 1];
  if (op_ == BucketOp::all_reduce) {
    r.kind = ReduceKind::all_reduce;
    r.data = r.out = base;
    r.n = bucket_size(b);
  } else {  // in place: the summed chunk r lands at the bucket's start, accumulated by retire()
    DeviceBuffer& pad = staging_[size_t(b)];
    if (!pad.empty()) {
      be_.copy(pad.data(), base, sizeof(float) * size_t(bucket_size(b)));
      be_.fill(pad.data() + bucket_size(b), 0.0f, pad.size() - bucket_size(b));
    }
    r.kind = ReduceKind::reduce_scatter;
    r.data = r.out = pad.empty() ? base : pad.data();
    r.n = chunk(b) * dp_.size();
    r.shard = chunk(b);
    in_flight_.push_back(b);
  }
  reqs_[size_t(b)] = compressor_.start(dp_, be_, r);
}

void GradBucketer::launch_ready() {
  while (next_launch_ >= 0 && ready_[size_t(next_launch_)] == bucket_size(next_launch_)) {
    launch(next_launch_);
    next_launch_--;
  }
}

void GradBucketer::poll() {
  // Testing drives progress (Open MPI has no progress thread) and tells which are done.
  std::vector<int64_t> still;
  for (int64_t b : in_flight_) {
    if (!reqs_[size_t(b)] || reqs_[size_t(b)]->test()) retire(b);
    else still.push_back(b);
  }
  in_flight_ = std::move(still);
  // Bounded memory: beyond max_in_flight the oldest is waited for (every rank launched it).
  while (int64_t(in_flight_.size()) > max_in_flight_) {
    const int64_t b = in_flight_.front();
    if (reqs_[size_t(b)]) reqs_[size_t(b)]->wait();
    retire(b);
    in_flight_.erase(in_flight_.begin());
  }
}

void GradBucketer::retire(int64_t b) {
  reqs_[size_t(b)].reset();
  float* base = grads_ + bounds_[size_t(b)];
  const float* sum = staging_[size_t(b)].empty() ? base : staging_[size_t(b)].data();
  const int64_t mine = owned(b, dp_.rank()).size();
  be_.add_inplace(shard_.data() + shard_at_[size_t(b)], sum, mine);
  retired_[size_t(b)] = 1;
  // The bucket reads 0 from now on: its pages go back to the OS, a page it shares with a
  // neighbouring bucket too once that one is retired as well (the run of retired buckets around
  // it is free memory); otherwise its part of that page is set to 0.
  int64_t lo = b, hi = b;
  while (lo > 0 && retired_[size_t(lo) - 1]) lo--;
  while (hi + 1 < buckets() && retired_[size_t(hi) + 1]) hi++;
  be_.release(base, bucket_size(b), 0.0f, grads_ + bounds_[size_t(lo)], grads_ + bounds_[size_t(hi) + 1]);
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
    DeviceBuffer& pad = staging_[size_t(b)];
    if (!pad.empty()) {  // my owned range at its padded place, then every rank's back to params
      const ShardRange own = owned(b, dp_.rank());
      be_.copy(pad.data() + dp_.rank() * chunk(b), params + own.begin, sizeof(float) * size_t(own.size()));
    }
    reqs.push_back(dp_.iall_gather(nullptr, pad.empty() ? params + bounds_[size_t(b)] : pad.data(), chunk(b)));
  }
  dp_.wait_all(reqs);
  for (int64_t b = 0; b < buckets(); b++)
    if (!staging_[size_t(b)].empty())
      be_.copy(params + bounds_[size_t(b)], staging_[size_t(b)].data(), sizeof(float) * size_t(bucket_size(b)));
}

void GradBucketer::end_micro_batch() {
  EXA_CHECK(op_ == BucketOp::reduce_scatter, "end_micro_batch() is for ZeRO-2 (reduce_scatter) buckets");
  early_ += launched();
  for (int64_t b = next_launch_; b >= 0; b--) launch(b);
  for (int64_t b : in_flight_) {
    if (reqs_[size_t(b)]) reqs_[size_t(b)]->wait();
    retire(b);
  }
  in_flight_.clear();
  std::fill(ready_.begin(), ready_.end(), 0);
  std::fill(retired_.begin(), retired_.end(), 0);
  marked_.clear();
  next_launch_ = buckets() - 1;
}

void GradBucketer::zero_shard() {
  if (!shard_.empty()) be_.zero(shard_.data(), sizeof(float) * size_t(shard_.size()));
}

void GradBucketer::finish(float scale) {
  if (op_ == BucketOp::reduce_scatter) {
    if (!marked_.empty()) end_micro_batch();
    launched_early_ = early_;
    early_ = 0;
    if (scale != 1.0f && !shard_.empty()) be_.scale(shard_.data(), scale, shard_.size());
    return;
  }
  launched_early_ = launched();
  for (int64_t b = next_launch_; b >= 0; b--) launch(b);
  for (int64_t b = buckets() - 1; b >= 0; b--)
    if (reqs_[size_t(b)]) {
      reqs_[size_t(b)]->wait();
      reqs_[size_t(b)].reset();
    }
  if (scale != 1.0f) be_.scale(grads_, scale, n_);
  std::fill(ready_.begin(), ready_.end(), 0);
  marked_.clear();
  next_launch_ = buckets() - 1;
}

}  // namespace exatrain::parallel
