// The compute model (plan/compute.hpp): the GEMM tile model against hand-computed waves and fills,
// the roofline bound, attention's executed FLOPs by kernel, counted element-wise and fp8 bytes, and
// what each recomputation mode re-executes.
#include <cmath>

#include <gtest/gtest.h>

#include "catalog/device.hpp"
#include "plan/compute.hpp"
#include "plan/flops.hpp"
#include "plan/memory.hpp"
#include "plan/predict.hpp"

using namespace exatrain;
using namespace exatrain::plan;

namespace {
ModelSpec llama_like() {
  ModelSpec m;
  m.layers = 32, m.hidden = 4096, m.heads = 32, m.kv_heads = 8, m.ffn_hidden = 14336, m.seq_len = 8192;
  m.vocab = 128256, m.activation = Activation::swiglu, m.norm = Norm::rmsnorm, m.position = Position::rope;
  m.bias = false, m.tie_embeddings = false;
  return m;
}
Plan one_gpu(int64_t micro_batch = 1) {
  Plan p;
  p.micro_batch = micro_batch, p.global_batch = micro_batch, p.precision = Precision::bf16;
  return p;
}
}  // namespace

TEST(Compute, TileModelIsOneAtTheMeasuredShapeAndCountsWavesAndFills) {
  const Device& a100 = find_device("a100-80g");
  const Calibration& c = default_calibration();
  EXPECT_DOUBLE_EQ(gemm_shape_efficiency(a100, {a100.gemm_best_m, a100.gemm_best_n, a100.gemm_best_k}, c), 1.0);
  // 1024 x 1024 x 8192: 8 x 4 = 32 tiles of 128 x 256 on 108 SMs: 0.296 waves, W / (W + 1/2) of
  // the units busy; full tiles; K / (K + 64).
  const double waves = 32.0 / 108;
  const double expect = (waves / (waves + 0.5) * 8192 / (8192 + 64)) /
                        (54.0 * 64 / 108 / (54.0 * 64 / 108 + 0.5) * 2048 / (2048 + 64));
  EXPECT_NEAR(gemm_shape_efficiency(a100, {1024, 1024, 8192}, c), expect, 1e-12);
  // A ragged M: 1100 rows fill 9 tiles of 128 at 1100 / 1152.
  const double ragged = gemm_shape_efficiency(a100, {1100, 2048, 2048}, c) /
                        gemm_shape_efficiency(a100, {1152, 2048, 2048}, c);
  const double w1100 = 9.0 * 8 / 108, w1152 = 9.0 * 8 / 108;
  EXPECT_NEAR(ragged, 1100.0 / 1152 * (w1100 / (w1100 + 0.5)) / (w1152 / (w1152 + 0.5)), 1e-12);
}

TEST(Compute, GemmTimeIsTheRooflineOfFlopsAndBytes) {
  const Device& h100 = find_device("h100-sxm");
  const Calibration& c = default_calibration();
  const Gemm big{8192, 8192, 8192};
  const double rate = h100.peak_tflops(Precision::bf16) * 1e12 * h100.gemm_efficiency * h100.sustained *
                      gemm_shape_efficiency(h100, big, c);
  EXPECT_NEAR(gemm_seconds(h100, Precision::bf16, big, c), 2.0 * 8192 * 8192 * 8192 / rate, 1e-15);
  // A batched 4096 x 4096 x 64 (attention scores): 256 FLOPs per 2-byte output: memory bound.
  const Gemm scores{4096, 4096, 64, 32};
  const double bytes = 32 * 2.0 * (4096.0 * 64 * 2 + 4096.0 * 4096);
  EXPECT_NEAR(gemm_seconds(h100, Precision::bf16, scores, c), bytes / (h100.hbm_bw_gbs * 1e9 * h100.bw_efficiency),
              1e-15);
  // fp8 runs at the fp8 peak, fp8_relative of the 16-bit fraction.
  const double fp8 = gemm_seconds(h100, Precision::fp8, big, c);
  EXPECT_NEAR(gemm_seconds(h100, Precision::bf16, big, c) / fp8, 2 * c.fp8_relative, 1e-3);
}

