// Memory model against Korthikanti et al. 2022 (Table 2) and hand-computed cases.
#include <gtest/gtest.h>

#include "catalog/device.hpp"
#include "plan/flops.hpp"
#include "plan/memory.hpp"
#include "plan/predict.hpp"

using namespace exatrain;
using namespace exatrain::plan;

namespace {
ModelSpec gpt3_175b() {
  ModelSpec m;
  m.layers = 96; m.hidden = 12288; m.heads = 96; m.kv_heads = 96; m.ffn_hidden = 49152;
  m.seq_len = 2048; m.vocab = 51200;
  return m;
}
Plan tp_plan(int64_t tp, bool sp, int64_t mb) {
  Plan p;
  p.tp = tp; p.pp = 1; p.dp = 1; p.gpus = tp; p.micro_batch = mb; p.global_batch = mb;
  p.seq_parallel = sp; p.attention = Attention::unfused; p.precision = Precision::bf16;
  return p;
}
// GPT-3 175B on tp 8 x pp 8 x dp (64 dp GPUs), 16 micro-batches of one sequence per replica.
Plan pipelined_plan(Precision precision, int64_t zero, int64_t dp = 4) {
  Plan p;
  p.tp = 8; p.pp = 8; p.dp = dp; p.gpus = 64 * dp; p.micro_batch = 1; p.global_batch = 16 * dp;
  p.precision = precision;
  p.zero = zero;
  return p;
}
}  // namespace

TEST(Memory, KorthikantiActivationsPerLayer) {
  ModelSpec m = gpt3_175b();
  double s = 2048, b = 2, h = 12288, a = 96, t = 8;
  // No parallelism: sbh (34 + 5as/h).
  EXPECT_DOUBLE_EQ(activation_bytes_per_layer(m, tp_plan(1, false, 2), Recompute::none),
                   s * b * h * (34 + 5 * a * s / h));
  // Tensor parallel: sbh (10 + 24/t + 5as/(ht)).
  EXPECT_DOUBLE_EQ(activation_bytes_per_layer(m, tp_plan(8, false, 2), Recompute::none),
                   s * b * h * (10 + 24 / t + 5 * a * s / (h * t)));
  // Tensor + sequence parallel: sbh/t (34 + 5as/h).
  EXPECT_DOUBLE_EQ(activation_bytes_per_layer(m, tp_plan(8, true, 2), Recompute::none),
                   s * b * h / t * (34 + 5 * a * s / h));
  // Selective recomputation with sequence parallelism: 34 sbh / t.
  EXPECT_DOUBLE_EQ(activation_bytes_per_layer(m, tp_plan(8, true, 2), Recompute::selective),
                   34 * s * b * h / t);
  // Full recomputation keeps the layer input: 2 sbh (/t with sp).
  EXPECT_DOUBLE_EQ(activation_bytes_per_layer(m, tp_plan(8, false, 2), Recompute::full), 2 * s * b * h);
  EXPECT_DOUBLE_EQ(activation_bytes_per_layer(m, tp_plan(8, true, 2), Recompute::full), 2 * s * b * h / t);
}

// [train] residual_dtype = "fp32" (Megatron's --fp32-residual-connection) under bf16: the layer's
// input and mid, 2 of Korthikanti's 34 bytes per hidden value, take 4 bytes each (+4 sbh, /t with
// sequence parallelism; full and op-level recomputation keep the input only: +2 sbh); at fp32
// nothing changes.
TEST(Memory, Fp32ResidualCountsTheResidualStreamAtFourBytes) {
  ModelSpec m = gpt3_175b();
  const double s = 2048, b = 2, h = 12288, t = 8;
  for (bool sp : {false, true}) {
    Plan p = tp_plan(8, sp, 2);
    const double split = sp ? t : 1;
    const double none = activation_bytes_per_layer(m, p, Recompute::none);
    const double selective = activation_bytes_per_layer(m, p, Recompute::selective);
    const double op = activation_bytes_per_layer(m, p, Recompute::op);
    const double full = activation_bytes_per_layer(m, p, Recompute::full);
    p.residual_fp32 = true;
    EXPECT_DOUBLE_EQ(activation_bytes_per_layer(m, p, Recompute::none), none + 4 * s * b * h / split);
    EXPECT_DOUBLE_EQ(activation_bytes_per_layer(m, p, Recompute::selective), selective + 4 * s * b * h / split);
    EXPECT_DOUBLE_EQ(activation_bytes_per_layer(m, p, Recompute::op), op + 2 * s * b * h / split);
    EXPECT_DOUBLE_EQ(activation_bytes_per_layer(m, p, Recompute::full), full + 2 * s * b * h / split);
    EXPECT_DOUBLE_EQ(activation_bytes_per_layer(m, p, Recompute::full), 4 * s * b * h / split);
    p.precision = Precision::fp32;
    const double at_fp32 = activation_bytes_per_layer(m, p, Recompute::none);
    p.residual_fp32 = false;
    EXPECT_DOUBLE_EQ(activation_bytes_per_layer(m, p, Recompute::none), at_fp32);
  }
}

