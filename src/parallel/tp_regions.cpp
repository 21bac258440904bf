#include "parallel/tp_regions.hpp"

#include <algorithm>

#include "core/check.hpp"
#include "model/layout.hpp"

namespace exatrain::parallel {

void copy_to_tp_region_backward(Group& tp, float* dx, int64_t n) { tp.all_reduce_sum(dx, n); }

void reduce_from_tp_region_forward(Group& tp, float* y, int64_t n) { tp.all_reduce_sum(y, n); }

// The sequence-parallel pairs are the Group's flat collectives over the token rows (a one-rank
// Group copies the buffer: the no-op at size 1).
void gather_from_sp_region_forward(Group& tp, const float* x_shard, float* x_full, int64_t n_shard) {
  tp.all_gather(x_shard, x_full, n_shard);
}
void gather_from_sp_region_backward(Group& tp, const float* dx_full, float* dx_shard, int64_t n_shard) {
  tp.reduce_scatter_sum(dx_full, dx_shard, n_shard);
}
void reduce_scatter_to_sp_region_forward(Group& tp, const float* y_partial, float* y_shard, int64_t n_shard) {
  tp.reduce_scatter_sum(y_partial, y_shard, n_shard);
}
void reduce_scatter_to_sp_region_backward(Group& tp, const float* dy_shard, float* dy_full, int64_t n_shard) {
  tp.all_gather(dy_shard, dy_full, n_shard);
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
