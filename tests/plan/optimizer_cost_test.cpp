// The optimizer step's cost (plan/optimizer_cost.hpp): hand-computed FLOP counts per method, the
// entries adding up to the rank's parameters, the split over the dp replicas under ZeRO 1 and 0,
// and predict's optimizer term and the search's choice following it.
#include <cmath>

#include <gtest/gtest.h>

#include "catalog/device.hpp"
#include "plan/flops.hpp"
#include "plan/memory.hpp"
#include "plan/optimizer_cost.hpp"
#include "plan/predict.hpp"
#include "plan/search.hpp"

using namespace exatrain;
using namespace exatrain::plan;

namespace {
// GPT-2 small: 12 layers x 768, vocab 50257, tied embeddings, learned positions, biases.
Plan gpt2_plan(const std::string& optimizer, int64_t dp, int64_t zero) {
  Plan p;
  p.gpus = dp; p.dp = dp; p.zero = zero; p.micro_batch = 8; p.global_batch = 8 * dp;
  p.precision = Precision::bf16;
  TrainSpec t;
  t.optimizer = optimizer;
  p.set_optimizer(t);
  return p;
}
}  // namespace

// The FLOPs of one step on a [4, 8] matrix, by hand (a multiply-add = 2 FLOPs):
//  Muon, 5 steps, a = 4, b = 8: 5 (4 a^2 b + 2 a^3) = 5 (4*16*8 + 2*64) = 5 * 640 = 3200, either
//    orientation (the short side's Gram matrix).
//  Shampoo, blocks of 4, roots every 2 steps: two [4, 4] blocks, each 4 (r^2 c + r c^2) =
//    4 (64 + 64) = 512 per step plus 11 (r^3 + c^3) / 2 = 11 * 128 / 2 = 704: 2 * 1216 = 2432.
//  Shampoo on [6, 8], blocks of 4, every step: blocks [4, 4] x 2 (512 + 11 * 128 = 1920 each) and
//    [2, 4] x 2 (4 (16 + 32) + 11 (8 + 64) = 192 + 792 = 984 each): 3840 + 1968 = 5808.
//  SOAP, both sides rotated, every 10 steps: 6 (m^2 n + m n^2) = 6 (128 + 256) = 2304 per step,
//    ((14/3)(m^3 + n^3) + 4 (m^2 n + m n^2)) / 10 = ((14/3) 576 + 4 * 384) / 10 = (2688 + 1536) / 10
//    = 422.4: 2726.4. With max_dim 6 the 8-side is not rotated: 6 * 128 + ((14/3) 64 + 4 * 128) / 10
//    = 768 + 81.0667 = 849.0667.
// A machine of the catalog's A100-80GB, the other fields at their defaults.
MachineSpec a100_machine() {
  MachineSpec m;
  m.device = "a100-80g";
  return m;
}

TEST(OptimizerCost, FlopsOfASmallMatrixByHand) {
  EXPECT_DOUBLE_EQ(muon_flops(4, 8, 5), 3200);
  EXPECT_DOUBLE_EQ(muon_flops(8, 4, 5), 3200);
  EXPECT_DOUBLE_EQ(muon_flops(4, 8, 1), 640);
  EXPECT_DOUBLE_EQ(shampoo_flops(4, 8, 4, 2), 2432);
  EXPECT_DOUBLE_EQ(shampoo_flops(6, 8, 4, 1), 5808);
  EXPECT_DOUBLE_EQ(soap_flops(4, 8, 10000, 10), 2726.4);
  EXPECT_NEAR(soap_flops(4, 8, 6, 10), 768 + (14.0 / 3 * 64 + 512) / 10, 1e-9);
  EXPECT_NEAR(soap_flops(4, 8, 6, 10), 849.0667, 1e-4);
}

