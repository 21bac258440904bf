// Exact bytes per rank per collective (the runtime's contract) and alpha-beta times.
#include <algorithm>
#include <map>

#include <gtest/gtest.h>

#include "catalog/device.hpp"
#include "core/check.hpp"
#include "plan/comm.hpp"
#include "plan/flops.hpp"
#include "plan/memory.hpp"

using namespace exatrain;
using namespace exatrain::plan;

TEST(Comm, RingConvention) {
  // p divides E: all-reduce sends 2 (p-1)/p E from every rank.
  for (int64_t r = 0; r < 4; ++r) EXPECT_EQ(ring_all_reduce_sent(1000, 4, r), 1500);
  // E = 10 over p = 4: chunks 3,3,2,2. Reduce-scatter: all but chunk r.
  EXPECT_EQ(ring_reduce_scatter_sent(10, 4, 0), 7);
  EXPECT_EQ(ring_reduce_scatter_sent(10, 4, 3), 8);
  // All-gather: all but chunk (r+1) mod p.
  EXPECT_EQ(ring_all_gather_sent(10, 4, 0), 7);
  EXPECT_EQ(ring_all_gather_sent(10, 4, 1), 8);
  EXPECT_EQ(ring_all_gather_sent(10, 4, 3), 7);
  // Over the group every pass sends (p-1) E elements in total.
  int64_t rs = 0, ag = 0;
  for (int64_t r = 0; r < 4; ++r) { rs += ring_reduce_scatter_sent(10, 4, r); ag += ring_all_gather_sent(10, 4, r); }
  EXPECT_EQ(rs, 30);
  EXPECT_EQ(ag, 30);
  EXPECT_EQ(ring_all_reduce_sent(10, 1, 0), 0);
}

TEST(Comm, BytesPerStepForAHandComputedPlan) {
  // GPT-2 small, fp32 (our CPU runtime), tp 2 x dp 2, 2 micro-batches of 1 x 1024 tokens, no
  // recomputation, ZeRO 0.
  ModelSpec m;
  Plan p;
  p.tp = 2; p.dp = 2; p.gpus = 4; p.micro_batch = 1; p.global_batch = 4;
  p.precision = Precision::fp32;
  RankPosition pos = rank_position(p, 3);  // tp_rank 1, dp_rank 1
  EXPECT_EQ(pos.tp_rank, 1);
  EXPECT_EQ(pos.dp_rank, 1);
  CommBytes b = bytes_sent_per_step(m, p, pos);
  int64_t act = 1024 * 768;  // elements of one activation
  // Per micro-batch: 12 layers x 4 all-reduces + embedding + LM head, each sending act/2 x 2
  // ... = act elements over 2 ranks; plus 3 cross-entropy all-reduces of 1024 fp32.
  int64_t per_mb = (12 * 4 + 2) * act * 4 + 3 * 1024 * 4;
  EXPECT_EQ(b[CommKind::tp_all_reduce], 2 * per_mb);
  EXPECT_EQ(b[CommKind::tp_reduce_scatter], 0);
  // This tp rank's parameters: vocab 50257 at tp 2 leaves tp rank 1 one embedding row fewer.
  int64_t n = parameters_on_rank(m, p, 0, 1);
  EXPECT_EQ(n, parameters_on_rank(m, p, 0, 0) - 768);
  EXPECT_EQ(b[CommKind::dp_all_reduce], ring_all_reduce_sent(n, 2, 1) * 4);
  EXPECT_EQ(b[CommKind::pp_send], 0);
}