TEST(Compute, CausalShareAndAttentionKernels) {
  EXPECT_DOUBLE_EQ(causal_share(2048), (2048.0 + 128) / 4096);
  EXPECT_DOUBLE_EQ(causal_share(64), 1.0);  // one block: the whole square
  const ModelSpec m = llama_like();
  const Device& h100 = find_device("h100-sxm");
  const Calibration& c = default_calibration();
  Plan p = one_gpu();
  p.attention = Attention::flash2;
  const double fa2 = layer_time(m, p, h100, c).attention;
  p.attention = Attention::flash3;
  const double fa3 = layer_time(m, p, h100, c).attention;
  EXPECT_NEAR(fa2 / fa3, *h100.flash3_efficiency / *h100.flash2_efficiency, 1e-9);
  // Executed FLOPs: causal share of 4 s h per token forward, 2.5 times that backward, at the
  // kernel's figure (32 heads x 64 query blocks on 132 SMs: 15.5 waves).
  const double flops = 3.5 * layer_attention_flops_per_token(m) * causal_share(8192) * 8192;
  const double waves = 32.0 * 64 / 132;
  const double rate = 989.4e12 * *h100.flash3_efficiency * c.attention_relative * h100.sustained * waves / (waves + 0.5);
  EXPECT_NEAR(fa3, flops / rate, 1e-12 * fa3);
  EXPECT_EQ(kernel_problem(p, find_device("a100-80g")).find("[train] attention = \"flash3\""), 0u);
  EXPECT_EQ(kernel_problem(p, h100), "");
}

TEST(Compute, RecomputationReexecutesWhatEachModeDrops) {
  const ModelSpec m = llama_like();
  const Device& h100 = find_device("h100-sxm");
  const Calibration& c = default_calibration();
  Plan p = one_gpu(2);
  p.recompute = Recompute::none;
  const LayerTime none = layer_time(m, p, h100, c);
  EXPECT_EQ(none.recompute, 0);
  p.recompute = Recompute::full;
  EXPECT_NEAR(layer_time(m, p, h100, c).recompute, none.fwd, 1e-15);
  p.recompute = Recompute::selective;
  EXPECT_NEAR(layer_time(m, p, h100, c).recompute, none.attention_fwd, 1e-15);
  // torchtitan's op-level policy recomputes k, o and up of q, k, v, o, gate, up, down: their
  // FLOPs are (h kv + h h + h f) / (h (h + 2 kv) + h h + 3 h f) of the forward GEMMs (up to the
  // tile model's small differences between GEMMs of one layer).
  p.recompute = Recompute::op;
  const LayerTime op = layer_time(m, p, h100, c);
  const double h = 4096, kv = 1024, f = 14336;
  const double share = (h * kv + h * h + h * f) / (h * (h + 2 * kv) + h * h + 3 * h * f);
  EXPECT_GT(op.recompute, share * none.linear_fwd);
  EXPECT_LT(op.recompute, share * none.linear_fwd * 1.1 + (none.fwd - none.linear_fwd - none.attention_fwd));
  // The recomputed GEMMs its re-run all-gathers hide under (tp_comm_overlap): k after the
  // attention's (t x kv x h), up after the MLP's (t x f x h); none outside op-level checkpointing,
  // none with GELU (its recomputed o and fc2 read no gathered input).
  EXPECT_EQ(op.op_gather_consumers[0], gemm_seconds(h100, Precision::bf16, {2.0 * 8192, kv, h}, c));
  EXPECT_EQ(op.op_gather_consumers[1], gemm_seconds(h100, Precision::bf16, {2.0 * 8192, f, h}, c));
  EXPECT_EQ(none.op_gather_consumers[0] + none.op_gather_consumers[1], 0);
  ModelSpec gelu = m;
  gelu.activation = Activation::gelu;
  const LayerTime gelu_op = layer_time(gelu, p, h100, c);
  EXPECT_EQ(gelu_op.op_gather_consumers[0] + gelu_op.op_gather_consumers[1], 0);
  // Early stop (PyTorch's non-reentrant checkpoint) stops at the down projection's saved input: its
  // forward GEMM (t tokens x h outputs x f inputs) is the only thing full recomputation no longer
  // reruns; of the SwiGLU layer's forward GEMMs (q, k, v, o, gate, up, down) it is
  // h f / (h (h + 2 kv) + h h + 3 h f) of the FLOPs, about 27% here.
  p.recompute = Recompute::full;
  const LayerTime whole = layer_time(m, p, h100, c);
  p.recompute_early_stop = true;
  const LayerTime early = layer_time(m, p, h100, c);
  const double down = gemm_seconds(h100, Precision::bf16, {2.0 * 8192, 4096, 14336}, c);
  EXPECT_NEAR(whole.recompute - early.recompute, down, 1e-15);
  EXPECT_EQ(whole.linear_recompute, whole.linear_fwd);  // what tp collectives of the recompute hide under
  EXPECT_NEAR(early.linear_recompute, whole.linear_fwd - down, 1e-15);
  EXPECT_EQ(none.linear_recompute, 0);
  EXPECT_NEAR(whole.linear - early.linear, down, 1e-15);
  EXPECT_NEAR(whole.total() - early.total(), down, 1e-15);
  EXPECT_EQ(early.attention, whole.attention);
  EXPECT_EQ(early.fwd, whole.fwd);
  EXPECT_NEAR(down / whole.linear_fwd, h * f / (h * (h + 2 * kv) + h * h + 3 * h * f), 0.02);
  // It changes nothing without full recomputation.
  for (Recompute r : {Recompute::none, Recompute::selective, Recompute::op}) {
    p.recompute = r;
    p.recompute_early_stop = false;
    const double before = layer_time(m, p, h100, c).total();
    p.recompute_early_stop = true;
    EXPECT_EQ(layer_time(m, p, h100, c).total(), before);
  }
}