// The entry classes are the layout's entries: their elements are parameters_on_rank's.
TEST(OptimizerCost, EntriesAddUpToTheRanksParameters) {
  ModelSpec gpt2;
  Plan p = gpt2_plan("adamw", 1, 0);
  ModelSpec llama;  // SwiGLU, RMSNorm, RoPE, grouped-query attention, no biases, untied head
  llama.layers = 8; llama.hidden = 512; llama.heads = 8; llama.kv_heads = 4; llama.ffn_hidden = 1376;
  llama.vocab = 32000; llama.activation = Activation::swiglu; llama.norm = Norm::rmsnorm;
  llama.position = Position::rope; llama.bias = false; llama.tie_embeddings = false;
  Plan q = p;
  q.tp = 2; q.pp = 2; q.gpus = 4;
  for (const auto& [m, plan] : {std::pair{gpt2, p}, std::pair{llama, q}, std::pair{gpt2, q}})
    for (int64_t r = 0; r < plan.pp; ++r) {
      double n = 0;
      for (const EntryClass& e : entry_classes(m, plan, r)) n += e.elements();
      EXPECT_EQ(n, double(parameters_on_rank(m, plan, r))) << "pp rank " << r << " tp " << plan.tp;
    }
}

// GPT-2 small on one A100, mixed precision. Muon's matrices: 12 layers x (q, k, v, o [768, 768]
// and fc1 [3072, 768], fc2 [768, 3072]); muon_flops(768, 768, 5) = 5 (4 + 2) 768^3.
TEST(OptimizerCost, MatrixOptimizersAddToAdamWsTerm) {
  const ModelSpec m;
  const Device& d = find_device("a100-80g");
  const Calibration& c = default_calibration();
  const double mm = muon_flops(768, 768, 5), fc = muon_flops(3072, 768, 5);
  EXPECT_DOUBLE_EQ(mm, 30.0 * 768 * 768 * 768);
  EXPECT_DOUBLE_EQ(optimizer_step_cost(m, gpt2_plan("muon", 1, 0), d, c, 0).matrix_flops, 12 * (4 * mm + 2 * fc));
  // AdamW: 32 bytes per parameter, no matrix work (the term predict has always had).
  const Plan adamw = gpt2_plan("adamw", 1, 0);
  const OptimizerCost a = optimizer_step_cost(m, adamw, d, c, 0);
  EXPECT_DOUBLE_EQ(a.matrix_s, 0);
  EXPECT_DOUBLE_EQ(a.elementwise_s, 32.0 * double(total_parameters(m)) / (d.hbm_bw_gbs * 1e9 * d.bw_efficiency));
  const double adamw_term = predict(m, a100_machine(), adamw).breakdown.optimizer;
  EXPECT_DOUBLE_EQ(adamw_term, a.seconds());
  for (const char* o : {"muon", "shampoo", "soap"}) {
    const Prediction pr = predict(m, a100_machine(), gpt2_plan(o, 1, 0));
    EXPECT_GT(pr.optimizer_step.matrix_s, 0) << o;
    EXPECT_GT(pr.breakdown.optimizer, 2 * adamw_term) << o;
    EXPECT_DOUBLE_EQ(pr.breakdown.optimizer, pr.optimizer_step.elementwise_s + pr.optimizer_step.matrix_s) << o;
  }
  // SGD and Lion keep one buffer: 24 bytes per parameter instead of 32.
  EXPECT_DOUBLE_EQ(optimizer_step_cost(m, gpt2_plan("sgd", 1, 0), d, c, 0).elementwise_s, 0.75 * a.elementwise_s);
}