TEST(Memory, FlashAttentionDropsTheScoreTerm) {
  ModelSpec m = gpt3_175b();
  Plan p = tp_plan(1, false, 1);
  p.attention = Attention::flash2;
  EXPECT_DOUBLE_EQ(activation_bytes_per_layer(m, p, Recompute::none), 2048.0 * 12288 * 34);
}

// Llama-style layers (SwiGLU, GQA, no dropout, flash attention), per token at tp = 1: 8h replicated
// (input, mid, two norm outputs), 4h + 4kv for attention (q, output; k, v) and the MLP. Eager
// SwiGLU keeps gate, up, silu(gate) and the product (8f); Megatron-Core's fused bias_swiglu
// saves only its input, so silu(gate) goes (6f). With Transformer Engine's fp8 linears the two
// norm outputs and fc2's input are kept in fp8 (-2h, -f), the out-projection's fp8 input beside
// the attention core's 16-bit output (+h); torchao's Float8Linear keeps the 16-bit tensors.
TEST(Memory, FusedSwigluAndTransformerEngineFp8Inputs) {
  ModelSpec m;
  m.layers = 32; m.hidden = 4096; m.heads = 32; m.kv_heads = 8; m.ffn_hidden = 14336; m.seq_len = 8192;
  m.vocab = 128256; m.activation = Activation::swiglu; m.norm = Norm::rmsnorm; m.position = Position::rope;
  const double t = 8192, h = 4096, kv = 1024, f = 14336;
  Plan p = tp_plan(1, false, 1);
  p.attention = Attention::flash2;
  p.fused_kernels = false;
  EXPECT_DOUBLE_EQ(activation_bytes_per_layer(m, p, Recompute::none), t * (8 * h + 4 * h + 4 * kv + 8 * f));
  p.fused_kernels = true;
  p.swiglu_saves_input_only = false;  // torch.compile as torchtitan runs it
  EXPECT_DOUBLE_EQ(activation_bytes_per_layer(m, p, Recompute::none), t * (8 * h + 4 * h + 4 * kv + 8 * f));
  p.swiglu_saves_input_only = true;  // Megatron-Core's bias_swiglu_impl
  const double bf16 = t * (8 * h + 4 * h + 4 * kv + 6 * f);
  EXPECT_DOUBLE_EQ(activation_bytes_per_layer(m, p, Recompute::none), bf16);
  p.precision = Precision::fp8;
  EXPECT_DOUBLE_EQ(activation_bytes_per_layer(m, p, Recompute::none), bf16 - t * (2 * h - h + f));
  p.fp8_saves_quantized_inputs = false;  // torchao's Float8Linear
  EXPECT_DOUBLE_EQ(activation_bytes_per_layer(m, p, Recompute::none), bf16);
  // Full recomputation keeps only the layer input, whatever the linears save.
  p.fp8_saves_quantized_inputs = true;
  EXPECT_DOUBLE_EQ(activation_bytes_per_layer(m, p, Recompute::full), 2 * t * h);
}

