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
//
// Sequence parallelism (TensorParallel::sequence_parallel, Megatron-LM's SP): the residual
// stream, the norms and the bias/residual adds run on this rank's N/tp rows (rows
// [rank*N/tp, (rank+1)*N/tp) of the [B*T] token matrix). The all-reduces at "f" and "g" are
// then replaced by
//   * `sp_all_gather(local [n], full [tp*n])`: before QKV, FC1 and the LM head (forward) and
//     for the gradient entering o_proj/FC2 (backward); chunks in rank order;
//   * `sp_reduce_scatter(full [tp*n], local [n])`: after o_proj and FC2 and the embedding
//     (forward) and for the gradient leaving QKV/FC1/LM head (backward); SUM over ranks,
//     rank r keeps chunk r.
// The gradients of the parameters used on local rows only (norm weights/biases, o_proj and
// FC2 biases: ParamInfo::sp_partial_grad) are then partial sums: the runtime must all-reduce
// them (SUM) over the tp group before the optimizer step, as Megatron does.
#pragma once
#include <algorithm>
#include <cstdint>

#include "backend/backend.hpp"
#include "model/layout.hpp"

namespace exatrain {

// Which slice of each sharded weight this model instance holds.
struct TensorParallel {
  int rank = 0;  // tp_rank in [0, size)
  int size = 1;  // tp_size; heads, kv_heads and ffn_hidden must be divisible by it. The
                 // vocabulary is cut in slices of ceil(vocab/size) rows, the last one shorter.
  bool sequence_parallel = false;  // see above; B*T must be divisible by size
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
  // Sequence parallelism (only called when TensorParallel::sequence_parallel).
  virtual void sp_all_gather(const float* local, float* full, int64_t n_local) = 0;
  virtual void sp_reduce_scatter(const float* full, float* local, int64_t n_local) = 0;

  // Layer boundaries, for the data-parallel side of the runtime (not collectives themselves;
  // default no-ops). `layer` is the GLOBAL layer index; its parameters are the layout entries
  // whose ParamInfo::unit is that index (one contiguous arena range). kEmbedding / kHead stand for
  // the embedding (wte, wpe) and the head (ln_f, lm_head or the tied wte): model/layout.hpp's
  // kEmbeddingUnit and kHeadUnit.
  //   before_layer(l, pass): the layer's parameters are about to be read (ZeRO-3: gather them).
  //   after_layer(l, pass):  done with them for this pass (ZeRO-3: release). After
  //                          Pass::backward the layer's gradients for this micro-batch are
  //                          final (start a bucketed non-blocking all-reduce).
  enum class Pass { forward, backward, recompute };
  static constexpr int64_t kEmbedding = kEmbeddingUnit, kHead = kHeadUnit;
  virtual void before_layer(int64_t layer, Pass pass) {}
  virtual void after_layer(int64_t layer, Pass pass) {}
};

// tp_size == 1: every collective is the identity (the two sequence-parallel ones a device copy,
// through the backend: the buffers are device memory).
class NoParallelHooks final : public ParallelHooks {
 public:
  explicit NoParallelHooks(Backend& be) : be_(be) {}
  void input_grad_allreduce(float*, int64_t) override {}
  void partial_sum_allreduce(float*, int64_t) override {}
  void vocab_max_allreduce(float*, int64_t) override {}
  void vocab_sum_allreduce(float*, int64_t) override {}
  void sp_all_gather(const float* local, float* full, int64_t n) override {
    be_.copy(full, local, sizeof(float) * size_t(n));
  }
  void sp_reduce_scatter(const float* full, float* local, int64_t n) override {
    be_.copy(local, full, sizeof(float) * size_t(n));
  }

 private:
  Backend& be_;
};

}  // namespace exatrain