// ZeRO 1 spreads the update over the replicas (each entry whole on one owner for Muon), ZeRO 0
// repeats it on each. GPT-2 small's largest entry is the embedding wte [50257, 768]: 32 bytes per
// element, more than a quarter of the model's elementwise bytes, so at dp 4 its owner is the slowest;
// its largest matrix is fc1 (muon_flops(3072, 768, 5) = 40.8 GFLOP), more than 1/64 of the 1.63
// TFLOP total, so at dp 64 its owner's Newton-Schulz sets the matrix time.
TEST(OptimizerCost, ZeroOneSplitsTheStepOverTheReplicas) {
  const ModelSpec m;
  const Device& d = find_device("a100-80g");
  const Calibration& c = default_calibration();
  const double bw = d.hbm_bw_gbs * 1e9 * d.bw_efficiency;
  const OptimizerCost z0 = optimizer_step_cost(m, gpt2_plan("muon", 4, 0), d, c, 0);
  const OptimizerCost z1 = optimizer_step_cost(m, gpt2_plan("muon", 4, 1), d, c, 0);
  EXPECT_DOUBLE_EQ(z0.matrix_s, optimizer_step_cost(m, gpt2_plan("muon", 1, 0), d, c, 0).matrix_s);
  EXPECT_DOUBLE_EQ(z1.matrix_s, z0.matrix_s / 4);
  EXPECT_DOUBLE_EQ(z1.matrix_flops, z0.matrix_flops / 4);
  EXPECT_DOUBLE_EQ(z1.elementwise_s, 32.0 * 50257 * 768 / bw);  // wte's owner
  EXPECT_GT(z1.elementwise_s, z0.elementwise_s / 4);
  const OptimizerCost z64 = optimizer_step_cost(m, gpt2_plan("muon", 64, 1), d, c, 0);
  EXPECT_DOUBLE_EQ(z64.matrix_flops, muon_flops(3072, 768, 5));
  EXPECT_GT(z64.matrix_s, z0.matrix_s / 64);
  // AdamW is elementwise: an even split whatever the entries.
  const OptimizerCost a0 = optimizer_step_cost(m, gpt2_plan("adamw", 4, 0), d, c, 0);
  const OptimizerCost a1 = optimizer_step_cost(m, gpt2_plan("adamw", 4, 1), d, c, 0);
  EXPECT_DOUBLE_EQ(a1.elementwise_s, a0.elementwise_s / 4);
}

// Tensor parallelism: each tp rank orthogonalises its own shards (optim/muon.hpp). At tp 4:
// q, k, v [192, 768] and o [768, 192] (muon_flops(192, 768, 5) each), fc1 [768, 768] and fc2
// [768, 768] (muon_flops(768, 768, 5) each).
TEST(OptimizerCost, EachTensorParallelRankWorksOnItsShards) {
  ModelSpec m;
  Plan p = gpt2_plan("muon", 1, 0);
  p.tp = 4; p.gpus = 4;
  const Device& d = find_device("a100-80g");
  const double q = muon_flops(192, 768, 5), fc1 = muon_flops(768, 768, 5);
  EXPECT_DOUBLE_EQ(optimizer_step_cost(m, p, d, default_calibration(), 0).matrix_flops, 12 * (4 * q + 2 * fc1));
}

