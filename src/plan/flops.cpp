#include "plan/flops.hpp"

#include <fmt/format.h>

#include "core/check.hpp"

namespace exatrain::plan {

namespace {
// SwiGLU has three h x f matrices (gate, up, down), GELU two.
int64_t mlp_matrices(const ModelSpec& m) { return m.activation == Activation::swiglu ? 3 : 2; }
}  // namespace

int64_t kv_dim(const ModelSpec& m) { return m.kv_heads * m.head_dim(); }
int64_t kv_dim_per_rank(const ModelSpec& m, int64_t tp) { return m.kv_heads >= tp ? kv_dim(m) / tp : m.head_dim(); }
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

double op_recompute_gemm_flops_per_token(const ModelSpec& m) {
  // q, k, v, o, gate, up, down (SwiGLU) or qkv, o, fc1, fc2 (GELU, fused QKV): every second kept.
  const double h = double(m.hidden), kv = double(kv_dim(m)), f = double(m.ffn_hidden);
  return m.activation == Activation::swiglu ? 2 * (h * kv + h * h + h * f) : 2 * (h * h + f * h);
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

double recompute_flops_per_step(const ModelSpec& m, int64_t global_batch, Recompute r, bool early_stop) {
  double tokens = double(global_batch) * double(m.seq_len);
  const double down_projection = 2.0 * double(m.hidden) * double(m.ffn_hidden);  // per token
  switch (r) {
    case Recompute::none: return 0;
    case Recompute::selective: return tokens * m.layers * layer_attention_flops_per_token(m);
    case Recompute::full:
      return tokens * m.layers *
             (layer_gemm_flops_per_token(m) - (early_stop ? down_projection : 0) + layer_attention_flops_per_token(m));
    case Recompute::op: return tokens * m.layers * op_recompute_gemm_flops_per_token(m);
  }
  return 0;
}

double hardware_flops_per_step(const ModelSpec& m, int64_t global_batch, Recompute r, bool early_stop) {
  return model_flops_per_step(m, global_batch) + recompute_flops_per_step(m, global_batch, r, early_stop);
}

// Parameter counts in 128-bit integers: the job file allows shapes (hidden up to 2^40, layers up
// to 1e5) whose products overflow int64 (~1.5e21 parameters), so each count is computed wide and
// checked against kMaxParameters before it is narrowed (count_or_refuse).
namespace {
using Wide = __int128;
Wide layer_wide(const ModelSpec& m) {
  const Wide h = m.hidden, kv = Wide(m.kv_heads) * (m.hidden / m.heads), f = m.ffn_hidden;
  const Wide weights = h * (h + 2 * kv) + h * h + mlp_matrices(m) * h * f;
  // Biases of QKV, out-proj, fc1 (gate and up for SwiGLU) and fc2: the runtime's layout.
  const Wide biases = m.bias ? (h + 2 * kv) + h + (mlp_matrices(m) - 1) * f + h : 0;
  return weights + biases + 2 * Wide(norm_parameters(m));
}
Wide embedding_wide(const ModelSpec& m) {
  const Wide pos = m.position == Position::learned ? Wide(m.seq_len) * m.hidden : 0;
  return Wide(m.vocab) * m.hidden + pos;
}
Wide head_wide(const ModelSpec& m) { return norm_parameters(m) + (m.tie_embeddings ? 0 : Wide(m.vocab) * m.hidden); }
Wide total_wide(const ModelSpec& m) { return Wide(m.layers) * layer_wide(m) + embedding_wide(m) + head_wide(m); }

int64_t count_or_refuse(Wide n, const ModelSpec& m) {
  if (n <= Wide(kMaxParameters)) return int64_t(n);
  EXA_FAIL("{}", model_size_problem(m));
}
}  // namespace

std::string model_size_problem(const ModelSpec& m) {
  const Wide n = total_wide(m);
  if (n <= Wide(kMaxParameters)) return "";
  return fmt::format("[model] layers = {}, hidden = {}, ffn_hidden = {}, vocab = {}: the model has {:.3g} parameters, "
                     "more than the {:.3g} (2^56) that exatrain counts (with 16+ bytes of state per parameter, its "
                     "byte counts would overflow); expected a smaller model",
                     m.layers, m.hidden, m.ffn_hidden, m.vocab, double(n), double(kMaxParameters));
}

int64_t layer_parameters(const ModelSpec& m) { return count_or_refuse(layer_wide(m), m); }
int64_t embedding_parameters(const ModelSpec& m) { return count_or_refuse(embedding_wide(m), m); }
int64_t head_parameters(const ModelSpec& m) { return count_or_refuse(head_wide(m), m); }
int64_t total_parameters(const ModelSpec& m) { return count_or_refuse(total_wide(m), m); }

}  // namespace exatrain::plan