TEST(Memory, InFlightMicroBatchesBySchedule) {
  Plan p;
  p.pp = 8; p.dp = 1; p.tp = 1; p.gpus = 8; p.micro_batch = 1; p.global_batch = 64;
  EXPECT_DOUBLE_EQ(microbatches_in_flight(p), 8);  // 1F1B: pp
  p.schedule = Schedule::gpipe;
  EXPECT_DOUBLE_EQ(microbatches_in_flight(p), 64);  // GPipe: all m
  p.schedule = Schedule::one_f_one_b;
  p.vp = 4;  // interleaved: pp (1 + (pp-1)/(pp vp))
  EXPECT_DOUBLE_EQ(microbatches_in_flight(p), 8 * (1 + 7.0 / 32));
  // ... and rank 7 of 8 (Megatron's warm-up: (vp - 1) pp = 24 units, + 1) holds 25 chunks of 4.
  EXPECT_DOUBLE_EQ(microbatches_in_flight(p, 7), 25.0 / 4);
  p.vp = 1;
  EXPECT_DOUBLE_EQ(microbatches_in_flight(p, 7), 1);  // 1F1B: pp - r
}

TEST(Memory, HandComputedGpt2SingleDevice) {
  // GPT-2 small, one A100-80GB, bf16, ZeRO 0, full recomputation, micro-batch 8 of 1024 tokens.
  ModelSpec m;  // defaults are GPT-2 small: 12 x 768, 12 heads, seq 1024, vocab 50257
  Plan p;
  p.micro_batch = 8; p.global_batch = 8; p.recompute = Recompute::full;
  p.precision = Precision::bf16;
  Memory mem = memory_per_device(m, p, find_device("a100-80g"));
  double n = 124439808;  // parameters (tied embeddings)
  EXPECT_DOUBLE_EQ(mem.params, 2 * n);
  EXPECT_DOUBLE_EQ(mem.grads, 4 * n);  // fp32 gradient accumulation
  EXPECT_DOUBLE_EQ(mem.optimizer, 12 * n);
  double t = 8 * 1024.0, h = 768;
  double layer_inputs = 12 * 2 * t * h;                       // 12 layers x 2 sbh
  double working_layer = t * h * 34 - 2 * t * h;              // one layer rebuilt (flash)
  double gradients = t * h * 34;                              // the backward's activation gradients
  double logits = 8 * t * 50257;                              // fused cross entropy: 16-bit + fp32
  double embedding = 2 * t * h;                               // embedding output
  EXPECT_DOUBLE_EQ(mem.activations, layer_inputs + working_layer + gradients + logits + embedding);
  double rest = mem.params + mem.grads + mem.optimizer + mem.activations + kRuntimeReserveBytes;
  EXPECT_DOUBLE_EQ(mem.buffers, kRuntimeReserveBytes + kFragmentationAtCapacity * rest);
  EXPECT_DOUBLE_EQ(mem.total, rest + kFragmentationAtCapacity * rest);  // what fits compares
  EXPECT_DOUBLE_EQ(mem.peak, rest + kFragmentation * rest);             // what a monitor reports
  // Eager CUDA module loading (PyTorch before 1.13) holds every library kernel in the context:
  // 1573 MiB measured on an A100 less a lazy context's 287,047,680 bytes, about 1.27 GiB more.
  p.cuda_modules_eager = true;
  const Memory eager = memory_per_device(m, p, find_device("a100-80g"));
  EXPECT_NEAR(kEagerModuleLoadingBytes / double(1 << 30), 1.27, 0.005);
  EXPECT_DOUBLE_EQ(eager.total, mem.total + (1 + kFragmentationAtCapacity) * kEagerModuleLoadingBytes);
  EXPECT_DOUBLE_EQ(eager.activations, mem.activations);
}