TEST(Comm, PipelineSendsPerRank) {
  ModelSpec m;
  Plan p;
  p.pp = 4; p.vp = 3; p.gpus = 4; p.micro_batch = 2; p.global_batch = 8;
  p.precision = Precision::bf16;
  int64_t msg = 2 * 1024 * 768 * 2;  // tokens x hidden x 2 bytes
  int64_t mb = 4;
  // GPT-2 ties its embeddings: the first and last stage also exchange the embedding's gradient
  // (vocab x hidden) once per step; the middle stages do not.
  // The embedding's gradient is fp32 at every precision (the gradients' dtype, not bf16's 2 bytes).
  const int64_t wte = 50257 * 768 * 4;
  EXPECT_EQ(bytes_sent_per_step(m, p, rank_position(p, 0))[CommKind::pp_send], (mb * 3 + mb * 2) * msg + wte);
  EXPECT_EQ(bytes_sent_per_step(m, p, rank_position(p, 1))[CommKind::pp_send], (mb * 3 + mb * 3) * msg);
  EXPECT_EQ(bytes_sent_per_step(m, p, rank_position(p, 3))[CommKind::pp_send], (mb * 2 + mb * 3) * msg + wte);
  m.tie_embeddings = false;
  EXPECT_EQ(bytes_sent_per_step(m, p, rank_position(p, 0))[CommKind::pp_send], (mb * 3 + mb * 2) * msg);
  EXPECT_EQ(bytes_sent_per_step(m, p, rank_position(p, 3))[CommKind::pp_send], (mb * 2 + mb * 3) * msg);
}

TEST(Comm, TiedEmbeddingExchangeIsThisTpRanksVocabularyRows) {
  // tp 2 x pp 2, vp 1, tied: every rank sends m boundary messages (forward on the first stage,
  // backward on the last), and both stages their tp rank's rows of the embedding's gradient,
  // 768 fp32 values each: ceil(50257 / 2) = 25129 on tp rank 0, the other 25128 on tp rank 1
  // (the runtime's vocabulary slices, model/layout.hpp).
  ModelSpec m;
  Plan p;
  p.tp = 2; p.pp = 2; p.gpus = 4; p.micro_batch = 1; p.global_batch = 2;
  p.precision = Precision::fp32;
  const int64_t msg = 1024 * 768 * 4, mb = 2;
  for (int64_t rank = 0; rank < 4; rank++) {
    const int64_t rows = rank % 2 == 0 ? 25129 : 25128;
    EXPECT_EQ(bytes_sent_per_step(m, p, rank_position(p, rank))[CommKind::pp_send], mb * msg + rows * 768 * 4)
        << rank;
  }
}

TEST(Comm, AlphaBetaTimes) {
  MachineSpec mach;
  mach.gpus_per_node = 8; mach.intra_node_bw_gbs = 100; mach.inter_node_bw_gbs = 200;
  mach.intra_node_latency_us = 2; mach.inter_node_latency_us = 5;
  double n = 1e9;
  // Inside a node: 2 (p-1)/p n / B + 2 (p-1) alpha.
  Group g = group_on_machine(8, 1, 8);
  EXPECT_EQ(g.per_node, 8);
  double bw = 100e9 * kBusEfficiency;
  EXPECT_DOUBLE_EQ(all_reduce_time(n, g, mach, Algorithm::ring), 2 * (7.0 / 8) * n / bw + 2 * 7 * 2e-6);
  // One rank per node across 4 nodes: each device gets 1/8 of the node's NICs.
  Group across = group_on_machine(4, 8, 8);
  EXPECT_EQ(across.per_node, 1);
  double nic = 200e9 * kBusEfficiency / 8;
  EXPECT_DOUBLE_EQ(reduce_scatter_time(n, across, mach, Algorithm::ring), 0.75 * n / nic + 3 * 5e-6);
  // Hierarchical is never slower than needed: best = min(ring, hierarchical).
  Group wide = group_on_machine(64, 1, 8);
  EXPECT_LE(best_all_reduce_time(n, wide, mach), all_reduce_time(n, wide, mach, Algorithm::ring));
}

