#include "parallel/tp_regions.hpp"

#include <algorithm>
#include <cstring>

#include "core/check.hpp"
#include "model/layout.hpp"

namespace exatrain::parallel {

void copy_to_tp_region_backward(Group& tp, float* dx, int64_t n) { tp.all_reduce_sum(dx, n); }

void reduce_from_tp_region_forward(Group& tp, float* y, int64_t n) { tp.all_reduce_sum(y, n); }

// [B, T, C] <-> [tp, B, T/tp, C]: shard s of batch b is rows [s*Ts, (s+1)*Ts) of that batch.
static void pack_by_shard(const float* full, float* packed, int64_t B, int64_t T, int64_t C,
                          int p) {
  int64_t Ts = T / p;
  for (int s = 0; s < p; s++)
    for (int64_t b = 0; b < B; b++)
      std::memcpy(packed + ((s * B + b) * Ts) * C, full + (b * T + s * Ts) * C,
                  sizeof(float) * Ts * C);
}

static void unpack_by_shard(const float* packed, float* full, int64_t B, int64_t T, int64_t C,
                            int p) {
  int64_t Ts = T / p;
  for (int s = 0; s < p; s++)
    for (int64_t b = 0; b < B; b++)
      std::memcpy(full + (b * T + s * Ts) * C, packed + ((s * B + b) * Ts) * C,
                  sizeof(float) * Ts * C);
}

// The packing buffer is reused across calls (one per thread) instead of allocated per layer.
static std::vector<float>& scratch(int64_t n) {
  static thread_local std::vector<float> buf;
  if (static_cast<int64_t>(buf.size()) < n) buf.resize(n);
  return buf;
}

static void check_seq(const Group& tp, int64_t T) {
  EXA_CHECK(T % tp.size() == 0,
            "sequence parallelism needs seq_len divisible by tp: seq_len {} % tp {} = {}", T,
            tp.size(), T % tp.size());
}

static void all_gather_seq(Group& tp, const float* shard, float* full, int64_t B, int64_t T,
                           int64_t C) {
  check_seq(tp, T);
  int64_t n_shard = B * (T / tp.size()) * C;
  if (tp.size() == 1) {
    std::copy(shard, shard + n_shard, full);
    return;
  }
  std::vector<float>& packed = scratch(n_shard * tp.size());  // [tp, B, T/tp, C]
  tp.all_gather(shard, packed.data(), n_shard);
  unpack_by_shard(packed.data(), full, B, T, C, tp.size());
}

static void reduce_scatter_seq(Group& tp, const float* full, float* shard, int64_t B, int64_t T,
                               int64_t C) {
  check_seq(tp, T);
  int64_t n_shard = B * (T / tp.size()) * C;
  if (tp.size() == 1) {
    std::copy(full, full + n_shard, shard);
    return;
  }
  std::vector<float>& packed = scratch(n_shard * tp.size());  // [tp, B, T/tp, C]
  pack_by_shard(full, packed.data(), B, T, C, tp.size());
  tp.reduce_scatter_sum(packed.data(), shard, n_shard);
}

void gather_from_sp_region_forward(Group& tp, const float* x_shard, float* x_full, int64_t B,
                                   int64_t T, int64_t C) {
  all_gather_seq(tp, x_shard, x_full, B, T, C);
}
void gather_from_sp_region_backward(Group& tp, const float* dx_full, float* dx_shard, int64_t B,
                                    int64_t T, int64_t C) {
  reduce_scatter_seq(tp, dx_full, dx_shard, B, T, C);
}
void reduce_scatter_to_sp_region_forward(Group& tp, const float* y_partial, float* y_shard,
                                         int64_t B, int64_t T, int64_t C) {
  reduce_scatter_seq(tp, y_partial, y_shard, B, T, C);
}
void reduce_scatter_to_sp_region_backward(Group& tp, const float* dy_shard, float* dy_full,
                                          int64_t B, int64_t T, int64_t C) {
  all_gather_seq(tp, dy_shard, dy_full, B, T, C);
}

VocabRange vocab_range(int64_t vocab, int tp, int rank) {
  EXA_CHECK(vocab >= tp, "vocab-parallel needs vocab >= tp: vocab {} < tp {}", vocab, tp);
  const VocabSlice s = vocab_slice(vocab, tp, rank);  // the model's (and the planner's) split
  return {s.start, s.start + s.rows};
}

void vocab_parallel_max(Group& tp, float* row_max, int64_t n) { tp.all_reduce_max(row_max, n); }
void vocab_parallel_sum(Group& tp, float* partial_sum, int64_t n) {
  tp.all_reduce_sum(partial_sum, n);
}

}  // namespace exatrain::parallel