// Muon keeps one fp32 momentum buffer per matrix element (AdamW's two moments elsewhere): GPT-2
// small's matrices are 12 layers x (768 x 2304 qkv + 768 x 768 o + 768 x 3072 fc1 + 3072 x 768 fc2).
TEST(Memory, EachOptimizerKeepsItsStatePerElement) {
  ModelSpec m;
  Plan p;
  p.micro_batch = 8; p.global_batch = 8; p.precision = Precision::bf16;
  const double n = 124439808, matrices = 12.0 * (768 * 2304 + 768 * 768 + 768 * 3072 + 3072 * 768);
  EXPECT_EQ(matrix_parameters_on_rank(m, p, 0), int64_t(matrices));
  TrainSpec t;
  t.optimizer = "muon";
  p.set_optimizer(t);
  EXPECT_DOUBLE_EQ(memory_per_device(m, p, find_device("a100-80g")).optimizer, 12 * n - 4 * matrices);
  p.precision = Precision::fp32;
  EXPECT_DOUBLE_EQ(memory_per_device(m, p, find_device("a100-80g")).optimizer, 8 * n - 4 * matrices);
  t.optimizer = "adamw";
  p.set_optimizer(t);
  EXPECT_DOUBLE_EQ(memory_per_device(m, p, find_device("a100-80g")).optimizer, 8 * n);
  // SGD and Lion: one fp32 value per element; Adafactor factored without a first moment: none
  // counted (its row and column means and the 1-D entries' moments are under 0.1% here).
  for (const char* o : {"sgd", "lion"}) {
    t.optimizer = o;
    p.set_optimizer(t);
    EXPECT_DOUBLE_EQ(memory_per_device(m, p, find_device("a100-80g")).optimizer, 4 * n) << o;
  }
  t.optimizer = "adafactor";
  p.set_optimizer(t);
  EXPECT_DOUBLE_EQ(memory_per_device(m, p, find_device("a100-80g")).optimizer, 0) << "adafactor";
  t.adafactor.beta1 = 0.9;
  p.set_optimizer(t);
  EXPECT_DOUBLE_EQ(memory_per_device(m, p, find_device("a100-80g")).optimizer, 4 * n) << "adafactor, beta1";
}

TEST(Memory, ZeroStagesShardStates) {
  ModelSpec m = gpt3_175b();
  Plan p = pipelined_plan(Precision::bf16, 0);
  const Device& d = find_device("a100-80g");
  Memory z0 = memory_per_device(m, p, d);
  p.zero = 1;
  Memory z1 = memory_per_device(m, p, d);
  p.zero = 3;
  Memory z3 = memory_per_device(m, p, d);
  EXPECT_DOUBLE_EQ(z1.optimizer, z0.optimizer / 4);
  EXPECT_DOUBLE_EQ(z1.grads, z0.grads);
  // ZeRO 3 keeps the fp32 shard as the master (FSDP, this runtime): 4 bytes of weights per
  // sharded parameter where ZeRO 0 keeps a 16-bit copy (2), and no separate master in the state.
  EXPECT_DOUBLE_EQ(z3.params, 2 * z0.params / 4);
  EXPECT_DOUBLE_EQ(z3.grads, z0.grads / 4);
  EXPECT_DOUBLE_EQ(z3.optimizer, z0.optimizer * 8 / 12 / 4);
  EXPECT_DOUBLE_EQ(z3.params + z3.grads + z3.optimizer, 16 * double(parameters_on_rank(m, p, 0)) / 4);
  // Rank 0 of an 8-stage pipeline: 12 layers / tp 8 + the vocabulary-parallel embedding.
  int64_t h = 12288;
  int64_t layer = h * (h / 8 + 2 * h / 8) + (h / 8) * h + h * (4 * h / 8) + (4 * h / 8) * h +
                  (h / 8 + 2 * h / 8) + h + 4 * h / 8 + h + 4 * h;
  EXPECT_EQ(parameters_on_rank(m, p, 0), 12 * layer + 51200 / 8 * h + 2048 * h);
}

TEST(Memory, ZeroThreeWithoutReplicasIsZeroZero) {
  // dp * cp = 1: nothing to shard over, and the plan's note calls ZeRO 3 a no-op; so are its bytes.
  ModelSpec m = gpt3_175b();
  Plan p = pipelined_plan(Precision::bf16, 0, 1);
  const Device& d = find_device("a100-80g");
  Memory z0 = memory_per_device(m, p, d);
  p.zero = 3;
  Memory z3 = memory_per_device(m, p, d);
  EXPECT_DOUBLE_EQ(z3.params, z0.params);
  EXPECT_DOUBLE_EQ(z3.grads, z0.grads);
  EXPECT_DOUBLE_EQ(z3.optimizer, z0.optimizer);
}