TEST(Comm, TreeAllReduce) {
  MachineSpec mach;
  mach.gpus_per_node = 8; mach.intra_node_bw_gbs = 100; mach.inter_node_bw_gbs = 200;
  mach.intra_node_latency_us = 2; mach.inter_node_latency_us = 5;
  // 1024 nodes, all 8 devices of each in the group: 2 n / bw + 2 (8-1) a_intra + 2 log2(1024) a_inter.
  Group g = group_on_machine(8192, 1, 8);
  double bw = std::min(100e9 * kBusEfficiency, 200e9 * kBusEfficiency / 8 * 8);
  double n = 1e6;
  EXPECT_DOUBLE_EQ(all_reduce_time(n, g, mach, Algorithm::tree),
                   2 * n / bw + 2 * 7 * 2e-6 + 2 * 10 * 5e-6);
  // Small message on many nodes: the tree's log latency beats the ring's (p-1) alpha, and the
  // tuner picks it; a huge message: the ring's (p-1)/p factor and equal bandwidth tie (ring <= tree).
  EXPECT_DOUBLE_EQ(best_all_reduce_time(n, g, mach), all_reduce_time(n, g, mach, Algorithm::tree));
  EXPECT_LT(all_reduce_time(n, g, mach, Algorithm::tree),
            all_reduce_time(n, g, mach, Algorithm::ring));
  Group node = group_on_machine(8, 1, 8);
  EXPECT_LE(best_all_reduce_time(1e10, node, mach), all_reduce_time(1e10, node, mach, Algorithm::tree));
  // NCCL has no tree all-gather / reduce-scatter.
  EXPECT_THROW(all_gather_time(n, g, mach, Algorithm::tree), Error);
}

TEST(Comm, ZeroTwoReduceScattersEveryMicroBatchZeroOneOncePerStep) {
  // GPT-2 small, fp32, dp 4 x pp 2, 8 micro-batches. ZeRO 1 (Megatron's distributed optimizer)
  // accumulates the micro-batches locally and reduce-scatters once; ZeRO 2 (DeepSpeed stage 2)
  // keeps only its shard of the gradients, so it reduce-scatters every micro-batch's. Both
  // all-gather the updated weights once. ZeRO 2's tied-embedding exchange moves the owned 1/dp.
  ModelSpec m;
  Plan p;
  p.dp = 4; p.pp = 2; p.gpus = 8; p.micro_batch = 1; p.global_batch = 32;
  p.precision = Precision::fp32;
  const RankPosition pos = rank_position(p, 5);  // dp_rank 1 of the last stage
  ASSERT_EQ(pos.pp_rank, 1);
  const int64_t n = parameters_on_rank(m, p, 1), mb = p.micro_batches(), tied = m.vocab * m.hidden;
  ASSERT_EQ(mb, 8);
  p.zero = 1;
  const CommBytes z1 = bytes_sent_per_step(m, p, pos);
  p.zero = 2;
  const CommBytes z2 = bytes_sent_per_step(m, p, pos);
  EXPECT_EQ(z1[CommKind::dp_reduce_scatter], ring_reduce_scatter_sent(n, 4, 1) * 4);
  EXPECT_EQ(z2[CommKind::dp_reduce_scatter], mb * ring_reduce_scatter_sent(n, 4, 1) * 4);
  EXPECT_EQ(z2[CommKind::dp_all_gather], z1[CommKind::dp_all_gather]);
  EXPECT_EQ(z1[CommKind::pp_send] - z2[CommKind::pp_send], (tied - tied / 4) * 4);
}

TEST(Comm, ZeroThreeTiedEmbeddingExchangeMovesTheOwnedShard) {
  // ZeRO 3 with a pipeline: each stage's copy of the tied embedding is reduce-scattered into its
  // shard, so the first and last stage's ranks exchange only the 1/dp they own.
  ModelSpec m;
  Plan p;
  p.dp = 2; p.pp = 2; p.gpus = 4; p.micro_batch = 1; p.global_batch = 8;
  p.precision = Precision::fp32;
  const RankPosition first = rank_position(p, 1), last = rank_position(p, 3);
  const int64_t tied = m.vocab * m.hidden * 4;
  const int64_t msgs = bytes_sent_per_step(m, p, first)[CommKind::pp_send] - tied;  // ZeRO 0: the whole copy
  p.zero = 3;
  EXPECT_EQ(bytes_sent_per_step(m, p, first)[CommKind::pp_send], msgs + tied / 2);
  EXPECT_EQ(bytes_sent_per_step(m, p, last)[CommKind::pp_send], msgs + tied / 2);
}

