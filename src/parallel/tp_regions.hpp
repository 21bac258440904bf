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
#pragma once
#include <cstdint>

#include "parallel/comm.hpp"

namespace exatrain::parallel {

// f: x[n] enters the region replicated. Forward: identity. Backward: dx[n] all-reduced in place.
inline void copy_to_tp_region_forward(Group&, float*, int64_t) {}
void copy_to_tp_region_backward(Group& tp, float* dx, int64_t n);

// g: partial sums y[n] leave the region. Forward: all-reduce in place. Backward: identity.
void reduce_from_tp_region_forward(Group& tp, float* y, int64_t n);
inline void reduce_from_tp_region_backward(Group&, float*, int64_t) {}

// f~: x_shard[N/tp, C] -> x_full[N, C] (forward all-gather of the token rows);
//     dx_full[N, C] -> dx_shard[N/tp, C] (backward reduce-scatter, SUM, rank r keeps chunk r).
void gather_from_sp_region_forward(Group& tp, const float* x_shard, float* x_full, int64_t n_shard);
void gather_from_sp_region_backward(Group& tp, const float* dx_full, float* dx_shard, int64_t n_shard);

// g~: y_partial[N, C] -> y_shard[N/tp, C] (forward reduce-scatter, SUM);
//     dy_shard[N/tp, C] -> dy_full[N, C] (backward all-gather).
void reduce_scatter_to_sp_region_forward(Group& tp, const float* y_partial, float* y_shard, int64_t n_shard);
void reduce_scatter_to_sp_region_backward(Group& tp, const float* dy_shard, float* dy_full, int64_t n_shard);

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
