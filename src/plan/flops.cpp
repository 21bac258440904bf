#include "plan/flops.hpp"

namespace exatrain::plan {

namespace {
// SwiGLU has three h x f matrices (gate, up, down), GELU two.
int64_t mlp_matrices(const ModelSpec& m) { return m.activation == Activation::swiglu ? 3 : 2; }
}  // namespace

int64_t kv_dim(const ModelSpec& m) { return m.kv_heads * m.head_dim(); }
int64_t norm_parameters(const ModelSpec& m) { return m.norm == Norm::rmsnorm ? m.hidden : 2 * m.hidden; }

double layer_gemm_flops_per_token(const ModelSpec& m) {
  double h = double(m.hidden), kv = double(kv_dim(m)), f = double(m.ffn_hidden);
  double qkv = h * (h + 2 * kv), proj = h * h, mlp = mlp_matrices(m) * h * f;
  return 2 * (qkv + proj + mlp);
}

double layer_attention_flops_per_token(const ModelSpec& m) {
  // QK^T: 2*s*h, attn@V: 2*s*h (per token, all heads; full s x s as in Megatron's count).
  return 4.0 * double(m.seq_len) * double(m.hidden);
}

double logits_flops_per_token(const ModelSpec& m) {
  return 2.0 * double(m.hidden) * double(m.vocab);
}

double forward_flops_per_token(const ModelSpec& m) {
  return double(m.layers) * (layer_gemm_flops_per_token(m) + layer_attention_flops_per_token(m)) +
         logits_flops_per_token(m);
}

double model_flops_per_step(const ModelSpec& m, int64_t global_batch) {
  return 3.0 * double(global_batch) * double(m.seq_len) * forward_flops_per_token(m);
}

double recompute_flops_per_step(const ModelSpec& m, int64_t global_batch, Recompute r) {
  double tokens = double(global_batch) * double(m.seq_len);
  switch (r) {
    case Recompute::none: return 0;
    case Recompute::selective: return tokens * m.layers * layer_attention_flops_per_token(m);
    case Recompute::full:
      return tokens * m.layers * (layer_gemm_flops_per_token(m) + layer_attention_flops_per_token(m));
  }
  return 0;
}

double hardware_flops_per_step(const ModelSpec& m, int64_t global_batch, Recompute r) {
  return model_flops_per_step(m, global_batch) + recompute_flops_per_step(m, global_batch, r);
}

int64_t layer_parameters(const ModelSpec& m) {
  int64_t h = m.hidden, kv = kv_dim(m), f = m.ffn_hidden;
  int64_t weights = h * (h + 2 * kv) + h * h + mlp_matrices(m) * h * f;
  // Biases of QKV, out-proj, fc1 (gate and up for SwiGLU) and fc2: the runtime's layout.
  int64_t biases = m.bias ? (h + 2 * kv) + h + (mlp_matrices(m) - 1) * f + h : 0;
  return weights + biases + 2 * norm_parameters(m);
}

int64_t embedding_parameters(const ModelSpec& m) {
  int64_t pos = m.position == Position::learned ? m.seq_len * m.hidden : 0;
  return m.vocab * m.hidden + pos;
}

int64_t head_parameters(const ModelSpec& m) {
  return norm_parameters(m) + (m.tie_embeddings ? 0 : m.vocab * m.hidden);
}

int64_t total_parameters(const ModelSpec& m) {
  return m.layers * layer_parameters(m) + embedding_parameters(m) + head_parameters(m);
}

}  // namespace exatrain::plan