// The byte contract's gradient bytes follow the gradients' reduce dtype, not the precision: this
// runtime reduces fp32 gradients at fp32, bf16 and fp16 ([train] grad_reduce_dtype = "fp32", 4
// bytes, as predict's dp time counts them), bf16 ones with grad_reduce_dtype = "bf16" (2), and a
// framework's 16-bit gradients (Plan::grads_16bit: Megatron's fp16) at 2. Parameter all-gathers
// keep the precision's element size. fp16 counts exactly as bf16, kind by kind.
TEST(Comm, GradientBytesFollowTheReduceDtypeNotThePrecision) {
  ModelSpec m;
  for (int64_t zero : {0, 1, 2}) {
    Plan p;
    p.dp = 2; p.pp = 2; p.gpus = 4; p.micro_batch = 1; p.global_batch = 4; p.zero = zero;
    const RankPosition pos = rank_position(p, 0);  // the first stage: it sends the tied embedding's gradient
    const int64_t n = parameters_on_rank(m, p, 0, 0);
    const CommKind reduce = zero == 0 ? CommKind::dp_all_reduce : CommKind::dp_reduce_scatter;
    const int64_t elems = zero == 0 ? ring_all_reduce_sent(n, 2, 0) : ring_reduce_scatter_sent(n, 2, 0);
    const int64_t tied = 50257 * 768 / (zero >= 2 ? 2 : 1);  // elements of the tied gradient exchange
    std::map<Precision, CommBytes> by_precision;
    for (Precision prec : {Precision::fp32, Precision::bf16, Precision::fp16}) {
      p.precision = prec;
      p.grad_reduce_bf16 = false, p.grads_16bit = false;
      const CommBytes b = bytes_sent_per_step(m, p, pos);
      EXPECT_EQ(b[reduce], (zero == 2 ? 2 : 1) * elems * 4) << to_string(prec) << " zero " << zero;
      if (zero >= 1) {  // the parameter all-gather keeps the precision's element size
        EXPECT_EQ(b[CommKind::dp_all_gather], ring_all_gather_sent(n, 2, 0) * (prec == Precision::fp32 ? 4 : 2));
      }
      const int64_t act = 1024 * 768 * (prec == Precision::fp32 ? 4 : 2);  // boundary messages keep elem
      EXPECT_EQ(b[CommKind::pp_send], 2 * act + tied * 4) << to_string(prec) << " zero " << zero;
      by_precision[prec] = b;
      p.grad_reduce_bf16 = true;
      EXPECT_EQ(bytes_sent_per_step(m, p, pos)[reduce], (zero == 2 ? 2 : 1) * elems * 2) << to_string(prec);
      p.grad_reduce_bf16 = false, p.grads_16bit = true;
      EXPECT_EQ(bytes_sent_per_step(m, p, pos)[reduce], (zero == 2 ? 2 : 1) * elems * 2) << to_string(prec);
      EXPECT_EQ(bytes_sent_per_step(m, p, pos)[CommKind::pp_send], 2 * act + tied * 2) << to_string(prec);
    }
    EXPECT_EQ(by_precision[Precision::fp16].bytes, by_precision[Precision::bf16].bytes) << "zero " << zero;
  }
}

