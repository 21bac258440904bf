// Tensor-parallel description and communication hooks. The model contains NO communication
// code: at the points where Megatron-LM places a collective it calls one of these hooks.
// The default (NoParallelHooks) is a no-op, correct for tp_size == 1. The parallel runtime
// implements the hooks with MPI on the tensor-parallel communicator.
//
// Where the model calls each hook (N = B*T rows of the local micro-batch, C = hidden):
//   * column-parallel entry ("f" in Megatron): identity forward; backward all-reduce(SUM) of the
//     gradient w.r.t. the replicated input, shape [N, C]. Called before QKV, before FC1/gate-up,
//     and before the vocabulary-parallel LM head -> hook `input_grad_allreduce`.
//   * row-parallel exit ("g"): forward all-reduce(SUM) of the partial output [N, C]; identity
//     backward. Called after the attention out-projection and after FC2/down-projection,
//     BEFORE the (replicated) bias is added -> hook `partial_sum_allreduce`.
//   * vocabulary-parallel embedding: each rank writes the rows of tokens in its vocabulary slice
//     and zeros elsewhere; the forward sums [N, C] across ranks -> `partial_sum_allreduce`.
//   * vocabulary-parallel cross-entropy: all-reduce(MAX) of the row maxima [N]
//     (`vocab_max_allreduce`), then all-reduce(SUM) of [2, N] = {sum of exp, target logit}
//     (`vocab_sum_allreduce`).
// Every hook is called by all tp ranks in the same order with the same n (a collective).
#pragma once
#include <cstdint>

namespace exatrain {

// Which slice of each sharded weight this model instance holds.
struct TensorParallel {
  int rank = 0;  // tp_rank in [0, size)
  int size = 1;  // tp_size; heads, kv_heads and ffn_hidden must be divisible by it. The
                 // vocabulary is cut in slices of ceil(vocab/size) rows, the last one shorter.
};

class ParallelHooks {
 public:
  virtual ~ParallelHooks() = default;
  // Backward of a column-parallel region's entry: grad[n] summed over tp ranks, in place.
  virtual void input_grad_allreduce(float* grad, int64_t n) = 0;
  // Forward of a row-parallel region's exit (and of the vocab-parallel embedding), in place.
  virtual void partial_sum_allreduce(float* data, int64_t n) = 0;
  // Cross-entropy statistics over the vocabulary slices, in place.
  virtual void vocab_max_allreduce(float* data, int64_t n) = 0;
  virtual void vocab_sum_allreduce(float* data, int64_t n) = 0;
};

// tp_size == 1: every collective is the identity.
class NoParallelHooks final : public ParallelHooks {
 public:
  void input_grad_allreduce(float*, int64_t) override {}
  void partial_sum_allreduce(float*, int64_t) override {}
  void vocab_max_allreduce(float*, int64_t) override {}
  void vocab_sum_allreduce(float*, int64_t) override {}
};

}  // namespace exatrain