// The optimizer term changes which plan is faster. GPT-2 small on 8 A100s: with AdamW, dp 8 beats
// tp 2 x dp 4 (no tensor-parallel communication); with Shampoo under ZeRO 1 the owner of the
// largest entry, wte [50257, 768] (50 blocks of [1024, 768]: 4 (1024^2 768 + 1024 768^2) = 5.6
// GFLOP each per step, ~0.28 TFLOP), is the slowest replica, and tp 2 halves that entry's shard, so
// tp 2 x dp 4 wins. The search follows, and never offers Shampoo ZeRO 2/3 (it cuts entries).
TEST(OptimizerCost, TheOptimizersTermChangesWhichPlanIsFaster) {
  ModelSpec m;
  MachineSpec mach;
  mach.device = "a100-80g"; mach.gpus_per_node = 8; mach.intra_node_bw_gbs = 300;
  auto step = [&](const std::string& o, int64_t tp) {
    Plan p = gpt2_plan(o, 8 / tp, 1);
    p.tp = tp; p.gpus = 8; p.global_batch = 64; p.micro_batch = 8 * tp; p.seq_parallel = tp > 1;
    return predict(m, mach, p).step_time_s;
  };
  EXPECT_LT(step("adamw", 1), step("adamw", 2));
  EXPECT_LT(step("shampoo", 2), step("shampoo", 1));
  ParallelSpec f;
  f.gpus = 8; f.global_batch = 64; f.pp = 1; f.cp = 1; f.recompute = Recompute::none;
  TrainSpec t;
  t.precision = Precision::bf16;
  t.optimizer = "adamw";
  const SearchResult adamw = search_plans(m, mach, f, t, 4);
  t.optimizer = "shampoo";
  const SearchResult shampoo = search_plans(m, mach, f, t, 4);
  ASSERT_FALSE(adamw.top.empty());
  ASSERT_FALSE(shampoo.top.empty());
  EXPECT_EQ(adamw.top.front().plan.tp, 1);
  EXPECT_EQ(shampoo.top.front().plan.tp, 2);
  EXPECT_EQ(shampoo.top.front().plan.optimizer, "shampoo");
  for (const Prediction& pr : shampoo.top) EXPECT_LE(pr.plan.zero, 1);
}

// A mixed order (MixedSpec: [optimizer] others) costs the matrix optimizer on the layers'
// matrices only and the first-order one's bytes elsewhere: SOAP on GPT-2's matrices with SGD on
// the embeddings (the largest 2-D entry, wte [50257, 768], which plain SOAP rotates on its short
// side) does less matrix work than plain SOAP and, on the embeddings, SGD's 24 bytes per element.
TEST(OptimizerCost, AMixedOrderCostsTheFirstOrderOptimizerOffTheMatrices) {
  const ModelSpec m;
  const Device& d = find_device("a100-80g");
  const Calibration& c = default_calibration();
  Plan mixed = gpt2_plan("soap", 1, 0);
  TrainSpec t;
  t.optimizer = "soap", t.mixed.others = "sgd";
  mixed.set_optimizer(t);
  EXPECT_EQ(mixed.optimizer_knobs.others, "sgd");
  const Plan soap = gpt2_plan("soap", 1, 0);
  double matrix_only = 0;
  for (const EntryClass& e : entry_classes(m, soap, 0)) {
    if (e.layer_matrix) {
      EXPECT_DOUBLE_EQ(entry_matrix_flops(mixed, e), entry_matrix_flops(soap, e));
      EXPECT_DOUBLE_EQ(elementwise_bytes_per_element(mixed, e, c), elementwise_bytes_per_element(soap, e, c));
      matrix_only += entry_matrix_flops(soap, e) * double(e.count);
    } else {
      EXPECT_DOUBLE_EQ(entry_matrix_flops(mixed, e), 0);
      EXPECT_DOUBLE_EQ(elementwise_bytes_per_element(mixed, e, c), 24);  // SGD's: one buffer
    }
  }
  const OptimizerCost a = optimizer_step_cost(m, mixed, d, c, 0), b = optimizer_step_cost(m, soap, d, c, 0);
  EXPECT_DOUBLE_EQ(a.matrix_flops, matrix_only);
  EXPECT_LT(a.matrix_flops, b.matrix_flops);
}