TEST(Compute, FusedKernelsAndFp8CastsAreCountedBytes) {
  const ModelSpec m = llama_like();
  const Device& h100 = find_device("h100-sxm");
  const Calibration& c = default_calibration();
  Plan p = one_gpu();
  const double bw = h100.hbm_bw_gbs * 1e9 * h100.bw_efficiency, t = 8192, h = 4096, f = 14336, kv = 1024;
  p.fused_kernels = true;
  // Fused, no dropout, SwiGLU, RoPE: norms 4h + residuals 4h replicated; 3f + (h + kv) split; x3
  // for forward + backward (2x).
  EXPECT_NEAR(layer_time(m, p, h100, c).elementwise, 3 * 2 * t * (8 * h + 3 * f + (h + kv)) / bw, 1e-12);
  p.fused_kernels = false;
  // Eager: one read and one write per op, except PyTorch's composite RMSNorm (36 bytes an element
  // forward, 92 backward, for the 4 and 8 of one read and write at 2 bytes) and Llama's complex
  // fp32 RoPE (20 and 20 for 4 and 8) on q and k.
  const double generic = 2 * (10 * h + 5 * f + 2 * (h + kv));
  const double norms = 2 * h * ((36 - 4) + (92 - 8)), rope = (h + kv) * ((20 - 4) + (20 - 8));
  EXPECT_NEAR(layer_time(m, p, h100, c).elementwise, t * (3 * generic + norms + rope) / bw, 1e-12);
  // At tp 2 the split ops (the MLP's, RoPE on the rank's heads) halve; the norms too with sequence
  // parallelism only.
  p.tp = 2;
  const double split = 5 * f + 2 * (h + kv), replicated = 10 * h;
  EXPECT_NEAR(layer_time(m, p, h100, c).elementwise,
              t * (3 * 2 * (replicated + split / 2) + norms + rope / 2) / bw, 1e-12);
  p.seq_parallel = true;
  EXPECT_NEAR(layer_time(m, p, h100, c).elementwise,
              t * (3 * 2 * (replicated + split) / 2 + norms / 2 + rope / 2) / bw, 1e-12);
  p.tp = 1, p.seq_parallel = false;
  // A LayerNorm model without RoPE runs one kernel per norm in eager mode too: the generic count.
  ModelSpec ln = m;
  ln.norm = Norm::layernorm, ln.position = Position::learned;
  EXPECT_NEAR(layer_time(ln, p, h100, c).elementwise, 3 * 2 * t * (10 * h + 5 * f) / bw, 1e-12);
  // fp8: TE's delayed scaling with fused modules writes 1 byte per input element and 4 per
  // output-gradient element of each linear layer.
  p.precision = Precision::fp8;
  p.fused_kernels = true;
  p.fp8_recipe = Fp8Recipe::delayed;
  const double k_sum = h + h + h + f, n_sum = (h + 2 * kv) + h + 2 * f + h;
  EXPECT_NEAR(layer_time(m, p, h100, c).casts, 2 * t * (k_sum + 4 * n_sum) / bw, 1e-12);
  p.fp8_recipe = Fp8Recipe::tensorwise;
  EXPECT_GT(layer_time(m, p, h100, c).casts, 2 * t * (2 * k_sum + 3 * n_sum) / bw);
}

