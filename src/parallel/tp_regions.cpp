#include "parallel/tp_regions.hpp"

#include <algorithm>

#include "core/check.hpp"
#include "model/layout.hpp"

namespace exatrain::parallel {

namespace {

DType wire_dtype(Half h) { return h == Half::f16 ? DType::f16 : DType::bf16; }

}  // namespace

uint16_t* TpComm::staging(int64_t elements) {
  const int64_t floats = (elements + 1) / 2;
  if (staging_.size() < floats) staging_ = DeviceBuffer(*be_, floats, "tensor-parallel message (16-bit)");
  return reinterpret_cast<uint16_t*>(staging_.data());
}

void TpComm::all_reduce_sum(float* x, int64_t n) {
  if (!sixteen_bit()) return tp_.all_reduce_sum(x, n);
  uint16_t* h = staging(n);
  be_->f32_to_half(wire_, h, x, n);
  tp_.all_reduce(h, n, wire_dtype(wire_), ReduceOp::sum);
  be_->half_to_f32(wire_, x, h, n);
}

void TpComm::all_gather(const float* shard, float* full, int64_t n_shard) {
  if (!sixteen_bit()) return tp_.all_gather(shard, full, n_shard);
  EXA_CHECK(shard != nullptr, "TpComm::all_gather: the 16-bit path takes no in-place (null) shard");
  const int64_t n_full = n_shard * tp_.size();
  uint16_t* in = staging(n_shard + n_full);  // [n_shard] own rows | [n_full] gathered
  be_->f32_to_half(wire_, in, shard, n_shard);
  tp_.all_gather(in, in + n_shard, n_shard, wire_dtype(wire_));
  be_->half_to_f32(wire_, full, in + n_shard, n_full);
}

void TpComm::reduce_scatter_sum(const float* full, float* shard, int64_t n_shard) {
  if (!sixteen_bit()) return tp_.reduce_scatter_sum(full, shard, n_shard);
  EXA_CHECK(full != nullptr, "TpComm::reduce_scatter_sum: the 16-bit path takes no in-place (null) input");
  const int64_t n_full = n_shard * tp_.size();
  uint16_t* in = staging(n_full + n_shard);  // [n_full] partial sums | [n_shard] this rank's sum
  be_->f32_to_half(wire_, in, full, n_full);
  tp_.reduce_scatter(in, in + n_full, n_shard, wire_dtype(wire_));
  be_->half_to_f32(wire_, shard, in + n_full, n_shard);
}

void copy_to_tp_region_backward(TpComm& tp, float* dx, int64_t n) { tp.all_reduce_sum(dx, n); }

void reduce_from_tp_region_forward(TpComm& tp, float* y, int64_t n) { tp.all_reduce_sum(y, n); }

// The sequence-parallel pairs are the flat collectives over the token rows (a one-rank Group
// copies the buffer: the no-op at size 1).
void gather_from_sp_region_forward(TpComm& tp, const float* x_shard, float* x_full, int64_t n_shard) {
  tp.all_gather(x_shard, x_full, n_shard);
}
void gather_from_sp_region_backward(TpComm& tp, const float* dx_full, float* dx_shard, int64_t n_shard) {
  tp.reduce_scatter_sum(dx_full, dx_shard, n_shard);
}
void reduce_scatter_to_sp_region_forward(TpComm& tp, const float* y_partial, float* y_shard, int64_t n_shard) {
  tp.reduce_scatter_sum(y_partial, y_shard, n_shard);
}
void reduce_scatter_to_sp_region_backward(TpComm& tp, const float* dy_shard, float* dy_full, int64_t n_shard) {
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