// [train] pipeline_dtype: the stage-to-stage messages have the compute dtype by default (2 bytes
// under bf16/fp16, Megatron-core's pipeline_dtype), 4 bytes with pipeline_fp32; the tied
// embedding's gradient exchange keeps the gradients' dtype (fp32) either way.
TEST(Comm, PipelineMessagesFollowThePipelineDtype) {
  ModelSpec m;
  Plan p;
  p.pp = 2; p.gpus = 2; p.micro_batch = 1; p.global_batch = 4;
  const RankPosition first = rank_position(p, 0);
  const int64_t msgs = 4 * 1024 * 768;  // elements: 4 micro-batches' activations sent forward by stage 0
  const int64_t tied = 50257 * 768 * 4;
  for (Precision prec : {Precision::bf16, Precision::fp16, Precision::fp32}) {
    p.precision = prec;
    p.pipeline_fp32 = false;
    EXPECT_EQ(bytes_sent_per_step(m, p, first)[CommKind::pp_send], msgs * (prec == Precision::fp32 ? 4 : 2) + tied)
        << to_string(prec);
    p.pipeline_fp32 = true;
    EXPECT_EQ(bytes_sent_per_step(m, p, first)[CommKind::pp_send], msgs * 4 + tied) << to_string(prec);
  }
}

// [train] tp_comm_dtype: the tensor-parallel regions' messages have the compute dtype by default,
// 4 bytes with tp_comm_fp32; the cross-entropy statistics (3 fp32 all-reduces of t elements per
// micro-batch on the last stage) and sequence parallelism's weight gradients (fp32, Megatron's
// main_grad) do not follow it.
TEST(Comm, TensorParallelMessagesFollowTheTpCommDtype) {
  ModelSpec m;
  for (bool sp : {false, true}) {
    Plan p;
    p.tp = 2; p.gpus = 2; p.micro_batch = 1; p.global_batch = 1; p.seq_parallel = sp;
    const RankPosition pos = rank_position(p, 0);
    p.precision = Precision::fp32;
    const CommBytes f = bytes_sent_per_step(m, p, pos);
    p.precision = Precision::bf16;
    const CommBytes h = bytes_sent_per_step(m, p, pos);
    p.tp_comm_fp32 = true;
    const CommBytes h32 = bytes_sent_per_step(m, p, pos);
    EXPECT_EQ(h32.bytes, f.bytes) << "sp " << sp;  // fp32 messages: the fp32 plan's bytes, kind by kind
    const int64_t t = 1024;
    const int64_t xent = 3 * ring_all_reduce_sent(t, 2, 0) * 4;  // fp32 at every precision
    int64_t sp_grads = 0;
    if (sp) sp_grads = ring_all_reduce_sent(m.layers * (2 * norm_parameters(m) + (m.bias ? 2 * m.hidden : 0)) + norm_parameters(m), 2, 0) * 4;
    for (CommKind k : {CommKind::tp_reduce_scatter, CommKind::tp_all_gather})
      EXPECT_EQ(2 * h[k], f[k]) << to_string(k) << " sp " << sp;
    EXPECT_EQ(2 * (h[CommKind::tp_all_reduce] - xent - sp_grads), f[CommKind::tp_all_reduce] - xent - sp_grads)
        << "sp " << sp;
    if (!sp) EXPECT_GT(h[CommKind::tp_all_reduce], 0);
    else EXPECT_GT(h[CommKind::tp_all_gather], 0);
  }
}

// The planner's memory counts fp16 as bf16 (the same 16-bit weight copy, fp32 gradients, masters
// and moments: 18 bytes per parameter with AdamW, docs/precision.md "Memory").
TEST(Comm, Fp16MemoryIsBf16s) {
  ModelSpec m;
  Plan p;
  p.dp = 2; p.gpus = 2; p.micro_batch = 1; p.global_batch = 2; p.zero = 1;
  const Device& d = find_device("a100-80g");
  p.precision = Precision::bf16;
  const Memory b = memory_per_device(m, p, d);
  p.precision = Precision::fp16;
  const Memory f = memory_per_device(m, p, d);
  EXPECT_EQ(f.params, b.params);
  EXPECT_EQ(f.grads, b.grads);
  EXPECT_EQ(f.optimizer, b.optimizer);
  EXPECT_EQ(f.activations, b.activations);
  EXPECT_EQ(f.total, b.total);
  EXPECT_EQ(b.params, 2.0 * double(parameters_on_rank(m, p, 0)));
  EXPECT_EQ(b.grads, 4.0 * double(parameters_on_rank(m, p, 0)));
}