// K-FAC (optim/kfac.hpp) on a [4, 8] matrix (out 4, in 8) with 16 tokens, factors every 2 steps,
// eigendecompositions every 5: statistics 2 * 16 * (64 + 16) / 2 = 1280, eigen 9 (512 + 64) / 5 =
// 1036.8, preconditioning 4 (16 * 8 + 4 * 64) = 1536.
TEST(OptimizerCost, KfacFlopsAndBytesByHand) {
  const KfacFlops f = kfac_flops(4, 8, 16, 2, 5);
  EXPECT_DOUBLE_EQ(f.statistics, 1280);
  EXPECT_DOUBLE_EQ(f.eigen, 1036.8);
  EXPECT_DOUBLE_EQ(f.precondition, 1536);
  // GPT-2 small at dp 4: per layer q, k, v, o [768, 768], fc1 [3072, 768], fc2 [768, 3072]:
  // statistics 4 * 2 * 768^2 + 2 * (768^2 + 3072^2) floats, every 10 steps (the default).
  const ModelSpec m;
  Plan p = gpt2_plan("kfac", 4, 0);
  const double stats = 12 * (8.0 * 768 * 768 + 2.0 * (768.0 * 768 + 3072.0 * 3072));
  EXPECT_DOUBLE_EQ(kfac_bytes(m, p, 0).all_reduce, 4 * stats / 10);
  // COMM-OPT (fraction 1): each eigenbasis to the 3 other replicas every 100 steps (the default),
  // per matrix in^2 + in + out^2 + out floats; spread over the 4 replicas.
  const double eigen = 12 * (4 * 2 * (768.0 * 768 + 768) + 2 * (768.0 * 768 + 768 + 3072.0 * 3072 + 3072));
  EXPECT_DOUBLE_EQ(kfac_bytes(m, p, 0).sent, 4 * 3 * eigen / 100 / 4);
  TrainSpec t;
  t.optimizer = "kfac";
  t.kfac.grad_worker_fraction = 0.25;  // MEM-OPT: P to the 3 others every step
  p.set_optimizer(t);
  const double numel = 12 * (4.0 * 768 * 768 + 2.0 * 768 * 3072);
  EXPECT_DOUBLE_EQ(kfac_bytes(m, p, 0).sent, 4 * 3 * numel / 4);
  EXPECT_DOUBLE_EQ(kfac_bytes(m, gpt2_plan("kfac", 4, 1), 0).sent, 0);  // ZeRO 1: the all-gather is ZeRO's
  EXPECT_DOUBLE_EQ(kfac_bytes(m, gpt2_plan("adamw", 4, 0), 0).all_reduce, 0);
}

// K-FAC's matrix work per replica: the statistics on every replica, the eigendecompositions spread
// over them, the preconditioning on grad_worker_fraction of them (ZeRO 0) or the owner (ZeRO 1);
// predict adds its communication to the optimizer term.
TEST(OptimizerCost, KfacSpreadsItsWorkAsItsWorkersDo) {
  const ModelSpec m;
  const Device& d = find_device("a100-80g");
  const Calibration& c = default_calibration();
  const OptimizerCost one = optimizer_step_cost(m, gpt2_plan("kfac", 1, 0), d, c, 0);
  Plan comm = gpt2_plan("kfac", 4, 0), mem = comm;
  TrainSpec t;
  t.optimizer = "kfac";
  t.kfac.grad_worker_fraction = 0.25;
  mem.set_optimizer(t);
  const OptimizerCost c4 = optimizer_step_cost(m, comm, d, c, 0), m4 = optimizer_step_cost(m, mem, d, c, 0);
  EXPECT_GT(one.matrix_s, 0);
  EXPECT_LT(c4.matrix_s, one.matrix_s);  // the eigendecompositions are spread
  EXPECT_LT(m4.matrix_s, c4.matrix_s);   // and so is the preconditioning at MEM-OPT
  const MachineSpec mach = find_cluster("selene");
  const Prediction pc = predict(m, mach, comm, c), pm = predict(m, mach, mem, c);
  EXPECT_GT(pc.optimizer_step.comm_s, 0);
  EXPECT_GT(pm.optimizer_step.comm_s, pc.optimizer_step.comm_s);  // P moves every step at MEM-OPT
  EXPECT_DOUBLE_EQ(pc.breakdown.optimizer, pc.optimizer_step.elementwise_s + pc.optimizer_step.matrix_s +
                                               pc.optimizer_step.comm_s);
}
