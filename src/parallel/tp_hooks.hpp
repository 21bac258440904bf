// The engine's ParallelHooks (src/model/parallel_hooks.hpp) implemented with the named
// tensor-parallel regions of tp_regions.hpp over the tp Group: each hook is one region's
// collective, so the regions the tests check are the ones the trainer runs.
#pragma once
#include "model/parallel_hooks.hpp"
#include "parallel/tp_regions.hpp"

namespace exatrain::parallel {

// Not final: the Trainer's hooks (train/trainer.cpp) add the unit boundaries (before_layer /
// after_layer) for the gradient sync.
class MpiParallelHooks : public ParallelHooks {
 public:
  // fp32 messages, or (the three-argument form) the regions' tensors in 16 bits: TpComm.
  explicit MpiParallelHooks(Group& tp) : tp_(tp) {}
  MpiParallelHooks(Group& tp, Backend& be, Half wire) : tp_(tp, be, wire) {}
  // Megatron f backward: gradient w.r.t. the replicated input of a column-parallel region.
  void input_grad_allreduce(float* grad, int64_t n) override {
    copy_to_tp_region_backward(tp_, grad, n);
  }
  // Megatron g forward: partial outputs of a row-parallel region (and the vocab-parallel embedding).
  void partial_sum_allreduce(float* data, int64_t n) override {
    reduce_from_tp_region_forward(tp_, data, n);
  }
  void vocab_max_allreduce(float* data, int64_t n) override { vocab_parallel_max(tp_.group(), data, n); }
  void vocab_sum_allreduce(float* data, int64_t n) override { vocab_parallel_sum(tp_.group(), data, n); }
  // Sequence parallelism over the engine's flat token rows. The engine calls one all-gather hook
  // for f~ forward and g~ backward, and one reduce-scatter hook for g~ forward and f~ backward
  // (model/parallel_hooks.hpp): the same collectives, named here by their forward use.
  void sp_all_gather(const float* local, float* full, int64_t n_local) override {
    gather_from_sp_region_forward(tp_, local, full, n_local);
  }
  void sp_reduce_scatter(const float* full, float* local, int64_t n_local) override {
    reduce_scatter_to_sp_region_forward(tp_, full, local, n_local);
  }

 private:
  TpComm tp_;
};

}  // namespace exatrain::parallel
