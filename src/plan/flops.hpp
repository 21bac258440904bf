// FLOP and parameter counts of GPT-style (GELU MLP, LayerNorm, learned positions, biases) and
// Llama-style (SwiGLU, RMSNorm, RoPE, GQA, no biases) decoder-only transformers, and any mix of
// those choices: parameter counts follow model.activation, norm, position, tie_embeddings and bias
// one by one, tensor for tensor as the runtime's layout (src/model/gpt.cpp) holds them.
//
// Convention (Megatron, Narayanan et al. SC21 App. A): a multiply-add is 2 FLOPs; attention
// counts the full s x s score matrix (QK^T and attention-over-V: 4*s*h per token per layer)
// even when causal kernels skip half of it; backward = 2 x forward. With GPT-3 shapes this
// gives forward+backward per step 72*B*s*l*h^2*(1 + s/6h + V/12lh) (model FLOPs) and, with full
// recomputation, 96*B*s*l*h^2*(1 + s/6h + V/16lh) (hardware FLOPs).
#pragma once
#include <cstdint>
#include <string>

#include "job/job.hpp"
#include "plan/plan.hpp"

namespace exatrain::plan {

int64_t kv_dim(const ModelSpec& m);  // kv_heads * head_dim
// K's (and V's) width on one of tp ranks: kv heads fewer than tp are replicated, one per rank
// (plan.cpp checks that one of kv_heads and tp divides the other).
int64_t kv_dim_per_rank(const ModelSpec& m, int64_t tp);
int64_t norm_parameters(const ModelSpec& m);  // one norm: weight (+ bias for layernorm)

// Forward FLOPs per token of one transformer layer.
double layer_gemm_flops_per_token(const ModelSpec& m);       // QKV, out-proj, MLP matmuls
double layer_attention_flops_per_token(const ModelSpec& m);  // QK^T and attn@V: 4*s*h
double logits_flops_per_token(const ModelSpec& m);           // LM head: 2*h*V
// What torchtitan's op-level checkpointing (Recompute::op) re-runs per token of a layer: every
// second matmul in the order q, k, v, o, gate, up, down (k, o, up; GELU with a fused QKV: o, fc2).
double op_recompute_gemm_flops_per_token(const ModelSpec& m);

// Forward FLOPs per token of the whole model.
double forward_flops_per_token(const ModelSpec& m);

// Model FLOPs of one optimizer step (forward + backward, no recomputation).
double model_flops_per_step(const ModelSpec& m, int64_t global_batch);
// What recomputation re-executes per step: full = one more forward of every layer (with
// `early_stop`, Plan::recompute_early_stop, less each layer's down projection); selective = the
// attention core (QK^T, softmax, attn@V) of every layer; op = every second matmul; none = 0.
double recompute_flops_per_step(const ModelSpec& m, int64_t global_batch, Recompute r, bool early_stop = false);
// Hardware FLOPs = model FLOPs + recomputation.
double hardware_flops_per_step(const ModelSpec& m, int64_t global_batch, Recompute r, bool early_stop = false);

// Parameters. Counted in 128-bit arithmetic: a model of more than kMaxParameters is refused
// (exatrain::Error with the figure) rather than counted modulo 2^64.
inline constexpr int64_t kMaxParameters = int64_t(1) << 56;
// "" when the model's parameters can be counted, else the problem: its [model] shape and figure.
std::string model_size_problem(const ModelSpec& m);
int64_t layer_parameters(const ModelSpec& m);    // one transformer layer (weights, biases if model.bias, norms)
int64_t embedding_parameters(const ModelSpec& m);  // word (+ learned position) embeddings
int64_t head_parameters(const ModelSpec& m);     // final norm + untied output matrix
int64_t total_parameters(const ModelSpec& m);

}  // namespace exatrain::plan