TEST(Memory, CrossEntropyBytesByImplementation) {
  // The last stage's logits: Megatron's fused kernel 8 bytes each, eager PyTorch 12, compiled and flash-attn's 4.
  ModelSpec m = gpt3_175b();
  Plan p;
  p.tp = 8; p.pp = 1; p.dp = 1; p.gpus = 8; p.micro_batch = 1; p.global_batch = 1;
  p.precision = Precision::bf16;
  const Device& d = find_device("a100-80g");
  const double logits = double(m.seq_len) * double((m.vocab + 7) / 8);
  p.cross_entropy = CrossEntropy::fused;
  const double fused = memory_per_device(m, p, d).activations;
  p.cross_entropy = CrossEntropy::eager;
  EXPECT_DOUBLE_EQ(memory_per_device(m, p, d).activations - fused, 4 * logits);
  p.cross_entropy = CrossEntropy::compiled;
  EXPECT_DOUBLE_EQ(fused - memory_per_device(m, p, d).activations, 4 * logits);
  p.cross_entropy = CrossEntropy::flash_attn;  // flash-attn's kernel holds what inductor's does
  EXPECT_DOUBLE_EQ(fused - memory_per_device(m, p, d).activations, 4 * logits);
}

TEST(Memory, ARunNeedsLessThanThePeakAMonitorReports) {
  // Memory::peak carries the allocator's cache at rest (fragmentation), Memory::total what a run near
  // its capacity still needs (fragmentation_at_capacity): both on the same counted sum, and predict's
  // `fits` compares total with the device's memory.
  ModelSpec m = gpt3_175b();
  Plan p = pipelined_plan(Precision::bf16, 0, 1);
  p.recompute = Recompute::full;
  const Device& d = find_device("a100-80g");
  const Memory none = memory_per_device(m, p, d, 0.0, 0.0);
  EXPECT_DOUBLE_EQ(none.total, none.peak);
  const Memory mem = memory_per_device(m, p, d, 0.2, 0.05);
  EXPECT_NEAR(mem.peak / none.peak, 1.2, 1e-12);
  EXPECT_NEAR(mem.total / none.total, 1.05, 1e-12);
  EXPECT_DOUBLE_EQ(mem.total, mem.params + mem.grads + mem.optimizer + mem.activations + mem.buffers);
  MachineSpec mach;  // a DGX A100 cluster
  mach.device = "a100-80g";
  mach.gpus_per_node = 8;
  mach.intra_node_bw_gbs = 300, mach.inter_node_bw_gbs = 200;
  mach.intra_node_latency_us = 3, mach.inter_node_latency_us = 5, mach.storage_bw_gbs = 100;
  Calibration cal;
  cal.fragmentation = 0.2, cal.fragmentation_at_capacity = 0.05;
  const Prediction pr = predict(m, mach, p, cal);
  EXPECT_DOUBLE_EQ(pr.memory.total, mem.total);
  EXPECT_DOUBLE_EQ(pr.memory.peak, mem.peak);
  EXPECT_EQ(pr.fits, pr.memory.total <= pr.device_memory_bytes);
  EXPECT_DOUBLE_EQ(to_json(pr)["memory_peak_gib"].get<double>(), pr.memory.peak / double(1 << 30));
  // The memory model's defaults are the calibration's shipped constants.
  EXPECT_EQ(kFragmentation, Calibration{}.fragmentation);
  EXPECT_EQ(kFragmentationAtCapacity, Calibration{}.fragmentation_at_capacity);
  // A run whose counted memory sits between the two shares of the capacity fits, though its peak
  // at rest would not: the allocator gives its cache back before failing.
  cal.fragmentation_at_capacity = 0.0;
  cal.fragmentation = 2 * d.hbm_gib * double(1 << 30) / none.total;
  const Prediction tight = predict(m, mach, p, cal);
  EXPECT_GT(tight.memory.peak, tight.device_memory_bytes);
  EXPECT_TRUE(tight.fits);
}

