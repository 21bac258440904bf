// Tensor-parallel regions (Megatron-LM, Shoeybi et al. 2019, and sequence parallelism, Korthikanti
// et al. 2022) as named forward/backward pairs on float buffers. Every one is a no-op (or a plain
// copy) when the tp group has one rank, so the model calls them unconditionally.
//
//   region                           forward          backward
//   copy_to_tp_region        (f)     identity         all-reduce
//   reduce_from_tp_region    (g)     all-reduce       identity
//   gather_from_sp_region    (f~)    all-gather rows  reduce-scatter rows
//   reduce_scatter_to_sp_region (g~) reduce-scatter   all-gather rows
//
// The sequence-parallel pairs work on the engine's layout: the flat token rows [N, C] of a
// micro-batch (N = B*T), rank r holding the contiguous rows [r*N/tp, (r+1)*N/tp) (see
// model/parallel_hooks.hpp). A shard is therefore one contiguous block and the pairs are plain
// flat all-gather / reduce-scatter, chunks in rank order; n_shard = (N/tp) * C floats.
//
// The regions' activations and activation gradients (and the vocabulary-parallel embedding's
// output, whose all-reduce is g's) cross the tp group as TpComm says: fp32, or
// under mixed precision in 16 bits ([train] tp_comm_dtype, docs/precision.md "Tensor-parallel
// messages"). The vocabulary-parallel cross-entropy statistics stay fp32 either way.
#pragma once
#include <cstdint>

#include "backend/backend.hpp"
#include "parallel/comm.hpp"

namespace exatrain::parallel {

// The tp group and the format the regions' tensors cross it in. fp32: the Group's fp32
// collectives on the buffers themselves. 16-bit (Megatron's: its activations are in the params
// dtype, so its tp collectives are bf16): each collective rounds its input to nearest even into a
// staging buffer (Backend::f32_to_half), runs on the 16-bit elements (a sum adds each pair in
// fp32 and rounds it back: MpiGroup's 16-bit MPI_Op, NCCL's bf16/fp16 sum) and widens the result
// exactly into the fp32 destination; half the bytes. A one-rank group keeps fp32 (nothing is sent).
class TpComm {
 public:
  explicit TpComm(Group& tp) : tp_(tp) {}
  TpComm(Group& tp, Backend& be, Half wire) : tp_(tp), be_(&be), wire_(wire) {}
  Group& group() const { return tp_; }
  bool sixteen_bit() const { return be_ != nullptr && tp_.size() > 1; }
  void all_reduce_sum(float* x, int64_t n);                           // x[n] in place
  void all_gather(const float* shard, float* full, int64_t n_shard);  // [n_shard] -> [tp * n_shard]
  void reduce_scatter_sum(const float* full, float* shard, int64_t n_shard);

 private:
  uint16_t* staging(int64_t elements);  // at least `elements` 16-bit elements of device memory

  Group& tp_;
  Backend* be_ = nullptr;
  Half wire_ = Half::bf16;
  DeviceBuffer staging_;
};

// f: x[n] enters the region replicated. Forward: identity. Backward: dx[n] all-reduced in place.
inline void copy_to_tp_region_forward(TpComm&, float*, int64_t) {}
void copy_to_tp_region_backward(TpComm& tp, float* dx, int64_t n);

// g: partial sums y[n] leave the region. Forward: all-reduce in place. Backward: identity.
void reduce_from_tp_region_forward(TpComm& tp, float* y, int64_t n);
inline void reduce_from_tp_region_backward(TpComm&, float*, int64_t) {}

// f~: x_shard[N/tp, C] -> x_full[N, C] (forward all-gather of the token rows);
//     dx_full[N, C] -> dx_shard[N/tp, C] (backward reduce-scatter, SUM, rank r keeps chunk r).
void gather_from_sp_region_forward(TpComm& tp, const float* x_shard, float* x_full, int64_t n_shard);
void gather_from_sp_region_backward(TpComm& tp, const float* dx_full, float* dx_shard, int64_t n_shard);

// g~: y_partial[N, C] -> y_shard[N/tp, C] (forward reduce-scatter, SUM);
//     dy_shard[N/tp, C] -> dy_full[N, C] (backward all-gather).
void reduce_scatter_to_sp_region_forward(TpComm& tp, const float* y_partial, float* y_shard, int64_t n_shard);
void reduce_scatter_to_sp_region_backward(TpComm& tp, const float* dy_shard, float* dy_full, int64_t n_shard);

// Vocabulary-parallel embedding and cross-entropy: rank r owns vocabulary rows [begin, end).
struct VocabRange {
  int64_t begin = 0, end = 0;
};
// Contiguous slices of ceil(vocab / tp) rows, the last one shorter: model/layout.hpp's
// vocab_slice, so that the runtime, the model and the planner agree on who owns which row.
VocabRange vocab_range(int64_t vocab, int tp, int rank);
// Cross-entropy across vocabulary shards: global max of the logits (numerical stability), then
// the global sum of exp(logit - max) and of the target logit. In place on [n] buffers.
void vocab_parallel_max(Group& tp, float* row_max, int64_t n);
void vocab_parallel_sum(Group& tp, float* partial_sum, int64_t n);

}  // namespace exatrain::parallel