TEST(Compute, AlibiRunsNoRopeAndWritesItsBiasIntoUnfusedScores) {
  const ModelSpec m = llama_like();
  const Device& a100 = find_device("a100-80g");
  const Calibration& c = default_calibration();
  const double bw = a100.hbm_bw_gbs * 1e9 * a100.bw_efficiency, t = 8192, h = 4096, kv = 1024;
  Plan p = one_gpu();
  p.fused_kernels = false;
  const double rope = layer_time(m, p, a100, c).elementwise;
  p.alibi = true;  // MPT, BLOOM: no RoPE kernels (eager: Llama's complex fp32 RoPE, 20 + 20 bytes an element)
  EXPECT_NEAR(rope - layer_time(m, p, a100, c).elementwise, t * 40 * (h + kv) / bw, 1e-12);
  // Unfused attention: baddbmm(alibi, q, k^T) writes the broadcast bias into the scores and reads
  // it back as C: 4 bytes more per score element forward (32 heads x 8192 x 8192 at 16 bits).
  p.attention = Attention::unfused;
  const double with = layer_time(m, p, a100, c).attention_fwd;
  p.alibi = false;
  EXPECT_NEAR(with - layer_time(m, p, a100, c).attention_fwd, 4.0 * 32 * 8192 * 8192 / bw, 1e-9 * with);
}

TEST(Compute, Bf16OptimizerAccumulatesEachMicroBatchIntoFp32) {
  // DeepSpeed's BF16Optimizer adds each micro-batch's bf16 gradients into its fp32 buffer: 18 bytes
  // per parameter of the rank per micro-batch, independent of the micro-batch size, so halving the
  // micro-batch at a fixed global batch adds that pass once per extra micro-batch.
  ModelSpec m = llama_like();
  MachineSpec mach;
  mach.device = "a100-80g", mach.gpus_per_node = 8, mach.intra_node_bw_gbs = 300, mach.inter_node_bw_gbs = 200;
  const Device& a100 = find_device("a100-80g");
  Plan p = one_gpu(2);
  p.global_batch = 8;  // 4 micro-batches
  const double without = predict(m, mach, p).breakdown.compute;
  p.grads_twice = true;
  const double with = predict(m, mach, p).breakdown.compute;
  const double pass = 18.0 * double(parameters_on_rank(m, p, 0)) / (a100.hbm_bw_gbs * 1e9 * a100.bw_efficiency);
  EXPECT_NEAR(with - without, 4 * pass, 1e-9 * with);
}

TEST(Compute, Fsdp1PassesEachUnitsGradientThroughHbmPerMicroBatch) {
  // torch FSDP1's post-backward hook casts each unit's unsharded bf16 gradient to the fp32 reduce
  // dtype (read 2, write 4 bytes) and pre-divides it in place (read 4, write 4): 14 bytes per
  // parameter of the rank per micro-batch; with bf16 reduction (PURE) only the division, 4 bytes;
  // nothing without ZeRO 2/3 sharding or without replicas (no reduce-scatter).
  ModelSpec m = llama_like();
  MachineSpec mach;
  mach.device = "h100-sxm", mach.gpus_per_node = 8, mach.intra_node_bw_gbs = 450, mach.inter_node_bw_gbs = 400;
  const Device& h100 = find_device("h100-sxm");
  Plan p = one_gpu(2);
  p.dp = 8, p.gpus = 8, p.zero = 3, p.global_batch = 2 * 8 * 3;  // 3 micro-batches
  const double without = predict(m, mach, p).breakdown.compute;
  p.fsdp_grad_pass = true;
  const double with = predict(m, mach, p).breakdown.compute;
  const double per_byte = double(parameters_on_rank(m, p, 0)) / (h100.hbm_bw_gbs * 1e9 * h100.bw_efficiency);
  EXPECT_NEAR(with - without, 3 * 14 * per_byte, 1e-9 * with);
  p.grads_16bit = true;
  const double pure = predict(m, mach, p).breakdown.compute;
  p.fsdp_grad_pass = false;
  EXPECT_NEAR(pure - predict(m, mach, p).breakdown.compute, 3 * 4 * per_byte, 1e-9 * pure);
  p.grads_16bit = false, p.fsdp_grad_pass = true, p.zero = 0;  // DDP-like: no unit reduce-scatter
  const double ddp = predict(m, mach, p).breakdown.compute;
  p.fsdp_grad_pass = false;
  EXPECT_DOUBLE_EQ(ddp, predict(m, mach, p).breakdown.compute);
}