TEST(Memory, Fp8AllGatherHoldsTheGatheredMatricesInOneByte) {
  // torchao's float8 all-gather (Plan::fp8_all_gather): ZeRO 3's gathered units hold the layers'
  // matrices as float8, 1 byte each instead of 2; norms and biases stay 16-bit. Only fp8 under ZeRO 3.
  ModelSpec m = gpt3_175b();
  Plan p = pipelined_plan(Precision::fp8, 3);
  const Device& d = find_device("h100-sxm");
  const double layer = double(layer_parameters(m)) / 8, mats = double(matrix_parameters_on_rank(m, p, 0)) / 12;
  EXPECT_LT(mats, layer);
  EXPECT_DOUBLE_EQ(gathered_unit_bytes(m, p, 0), 2 * layer);
  const Memory two = memory_per_device(m, p, d, 0.0, 0.0);
  p.fp8_all_gather = true;
  EXPECT_DOUBLE_EQ(gathered_unit_bytes(m, p, 0), 2 * layer - mats);
  EXPECT_DOUBLE_EQ(gathered_weight_bytes(p, 10, 6), 2 * 4 + 1 * 6);
  // The unit computing and the one prefetched: two units' matrices fewer bytes, nothing else moves.
  const Memory one = memory_per_device(m, p, d, 0.0, 0.0);
  EXPECT_DOUBLE_EQ(two.buffers - one.buffers, 2 * mats);
  EXPECT_DOUBLE_EQ(two.activations, one.activations);
  // ZeRO 1 and 2 gather the updated weights as float8 too (Megatron's fp8_param_gather); their
  // memory holds none gathered (the weights stay counted at 2 bytes: fp8 data and transpose).
  p.zero = 1;
  EXPECT_DOUBLE_EQ(gathered_weight_bytes(p, 10, 6), 2 * 4 + 1 * 6);
  const Memory zero1 = memory_per_device(m, p, d, 0.0, 0.0);
  p.fp8_all_gather = false;
  const Memory zero1_16 = memory_per_device(m, p, d, 0.0, 0.0);
  EXPECT_DOUBLE_EQ(zero1.total, zero1_16.total);
  p.fp8_all_gather = true, p.zero = 0;
  EXPECT_DOUBLE_EQ(gathered_weight_bytes(p, 10, 6), 2 * 10);  // nothing gathered at ZeRO 0
  p.zero = 3, p.precision = Precision::bf16;
  EXPECT_DOUBLE_EQ(gathered_unit_bytes(m, p, 0), 2 * layer);  // no float8 weights without fp8
}

TEST(Memory, FsdpUnderPipeliningHoldsTheRankGatheredForTheStep) {
  // FSDP2 under torch.distributed.pipelining (Plan::fsdp_unsharded_in_pipeline): each pipeline
  // rank holds its parameters gathered (16 bits) beside their fp32 shards, and their gradients
  // unsharded in fp32 instead of sharded, for the whole step; no per-unit gather buffers on top.
  ModelSpec m = gpt3_175b();
  Plan p = pipelined_plan(Precision::bf16, 3);
  const Device& d = find_device("a100-80g");
  const Memory sharded = memory_per_device(m, p, d, 0.0, 0.0);
  p.fsdp_unsharded_in_pipeline = true;
  const Memory held = memory_per_device(m, p, d, 0.0, 0.0);
  ASSERT_EQ(held.pp_rank, sharded.pp_rank);
  const double n = double(parameters_on_rank(m, p, held.pp_rank));
  EXPECT_DOUBLE_EQ(held.params - sharded.params, 2 * n);
  EXPECT_DOUBLE_EQ(sharded.grads, 4 * n / 4);
  EXPECT_DOUBLE_EQ(held.grads, 4 * n);
  EXPECT_DOUBLE_EQ(sharded.buffers - held.buffers, 2 * gathered_unit_bytes(m, p, held.pp_rank));
  EXPECT_DOUBLE_EQ(held.optimizer, sharded.optimizer);
  EXPECT_DOUBLE_EQ(held.activations, sharded.activations);
  // 16-bit gradients (FSDP's PURE policy) are held unsharded in 16 bits.
  p.grads_16bit = true;
  EXPECT_DOUBLE_EQ(memory_per_device(m, p, d, 0.0, 0.0).grads, 2 * n);
  p.grads_16bit = false;
  // Without replicas to shard over (dp * cp = 1), or without a pipeline, nothing moves.
  for (auto [pp, dp] : {std::pair<int64_t, int64_t>{8, 1}, {1, 4}}) {
    p.pp = pp, p.dp = dp, p.gpus = 8 * pp * dp, p.global_batch = 16 * dp;
    Plan q = p;
    q.fsdp_unsharded_in_pipeline = false;
    EXPECT_DOUBLE_EQ(memory_per_device(m, p, d, 0.0, 0.0).total, memory_per_device(m, q, d, 0.0, 0.0).total)
        << "pp " << pp << " dp " << dp;
  }
}
