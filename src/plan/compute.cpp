#include "plan/compute.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include <fmt/format.h>

#include "plan/flops.hpp"
#include "plan/predict.hpp"

namespace exatrain::plan {

double causal_share(double seq_len) { return std::min(1.0, (seq_len + 128.0) / (2.0 * seq_len)); }

namespace {

// The tile model's factor for one shape (see compute.hpp): last-tile fill in M and N, the mean
// last wave over the compute units, the fixed cost per tile.
double tile_factor(const Device& d, double M, double N, double K, double batch) {
  auto fill = [](double x, double tile) { return x / (tile * std::ceil(x / tile)); };
  const double tiles = batch * std::ceil(M / d.gemm_tile_m) * std::ceil(N / d.gemm_tile_n);
  const double waves = tiles / d.compute_units;
  return fill(M, d.gemm_tile_m) * fill(N, d.gemm_tile_n) * waves / (waves + 0.5) * K / (K + d.gemm_k_overhead);
}

// Sustained compute of the device: the fitted fraction and a power cap's lower clocks.
double compute_scale(const Device& d) { return d.sustained * d.power_clock_factor(); }

double hbm_bytes_per_s(const Device& d) { return d.hbm_bw_gbs * 1e9 * d.bw_efficiency; }

// The four linear layers of one layer on one tp rank as (N outputs, K inputs): QKV (column
// parallel; kv heads fewer than tp are replicated, one per rank), the output projection (row
// parallel), the MLP's up (and gate) projection, its down projection.
struct Linear { double N, K; };
std::vector<Linear> linears(const ModelSpec& m, const Plan& p) {
  const double tp = double(p.tp), h = double(m.hidden), f = double(m.ffn_hidden);
  const double kv_local = double(kv_dim_per_rank(m, p.tp));
  const double up = m.activation == Activation::swiglu ? 2 * f : f;
  return {{h / tp + 2 * kv_local, h}, {h, h / tp}, {up / tp, h}, {h, f / tp}};
}

// Seconds of the three GEMMs (forward, input gradient, weight gradient) of one linear layer over
// `t` tokens.
struct LinearTime { double fwd = 0, bwd = 0; };
LinearTime linear_time(const Device& d, Precision prec, const Linear& l, double t, const Calibration& c) {
  return {gemm_seconds(d, prec, {t, l.N, l.K}, c),
          gemm_seconds(d, prec, {t, l.K, l.N}, c) + gemm_seconds(d, prec, {l.K, l.N, t, 1, true}, c)};
}

// What PyTorch eager (fused_kernels off) runs for two ops that have no single kernel there, in
// bytes per element, forward and backward (the generic count is one read and one write: 2 elem
// forward, 4 elem backward):
//  - RMSNorm: Llama's reference one (torchtitan's models/norms.py RMSNorm, the "rmsnorm" of its Llama
//    3 configs; Meta's model.py and Hugging Face's LlamaRMSNorm alike) is eight kernels: the input
//    upcast to fp32 (read elem, write 4), pow 2 (8), mean (read 4), times the rsqrt (8), type_as (read
//    4, write elem), times the weight (2 elem) (nn.RMSNorm's composite multiplies by the weight
//    before the cast back: a few bytes more, not distinguished); backward, the autograd of each: the
//    weight product (the input's gradient 2 elem; the weight's, the product and its sum, 4 elem),
//    type_as (4 + elem), the rsqrt product (8; for the rsqrt's gradient, the product with the input
//    and its sum, 16), mean's expand (4), pow's grad * 2 * x^1 (28), the sum of the input's two
//    gradients (12), the upcast (4 + elem). At fp32 the casts are no-ops.
//  - RoPE: Llama's reference apply_rotary_emb (torchtitan's): q and k upcast to fp32 and viewed as
//    complex (read elem, write 4), times freqs_cis (8), type_as (read 4, write elem); backward the
//    same three.
struct Composite { double fwd, bwd; };
Composite eager_rmsnorm_bytes(double elem) {
  const double cast = elem == 4 ? 0 : elem + 4;
  return {cast + 8 + 4 + 8 + cast + 2 * elem, 6 * elem + cast + (8 + 16) + 4 + 28 + 12 + cast};
}
Composite eager_rope_bytes(double elem) {
  const double cast = elem == 4 ? 0 : elem + 4;
  return {cast + 8 + cast, cast + 8 + cast};
}

// Element-wise bytes per token of one layer on one tp rank (docs/planner.md counts them), forward
// and backward: norms (read, write), residual adds (read two, write one; fused with the next norm:
// one read fewer), dropout (read, write, a 1-byte mask; fused into the bias-dropout-add: the mask
// only), the activation (GELU read, write; SwiGLU eager: silu then the product, fused: read two,
// write one), RoPE on q and k; the backward twice the forward's passes, except eager RMSNorm and
// RoPE, counted as PyTorch runs them (above). The h-sized ops run replicated on every tp rank
// without sequence parallelism. `elem`: bytes per element.
struct ElementwiseBytes { double fwd = 0, bwd = 0; };
ElementwiseBytes elementwise_bytes_per_token(const ModelSpec& m, const Plan& p, double elem) {
  const double h = double(m.hidden), f = double(m.ffn_hidden), tp = double(p.tp);
  const bool fused = p.fused_kernels;
  const bool dropout = p.dropout.value_or(m.activation == Activation::gelu);
  const bool rope = m.position == Position::rope && !p.alibi;
  const double rope_elements = h + double(kv_dim(m));
  double replicated = 4 * h + (fused ? 4 * h : 6 * h);
  if (dropout) replicated += fused ? 1.0 * h : 5.0 * h;
  double split = m.activation == Activation::swiglu ? (fused ? 3 * f : 5 * f) : 2 * f;
  if (rope) split += (fused ? 1.0 : 2.0) * rope_elements;
  const double rep_div = p.seq_parallel ? tp : 1.0;
  ElementwiseBytes b;
  b.fwd = elem * (replicated / rep_div + split / tp);
  b.bwd = 2 * b.fwd;
  if (!fused && m.norm == Norm::rmsnorm) {  // two norms a layer, counted above as 2 elem and 4 elem each
    const Composite c = eager_rmsnorm_bytes(elem);
    b.fwd += 2 * h * (c.fwd - 2 * elem) / rep_div, b.bwd += 2 * h * (c.bwd - 4 * elem) / rep_div;
  }
  if (!fused && rope) {
    const Composite c = eager_rope_bytes(elem);
    b.fwd += rope_elements * (c.fwd - 2 * elem) / tp, b.bwd += rope_elements * (c.bwd - 4 * elem) / tp;
  }
  return b;
}

// fp8 casts per token of one layer (bytes), by recipe. Delayed scaling (Transformer Engine) needs
// no amax pass (the scale comes from the amax history); with its fused modules (LayerNormLinear,
// LayerNormMLP: fused_kernels) the casts happen in the producing kernels and only the transposed
// fp8 copy the weight gradient needs is written (1 byte per input element forward; the output
// gradient's cast and transpose, 4 per element backward); as plain te.Linear modules each input is
// also cast on its own (read 2, write 1) and each weight every micro-batch (cast and transpose, 4
// bytes per weight element, spread over the tokens). Dynamic tensorwise/rowwise scaling (torchao)
// in eager mode reads each operand for its amax, then casts it (5 bytes per element of the input
// forward and of the output gradient backward, plus their transposed copies) and casts the weights
// every micro-batch (7 bytes per weight element); compiled (fused_kernels: torch.compile fuses the
// amax and the cast into the producing kernel), it writes the fp8 copies and transposes only (2
// bytes per input element, 3 per output-gradient element, 3 per weight element).
double fp8_cast_bytes_per_token(const std::vector<Linear>& ls, const Plan& p, double t) {
  double bytes = 0;
  for (const Linear& l : ls) {
    if (p.fp8_recipe == Fp8Recipe::delayed)
      bytes += p.fused_kernels ? 1 * l.K + 4 * l.N : 4 * l.K + 4 * l.N + 4 * l.K * l.N / t;
    else bytes += p.fused_kernels ? 2 * l.K + 3 * l.N + 3 * l.K * l.N / t : 7 * l.K + 6 * l.N + 7 * l.K * l.N / t;
  }
  return bytes;
}

// The attention core of one micro-batch on one rank: forward, backward.
struct AttentionTime { double fwd = 0, bwd = 0; };
AttentionTime flash_attention_time(const ModelSpec& m, const Plan& p, const Device& d, double t,
                                   const Calibration& c) {
  const std::optional<double>& eff = p.attention == Attention::flash3   ? d.flash3_efficiency
                                     : p.attention == Attention::flash1 ? d.flash1_efficiency
                                                                        : d.flash2_efficiency;
  const double s = double(m.seq_len);
  // Executed FLOPs: the causal share of QK^T and PV forward; the backward runs 5 matmuls to the
  // forward's 2 (it recomputes the scores): 2.5 times. eff is over forward + backward.
  const double fwd_flops = layer_attention_flops_per_token(m) * causal_share(s) * t / double(p.tp);
  double units = 1;  // query blocks of 128 per head: the kernel's parallel work
  if (d.compute_units > 0) {
    const double blocks = double(p.micro_batch) * double(m.heads) / double(p.tp) * std::ceil(s / double(p.cp) / 128);
    const double waves = blocks / d.compute_units;
    units = waves / (waves + 0.5);
  }
  const double rate =
      d.peak_tflops(Precision::bf16) * 1e12 * eff.value_or(0) * (d.measured ? 1.0 : c.attention_relative) *
      compute_scale(d) * units;
  const double total = 3.5 * fwd_flops / rate;
  return {total / 3.5, total * 2.5 / 3.5};
}

// Unfused attention (before FlashAttention): QK^T and PV as batched GEMMs over the full square
// (heads x micro-batch), the backward's four, and the scores' element-wise passes: the fused
// scale-mask-softmax (read, write), dropout (read, write, mask) forward; their backward reads
// the saved probabilities, mask and gradient and writes the gradient: 9 and 11 bytes per score
// element at 16 bits.
AttentionTime unfused_attention_time(const ModelSpec& m, const Plan& p, const Device& d, double t,
                                     const Calibration& c) {
  const double s = double(m.seq_len), dh = double(m.head_dim());
  const double batch = double(p.micro_batch) * double(m.heads) / double(p.tp);
  const double sq = t / double(p.micro_batch);  // queries per sequence on this rank
  const Precision prec = p.precision == Precision::fp8 ? Precision::bf16 : p.precision;
  AttentionTime a;
  a.fwd = gemm_seconds(d, prec, {sq, s, dh, batch}, c) + gemm_seconds(d, prec, {sq, dh, s, batch}, c);
  a.bwd = gemm_seconds(d, prec, {sq, s, dh, batch}, c) + gemm_seconds(d, prec, {s, dh, sq, batch}, c) +
          gemm_seconds(d, prec, {sq, dh, s, batch}, c) + gemm_seconds(d, prec, {s, dh, sq, batch}, c);
  const double scores = batch * sq * s * double(element_bytes(prec)) / 2;
  // ALiBi in unfused attention (Megatron-DeepSpeed's BLOOM: torch.baddbmm(alibi, q, k^T, beta=1)):
  // the broadcast bias is first written into the scores buffer, which the GEMM then reads as its
  // C operand: 4 bytes more per score element forward.
  a.fwd += (p.alibi ? 13 : 9) * scores / hbm_bytes_per_s(d);
  a.bwd += 11 * scores / hbm_bytes_per_s(d);
  return a;
}

// torchtitan's op-level checkpointing keeps the outputs of every second matmul and of attention
// and recomputes the rest and every element-wise op (plan/flops.hpp): the recomputed share of the
// layer's forward GEMM FLOPs.
double op_recompute_gemm_share(const ModelSpec& m) {
  return op_recompute_gemm_flops_per_token(m) / layer_gemm_flops_per_token(m);
}

}  // namespace

double gemm_shape_efficiency(const Device& d, const Gemm& g, const Calibration&) {
  if (d.gemm_dim_half || d.gemm_tokens_half || d.compute_units <= 0) {
    const double tokens = g.tokens_in_k ? g.K : g.M;
    const double width = g.tokens_in_k ? std::min(g.M, g.N) : std::min(g.N, g.K);
    return 1 / (1 + d.gemm_dim_half.value_or(0) / width) / (1 + d.gemm_tokens_half.value_or(0) / tokens);
  }
  // The factor at the measured shape, per device (the search asks for it a million times).
  thread_local const Device* last = nullptr;
  thread_local double last_units = 0, reference = 1;
  if (last != &d || last_units != d.compute_units) {
    last = &d, last_units = d.compute_units;
    reference = tile_factor(d, d.gemm_best_m, d.gemm_best_n, d.gemm_best_k, 1);
  }
  return tile_factor(d, g.M, g.N, g.K, g.batch) / reference;
}

double gemm_seconds(const Device& d, Precision precision, const Gemm& g, const Calibration& c) {
  const bool fp8 = precision == Precision::fp8;
  const double fraction = fp8 ? d.gemm_efficiency_fp8.value_or(d.gemm_efficiency * c.fp8_relative) : d.gemm_efficiency;
  const double rate = d.peak_tflops(precision) * 1e12 * fraction * compute_scale(d) * gemm_shape_efficiency(d, g, c);
  const double flops = 2 * g.M * g.N * g.K * g.batch;
  const double in = fp8 ? 1 : double(element_bytes(precision)), out = fp8 ? 2 : double(element_bytes(precision));
  const double bytes = g.batch * (in * (g.M * g.K + g.K * g.N) + out * g.M * g.N);
  return std::max(flops / rate, bytes / hbm_bytes_per_s(d));
}

std::string kernel_problem(const Plan& p, const Device& d) {
  if (p.precision == Precision::fp8 && p.fp8_recipe == Fp8Recipe::rowwise)
    return fmt::format("[train] fp8_recipe = \"rowwise\": the catalog has no rate of rowwise-scaled fp8 GEMMs for "
                       "device {} (torchao runs them in a kernel of its own, not cuBLAS's; in torchtitan's published "
                       "H100 runs they were no faster than bf16); expected \"delayed\" or \"tensorwise\"", d.name);
  if (!p.flash_attention()) return "";
  const std::optional<double>& eff = p.attention == Attention::flash3   ? d.flash3_efficiency
                                     : p.attention == Attention::flash1 ? d.flash1_efficiency
                                                                        : d.flash2_efficiency;
  if (eff) return "";
  std::string available;
  for (auto [name, e] : {std::pair{"flash1", &d.flash1_efficiency}, std::pair{"flash2", &d.flash2_efficiency},
                         std::pair{"flash3", &d.flash3_efficiency}})
    if (*e) available += fmt::format("\"{}\", ", name);
  return fmt::format("[train] attention = \"{}\": the catalog has no such kernels for device {} (no {}_efficiency in "
                     "catalog/devices.toml); expected one of {}\"unfused\"",
                     to_string(p.attention), d.name, to_string(p.attention), available);
}

double gemm_rate(const Device& d, Precision precision, const Gemm& g, const Calibration& c) {
  return 2 * g.M * g.N * g.K * g.batch / gemm_seconds(d, precision, g, c);
}

LayerTime layer_time(const ModelSpec& m, const Plan& p, const Device& d, const Calibration& c) {
  const double t = double(p.micro_batch) * double(m.seq_len) / double(p.cp);
  // fp8 applies to the linear layers only; attention and the element-wise work run in bf16.
  const bool fp8 = p.precision == Precision::fp8;
  const double elem = double(element_bytes(p.precision));
  const double bw = hbm_bytes_per_s(d);
  const std::vector<Linear> ls = linears(m, p);
  LayerTime lt;
  for (const Linear& l : ls) {
    const LinearTime x = linear_time(d, p.precision, l, t, c);
    lt.linear_fwd += x.fwd, lt.linear_bwd += x.bwd;
  }
  const AttentionTime attn =
      p.flash_attention() ? flash_attention_time(m, p, d, t, c) : unfused_attention_time(m, p, d, t, c);
  const ElementwiseBytes ew_bytes = elementwise_bytes_per_token(m, p, elem);
  const double ew = ew_bytes.fwd * t / bw, ew_bwd = ew_bytes.bwd * t / bw;
  const double casts = fp8 ? fp8_cast_bytes_per_token(ls, p, t) * t / bw : 0;
  lt.attention_fwd = attn.fwd;
  lt.fwd = lt.linear_fwd + attn.fwd + ew + casts;
  lt.bwd = lt.linear_bwd + attn.bwd + ew_bwd + casts;
  lt.linear = lt.linear_fwd + lt.linear_bwd, lt.attention = attn.fwd + attn.bwd, lt.elementwise = ew + ew_bwd;
  lt.casts = 2 * casts;
  if (p.recompute == Recompute::full) {
    // With early stop (plan.hpp Plan::recompute_early_stop) the last linear's forward GEMM is not
    // rerun; the residual add after it (6 bytes a hidden value per token) is left in: a small excess.
    const double skipped = p.recompute_stops_early() ? linear_time(d, p.precision, ls.back(), t, c).fwd : 0;
    lt.recompute = lt.fwd - skipped;
    lt.linear_recompute = lt.linear_fwd - skipped;
    lt.linear += lt.linear_recompute, lt.attention += attn.fwd, lt.elementwise += ew, lt.casts += casts;
  }
  if (p.recompute == Recompute::selective) lt.recompute = attn.fwd, lt.attention += attn.fwd;
  if (p.recompute == Recompute::op) {
    const double again = op_recompute_gemm_share(m) * lt.linear_fwd;
    lt.recompute = again + ew + casts;
    lt.linear += again, lt.elementwise += ew, lt.casts += casts;
    if (m.activation == Activation::swiglu) {  // k (t x kv x h) and up (t x f x h) on this tp rank
      const double h = double(m.hidden), f = double(m.ffn_hidden) / double(p.tp);
      lt.op_gather_consumers = {gemm_seconds(d, p.precision, {t, double(kv_dim_per_rank(m, p.tp)), h}, c),
                                gemm_seconds(d, p.precision, {t, f, h}, c)};
    }
  }
  return lt;
}

double head_time(const ModelSpec& m, const Plan& p, const Device& d, const Calibration& c) {
  const double t = double(p.micro_batch) * double(m.seq_len) / double(p.cp);
  const double h = double(m.hidden), v = double((m.vocab + p.tp - 1) / p.tp);
  // The logits GEMMs run in 16 bits even in fp8 runs; cross entropy passes over fp32 logits:
  // softmax (read, write), its backward (read, write), the cast (read 16-bit, write fp32).
  const Precision prec = p.precision == Precision::fp8 ? Precision::bf16 : p.precision;
  const double gemms = gemm_seconds(d, prec, {t, v, h}, c) + gemm_seconds(d, prec, {t, h, v}, c) +
                       gemm_seconds(d, prec, {h, v, t, 1, true}, c);
  return gemms + 3 * 3 * 4.0 * t * v / hbm_bytes_per_s(d);
}

double embedding_time(const ModelSpec& m, const Plan& p, const Device& d) {
  const double t = double(p.micro_batch) * double(m.seq_len) / double(p.cp);
  return 3 * double(element_bytes(p.precision)) * t * double(m.hidden) / hbm_bytes_per_s(d);
}

}  // namespace exatrain::plan
