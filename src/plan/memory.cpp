#include "plan/memory.hpp"

#include <algorithm>

#include "job/model_shapes.hpp"
#include "plan/flops.hpp"
#include "plan/optimizer_cost.hpp"

namespace exatrain::plan {

namespace {
// Bytes per parameter held as weights / gradients / optimizer state. Mixed precision (fp16,
// bf16, fp8) keeps 16-bit weights, fp32 gradients (Megatron's main_grad buffer, DeepSpeed's
// BF16Optimizer, FSDP's fp32 reduce dtype all accumulate in fp32) and an fp32 master copy plus
// Adam's two fp32 moments: 2 + 4 + 12 bytes. fp32 training keeps 4 + 4 + 8. Under ZeRO 3 the
// fp32 shard IS the master: FSDP (1 and 2, MixedPrecisionPolicy param_dtype = bf16) keeps the
// parameters' fp32 shards, which the optimizer updates, and casts each shard to 16 bits only into
// the all-gather buffer of the unit being computed (counted in the buffers below); this runtime's
// ZeRO 3 does the same (parallel/master_shards.hpp HalfGathers rounds straight from the shard; on
// the CPU backend only so far: the CUDA backend's release frees nothing yet, docs/cuda.md). So
// 4 + 4 + 8 sharded, 2 bytes per parameter fewer than a separate 16-bit copy. DeepSpeed's ZeRO 3
// keeps a 16-bit partition beside its fp32 master (2 bytes per parameter / shards more): not
// modelled. Without replicas (dp * cp = 1) ZeRO 3 is the no-op the plan's note says: ZeRO 0's bytes.
struct BytesPerParam { double weights, grads, optimizer; };
BytesPerParam bytes_per_param(Precision p, int64_t zero, int64_t shards) {
  if (p == Precision::fp32) return {4, 4, 8};
  if (zero >= 3 && shards > 1) return {4, 4, 8};
  return {2, 4, 12};
}
}  // namespace

double cross_entropy_bytes_per_logit(CrossEntropy ce) {
  switch (ce) {
    case CrossEntropy::fused: return 8;     // 16-bit logits, fp32 copy (6), 16-bit gradient (2)
    case CrossEntropy::eager: return 12;    // 16-bit logits, fp32 log-softmax and its fp32 gradient, 16-bit gradient
    case CrossEntropy::compiled: return 4;  // 16-bit logits, 16-bit gradient (the fp32 passes fused)
    case CrossEntropy::flash_attn: return 4;  // 16-bit logits, 16-bit gradient (lse: 4 bytes a row)
  }
  return 12;
}

int64_t matrix_parameters_on_rank(const ModelSpec& m, const Plan& p, int64_t pp_rank) {
  int64_t tp = p.tp, h = m.hidden, f = m.ffn_hidden;
  int64_t kv_local = kv_dim_per_rank(m, tp);  // per rank, for K and for V
  int64_t up_mats = m.activation == Activation::swiglu ? 2 : 1;
  int64_t layer = h * (h / tp + 2 * kv_local)  // QKV (column-parallel)
                  + (h / tp) * h                // out-proj (row-parallel)
                  + up_mats * h * (f / tp)      // fc1 or gate+up (column-parallel)
                  + (f / tp) * h;               // fc2 (row-parallel)
  return layers_on_rank(m, p, pp_rank) * layer;
}

double gathered_weight_bytes(const Plan& p, double parameters, double matrix_parameters) {
  const double elem = double(element_bytes(p.precision));
  if (!(p.fp8_all_gather && p.precision == Precision::fp8 && p.zero >= 1)) return elem * parameters;
  return elem * (parameters - matrix_parameters) + 1.0 * matrix_parameters;
}

double gathered_unit_bytes(const ModelSpec& m, const Plan& p, int64_t pp_rank) {
  const double layer = double(layer_parameters(m)) / double(p.tp);
  const int64_t layers = layers_on_rank(m, p, pp_rank);
  const double matrix = layers > 0 ? double(matrix_parameters_on_rank(m, p, pp_rank)) / double(layers) : 0.0;
  return gathered_weight_bytes(p, layer, std::min(layer, matrix));
}

int64_t parameters_on_rank(const ModelSpec& m, const Plan& p, int64_t pp_rank, int64_t tp_rank) {
  int64_t tp = p.tp, h = m.hidden, f = m.ffn_hidden;
  int64_t kv_local = kv_dim_per_rank(m, tp);  // per rank, for K and for V
  int64_t up_mats = m.activation == Activation::swiglu ? 2 : 1;
  int64_t layer = 2 * norm_parameters(m);       // two norms, replicated (matrices: below)
  if (m.bias) layer += (h / tp + 2 * kv_local) + h + up_mats * (f / tp) + h;  // split, replicated
  const EndParameters ends = end_parameters_on_rank(m, p, pp_rank, tp_rank);
  return layers_on_rank(m, p, pp_rank) * layer + matrix_parameters_on_rank(m, p, pp_rank) + ends.embedding + ends.head;
}

EndParameters end_parameters_on_rank(const ModelSpec& m, const Plan& p, int64_t pp_rank, int64_t tp_rank) {
  const int64_t h = m.hidden, vocab_rows = vocab_slice(m.vocab, p.tp, tp_rank).rows;
  EndParameters e;
  if (pp_rank == 0) e.embedding = vocab_rows * h + (m.position == Position::learned ? m.seq_len * h : 0);
  if (pp_rank == p.pp - 1) e.head = norm_parameters(m) + (!m.tie_embeddings || p.pp > 1 ? vocab_rows * h : 0);
  return e;
}

double activation_bytes_per_layer(const ModelSpec& m, const Plan& p, Recompute r) {
  double t = double(p.micro_batch) * double(m.seq_len) / double(p.cp);
  double h = m.hidden, kv = double(kv_dim(m)), f = m.ffn_hidden, tp = p.tp;
  double scale = p.precision == Precision::fp32 ? 2.0 : 1.0;  // formulas assume 2-byte values
  // [train] residual_dtype = "fp32" under a 16-bit precision: the residual stream's values (the
  // layer's input, and mid) take 2 bytes more each; the formulas count them at 2.
  const double residual_extra = p.residual_fp32 && p.precision != Precision::fp32 ? 2.0 : 0.0;
  const double residual = (2 * scale + residual_extra) * h / (p.seq_parallel ? tp : 1);  // bytes per token
  if (r == Recompute::full) return residual * t;
  const double kv_local = double(kv_dim_per_rank(m, p.tp));
  // torchtitan's op-level checkpointing keeps the layer input, the outputs of the kept matmuls
  // (q, v, the MLP's first: plan/compute.cpp) and of attention: 2 (h + h/tp + kv + h/tp + f/tp)
  // bytes per token, the h-sized input split only with sequence parallelism.
  if (r == Recompute::op) return t * (residual + scale * 2 * (2 * h / tp + kv_local + f / tp));
  // GPT-style models (GELU) train with dropout: a 1-byte mask after attention and after the
  // MLP (2h of the 10h) and on the attention probabilities (as of the 5as). Llama-style models
  // (SwiGLU) use no dropout.
  // replicated: the layer's input and mid (the residual stream), the two norms' outputs; dropout's
  // two masks.
  bool dropout = p.dropout.value_or(m.activation == Activation::gelu);
  double replicated = (dropout ? 10 * h : 8 * h) + (residual_extra > 0 ? 4 * h : 0.0);
  // The MLP: GELU keeps its input and output (fc2's input); SwiGLU the gate and up projections'
  // outputs, silu(gate) and the product (fc2's input), or without silu(gate) where one fused
  // Function saves only its input (Plan::swiglu_saves_input_only).
  const bool swiglu_fused = p.fused_kernels && p.swiglu_saves_input_only;
  double mlp_split = m.activation == Activation::swiglu ? (swiglu_fused ? 6 * f : 8 * f) : 4 * f;
  double split = 4 * h + 4 * kv + mlp_split;
  if (p.precision == Precision::fp8 && p.fp8_saves_quantized_inputs) {
    replicated -= 2 * h;  // the two norms' outputs (the QKV and fc1 inputs) in fp8
    split += h - f;       // an fp8 copy of the attention output; fc2's input in fp8
  }
  double per_token = (p.seq_parallel ? replicated / tp : replicated) + split / tp;
  double scores = 0;
  if (r == Recompute::none && !p.flash_attention())
    scores = (dropout ? 5.0 : 2.0) * m.heads * double(m.seq_len) / tp;  // softmax out (+ mask, dropout out)
  return scale * t * (per_token + scores);
}

double microbatches_in_flight(const Plan& p, int64_t pp_rank) {
  const double m = double(p.micro_batches()), pp = double(p.pp), vp = double(p.vp), r = double(pp_rank);
  if (p.schedule == Schedule::gpipe) return m;
  if (p.vp == 1) return std::min(m, pp - r);
  // Interleaved: the units (micro-batch x chunk) of Megatron's warm-up, 2 (pp - r - 1) + (vp - 1) pp,
  // and the steady phase's forward before its first backward; each unit holds 1/vp of the rank's layers.
  return std::min(m * vp, 2 * (pp - r - 1) + (vp - 1) * pp + 1) / vp;
}

namespace {

Memory memory_of_rank(const ModelSpec& m, const Plan& p, int64_t pp_rank, bool with_activations, double fragmentation,
                      double at_capacity) {
  Memory mem;
  mem.pp_rank = pp_rank;
  BytesPerParam b = bytes_per_param(p.precision, p.zero, p.dp * p.cp);
  if (p.grads_16bit && p.precision != Precision::fp32) b.grads = 2;
  // DeepSpeed's BF16Optimizer keeps the backward's bf16 .grad besides its fp32 accumulation.
  if (p.grads_twice) b.grads += 2;
  double n = double(parameters_on_rank(m, p, pp_rank));
  double shards = double(p.dp * p.cp);  // ZeRO shards over every replica of these weights
  mem.params = b.weights * (p.zero >= 3 ? n / shards : n);
  mem.grads = b.grads * (p.zero >= 2 ? n / shards : n);
  const double matrix = double(matrix_parameters_on_rank(m, p, pp_rank));
  // FSDP2 under PyTorch's pipelining (plan.hpp Plan::fsdp_unsharded_in_pipeline): for the whole
  // step the rank holds its parameters as gathered (16 bits, float8 matrices with fp8_all_gather)
  // beside their fp32 shards, and their gradients unsharded in the reduce dtype INSTEAD of sharded:
  // the step starts with the sharded gradients freed (zero_grad sets them to None) and the one
  // reduce-scatter after the last backward frees each unit's unsharded gradient as it makes its shard.
  const bool unsharded = p.fsdp_unsharded_in_pipeline && p.zero >= 3 && p.pp > 1 && shards > 1;
  if (unsharded) {
    mem.params += gathered_weight_bytes(p, n, matrix);
    mem.grads = (p.grads_16bit && p.precision != Precision::fp32 ? 2.0 : 4.0) * n;
  }
  // b.optimizer counts AdamW's two fp32 moments; another optimizer keeps per_matrix_element fp32
  // values per element of the layers' matrices and per_other_element on the rest (job/job.hpp
  // optimizer_state: Muon 1 and 2, SGD and Lion 1, Adafactor ~0 factored). ZeRO 1 spreads whole
  // entries over the dp ranks when the optimizer needs them (about n / dp each).
  const OptimizerState& os = p.optimizer_state;
  double optimizer = b.optimizer * n - 4.0 * ((2 - os.per_matrix_element) * matrix +
                                              (2 - os.per_other_element) * (n - matrix));
  mem.optimizer = (p.zero >= 1 ? optimizer / shards : optimizer) + kfac_factor_bytes(m, p, pp_rank);
  double elem = double(element_bytes(p.precision));
  double tokens = double(p.micro_batch) * double(m.seq_len) / double(p.cp);
  int64_t layers = layers_on_rank(m, p, pp_rank);
  // Buffers: gathered layers for ZeRO-3 (the one computing and the one prefetched; none when the
  // whole rank stays gathered, above), the tensor-parallel all-gather / all-reduce buffer, the
  // runtime reserve.
  double buffers = kRuntimeReserveBytes + (p.cuda_modules_eager ? kEagerModuleLoadingBytes : 0.0);
  if (p.zero >= 3 && shards > 1 && !unsharded) buffers += 2.0 * gathered_unit_bytes(m, p, pp_rank);
  if (p.tp > 1) buffers += elem * tokens * double(m.hidden);
  if (with_activations) {
    // In 1F1B pipeline rank r holds pp - r micro-batches (rank 0 the most); interleaved, fewer too.
    const double inflight = microbatches_in_flight(p, pp_rank);
    double act = inflight * layers * activation_bytes_per_layer(m, p, p.recompute);
    // Full and op-level recomputation rebuild one layer's complete activations during its backward.
    if (p.recompute == Recompute::full || p.recompute == Recompute::op)
      act += activation_bytes_per_layer(m, p, Recompute::none) - activation_bytes_per_layer(m, p, p.recompute);
    // The backward of a layer holds the gradients of its activations while it runs: one more
    // layer's worth of the activations it saves (the caching allocator keeps that space).
    act += activation_bytes_per_layer(m, p, Recompute::none);
    // Cross entropy over one micro-batch's logits (this tp rank's vocabulary slice), by what the
    // implementation holds per logit (plan.hpp Plan::cross_entropy).
    if (pp_rank == p.pp - 1)
      act += cross_entropy_bytes_per_logit(p.cross_entropy) * tokens * double((m.vocab + p.tp - 1) / p.tp);
    if (pp_rank == 0) {  // embedding output kept for its backward (fp32 with residual_fp32, as Megatron casts it)
      const double out_elem = p.residual_fp32 && p.precision != Precision::fp32 ? 4.0 : elem;
      act += inflight * out_elem * tokens * double(m.hidden) / (p.seq_parallel ? p.tp : 1);
    }
    mem.activations = act;
  }
  double sum = mem.params + mem.grads + mem.optimizer + mem.activations + buffers;
  mem.buffers = buffers + at_capacity * sum;
  mem.total = mem.params + mem.grads + mem.optimizer + mem.activations + mem.buffers;
  mem.peak = with_allocator_share(sum, fragmentation);
  return mem;
}

}  // namespace

Memory memory_per_device(const ModelSpec& m, const Plan& p, const Device& d, double fragmentation, double at_capacity) {
  // Candidates for the most loaded rank: the first (embedding, most micro-batches in flight),
  // the last (LM head) and, among the middle ranks, the first one of each distinct layer count
  // (in-flight micro-batches only fall with the rank).
  // total and peak are both proportional to a rank's counted sum: one rank is the most loaded for both.
  Memory worst = memory_of_rank(m, p, 0, true, fragmentation, at_capacity);
  auto consider = [&](int64_t r) {
    Memory mem = memory_of_rank(m, p, r, true, fragmentation, at_capacity);
    if (mem.total > worst.total) worst = mem;
  };
  if (p.pp > 1) consider(p.pp - 1);
  if (p.pp > 2) {
    const std::vector<int64_t> layers = layers_per_rank(m, p);
    int64_t seen[4] = {-1, -1, -1, -1};  // balanced stages have at most 2 distinct counts
    int n_seen = 0;
    for (int64_t r = 1; r + 1 < p.pp; ++r) {
      int64_t l = layers[size_t(r)];
      bool known = false;
      for (int i = 0; i < n_seen; ++i) known |= seen[i] == l;
      if (known) continue;
      if (n_seen < 4) seen[n_seen++] = l;
      consider(r);
    }
  }
  return worst;
}

double static_memory_lower_bound(const ModelSpec& m, const Plan& p) {
  // Weights, gradients, optimizer state and buffers of the first and last ranks, without
  // activations and without the allocator's share (so below Memory::total whatever the
  // calibration): the most loaded rank holds at least the larger of the two.
  double bound = 0;
  for (int64_t r : {int64_t(0), p.pp - 1}) bound = std::max(bound, memory_of_rank(m, p, r, false, 0.0, 0.0).total);
  return bound;
}

}  // namespace exatrain::plan
