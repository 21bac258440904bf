// The engine's ParallelHooks (src/model/parallel_hooks.hpp, on the engine branch) implemented
// with this room's tensor-parallel regions over the tp Group. Compiled only once that header is
// present (after the engine and parallel branches are merged), so each branch builds alone.
#pragma once
#if __has_include("model/parallel_hooks.hpp")
#include "model/parallel_hooks.hpp"
#include "parallel/tp_regions.hpp"

namespace exatrain::parallel {

class MpiParallelHooks final : public ParallelHooks {
 public:
  explicit MpiParallelHooks(Group& tp) : tp_(tp) {}
  // Megatron f backward: gradient w.r.t. the replicated input of a column-parallel region.
  void input_grad_allreduce(float* grad, int64_t n) override {
    copy_to_tp_region_backward(tp_, grad, n);
  }
  // Megatron g forward: partial outputs of a row-parallel region (and the vocab-parallel embedding).
  void partial_sum_allreduce(float* data, int64_t n) override {
    reduce_from_tp_region_forward(tp_, data, n);
  }
  void vocab_max_allreduce(float* data, int64_t n) override { vocab_parallel_max(tp_, data, n); }
  void vocab_sum_allreduce(float* data, int64_t n) override { vocab_parallel_sum(tp_, data, n); }
  // Sequence parallelism: the engine splits the flat [B*T] token rows into tp contiguous chunks
  // (rank r holds rows [r*N/tp, (r+1)*N/tp)), so these are plain flat all-gather/reduce-scatter.
  void sp_all_gather(const float* local, float* full, int64_t n_local) override {
    tp_.all_gather(local, full, n_local);
  }
  void sp_reduce_scatter(const float* full, float* local, int64_t n_local) override {
    tp_.reduce_scatter_sum(full, local, n_local);
  }

 private:
  Group& tp_;
};

}  // namespace exatrain::parallel
#define EXATRAIN_HAS_MPI_PARALLEL_HOOKS 1
#endif
