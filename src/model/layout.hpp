// The parameter layout table: every parameter of a model instance (one pipeline stage, one
// tensor-parallel shard) is a contiguous range of ONE flat float32 arena; the gradient arena uses
// the same offsets and the optimizer's state tensors are laid out like the arena ranges a rank
// updates (optim/optimizer.hpp). Each entry records the parameter's global (unsharded) shape,
// which slice this instance holds, its role and its unit, so data-parallel all-reduce, ZeRO
// partitioning and topology-independent checkpoints are offset arithmetic, and no code needs to
// find a parameter by its name.
//
// Names (Hugging Face GPT-2 / Llama style, i = GLOBAL layer index; weights are [out, in] like
// torch.nn.Linear, y = x W^T + b):
//   wte.weight [vocab, C]              row split (vocabulary-parallel)      decay
//   wpe.weight [seq_len, C]            replicated (position = learned)      decay
//   h.i.ln_1.weight / .bias [C]        replicated (bias only for layernorm)
//   h.i.attn.q_proj.weight [H*D, C]    row split (column-parallel: heads)   decay
//   h.i.attn.k_proj.weight [KV*D, C]   row split                            decay
//   h.i.attn.v_proj.weight [KV*D, C]   row split                            decay
//   h.i.attn.{q,k,v}_proj.bias         row split (every linear bias: only when model.bias = true)
//   h.i.attn.o_proj.weight [C, H*D]    column split (row-parallel)          decay
//   h.i.attn.o_proj.bias [C]           replicated
//   h.i.ln_2.weight / .bias [C]
//   gelu:   h.i.mlp.fc1.weight [F, C] (row split), .bias [F]; h.i.mlp.fc2.weight [C, F]
//           (column split), .bias [C] (replicated)
//   swiglu: h.i.mlp.gate_proj.weight [F, C], h.i.mlp.up_proj.weight [F, C] (row split), their
//           biases [F]; h.i.mlp.down_proj.weight [C, F] (column split), .bias [C]
//   ln_f.weight / .bias [C]
//   lm_head.weight [vocab, C]          row split; only when tie_embeddings = false. With tied
//           embeddings a head stage without the embedding holds its own copy of wte.weight
//           (the runtime must sum its gradient with the first stage's, as Megatron does).
// q/k/v (and gate/up) are adjacent in the arena, so the local fused QKV (gate-up) weight is
// one contiguous [(Hq+2Hkv)*D, C] ([2F, C]) matrix and costs one GEMM.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "job/model_shapes.hpp"

namespace exatrain {

// What a parameter is to the code that treats parameters differently (optimizers, weight decay,
// sequence-parallel partial sums), so that no code needs to read it off the name:
//   matrix     the 2-D weights inside a layer (attention q/k/v/o, MLP): a matrix optimizer's domain
//   embedding  the token (wte) and learned position (wpe) tables, also the head stage's tied copy of wte
//   head       the untied output projection (lm_head)
//   norm       layernorm/rmsnorm weights and biases
//   bias       the biases of linear layers
enum class ParamRole { matrix, embedding, head, norm, bias };
const char* to_string(ParamRole r);

// The unit a parameter belongs to: the global index of its transformer layer, or one of these
// (the model's ParallelHooks report passes through units: model/parallel_hooks.hpp).
inline constexpr int64_t kEmbeddingUnit = -1;  // wte, wpe
inline constexpr int64_t kHeadUnit = -2;       // ln_f, lm_head, and the head stage's tied copy of wte

struct ParamInfo {
  std::string name;                   // Hugging Face style, for checkpoints and messages only
  std::vector<int64_t> global_shape;  // the full tensor, as in a tp=1 model
  std::vector<int64_t> shard_shape;   // what this instance holds
  int split_dim = -1;                 // -1 replicated, else the dimension that is sliced
  int64_t shard_start = 0;            // first index of this slice along split_dim
  int64_t offset = 0;                 // in floats, into the parameter (and gradient) arena
  int64_t numel = 0;                  // product of shard_shape
  ParamRole role = ParamRole::matrix;
  int64_t unit = 0;                   // layer index, kEmbeddingUnit or kHeadUnit (see above)
  // The head stage's own copy of the tied embedding (first stage elsewhere): its gradient must be
  // summed with the embedding stage's, and it is saved by that stage only.
  bool tied_copy = false;
  bool decay = false;                 // weight decay applies (matrices, embeddings, head)
  bool sp_partial_grad = false;       // sequence parallel: gradient is a partial sum over tp
  float init_std = 0;                 // > 0: normal(0, init_std); else constant init_value
  float init_value = 0;
};


class ParamLayout {
 public:
  // Appends a parameter at the current end of the arena; returns its offset.
  int64_t add(ParamInfo info);
  void mark_tied_copy(int64_t offset);  // the entry at `offset` is the head stage's tied copy
  const std::vector<ParamInfo>& entries() const { return entries_; }
  // By name, for tests and tools that match tensors across models; the runtime reads roles and
  // units instead. Throws an Error naming the parameter.
  const ParamInfo& find(const std::string& name) const;
  int64_t total() const { return total_; }               // floats in the arena

 private:
  std::vector<ParamInfo> entries_;
  int64_t total_ = 0;
};

// Seeded initialisation of `arena` (host memory, layout.total() floats): each element's value
// depends only on (seed, parameter name, GLOBAL element index), so every tp/pp split of a
// model starts from exactly the same global weights.
void init_params(const ParamLayout& layout, uint64_t seed, float* arena);
// The same values for elements [first, first + count) of one parameter (flat shard order), so
// a caller can initialise through a small host buffer.
void init_param_range(const ParamInfo& p, uint64_t seed, int64_t first, int64_t count,
                      float* out);

}  // namespace exatrain
