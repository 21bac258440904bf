// The pruned exhaustive search against brute force on small spaces, and plan validation errors
// that print the failing equation.
#include <algorithm>
#include <tuple>

#include <gtest/gtest.h>

#include "catalog/device.hpp"
#include "core/check.hpp"
#include "plan/search.hpp"

using namespace exatrain;
using namespace exatrain::plan;

namespace {
MachineSpec dgx(const std::string& device) {
  MachineSpec mach;
  mach.device = device; mach.gpus_per_node = 8; mach.intra_node_bw_gbs = 300;
  mach.inter_node_bw_gbs = 200; mach.intra_node_latency_us = 3; mach.inter_node_latency_us = 5;
  mach.storage_bw_gbs = 1000;
  return mach;
}
ModelSpec gpt(int64_t l, int64_t h, int64_t a, int64_t s) {
  ModelSpec m;
  m.layers = l; m.hidden = h; m.heads = a; m.kv_heads = a; m.ffn_hidden = 4 * h;
  m.seq_len = s; m.vocab = 50257;
  return m;
}
void expect_same(const SearchResult& fast, const SearchResult& brute) {
  EXPECT_EQ(fast.searched, brute.searched);
  EXPECT_EQ(fast.feasible, brute.feasible);
  ASSERT_EQ(fast.top.size(), brute.top.size());
  for (size_t i = 0; i < fast.top.size(); ++i) {
    EXPECT_EQ(plan_summary(fast.top[i].plan), plan_summary(brute.top[i].plan));
    EXPECT_DOUBLE_EQ(fast.top[i].step_time_s, brute.top[i].step_time_s);
  }
}
}  // namespace

TEST(Search, MatchesBruteForceWhenEverythingFits) {
  ParallelSpec f;
  f.gpus = 16; f.global_batch = 64;
  ModelSpec m = gpt(12, 768, 12, 1024);
  SearchResult fast = search_plans(m, dgx("a100-80g"), f, Precision::bf16, 5);
  SearchResult brute = brute_force_search(m, dgx("a100-80g"), f, Precision::bf16, 5);
  expect_same(fast, brute);
  EXPECT_GT(fast.feasible, 100);
}

TEST(Search, MatchesBruteForceWhenMemoryPrunes) {
  // 13B on 16 A100-40GB: many plans do not fit, so both pruning rules fire.
  ParallelSpec f;
  f.gpus = 16; f.global_batch = 128;
  ModelSpec m = gpt(40, 5120, 40, 2048);
  SearchResult fast = search_plans(m, dgx("a100-40g"), f, Precision::bf16, 5);
  SearchResult brute = brute_force_search(m, dgx("a100-40g"), f, Precision::bf16, 5);
  expect_same(fast, brute);
  EXPECT_LT(fast.evaluated, brute.evaluated);  // pruning skipped work
  EXPECT_LT(fast.feasible, fast.searched);
  for (const auto& c : fast.top) EXPECT_TRUE(c.fits);
}

TEST(Search, FixedFieldsAreRespected) {
  ParallelSpec f;
  f.gpus = 16; f.global_batch = 64; f.tp = 2; f.recompute = Recompute::full;
  SearchResult r = search_plans(gpt(12, 768, 12, 1024), dgx("a100-80g"), f, Precision::bf16, 3);
  ASSERT_FALSE(r.top.empty());
  for (const auto& c : r.top) {
    EXPECT_EQ(c.plan.tp, 2);
    EXPECT_EQ(c.plan.recompute, Recompute::full);
  }
}

TEST(Search, ListedStagesFixVpOrFailWithTheEquation) {
  // 12 layers on pp 2: a list of 4 stages means vp 2 (stage s = chunk * pp + pp_rank).
  ParallelSpec f;
  f.gpus = 16; f.global_batch = 64; f.pp = 2;
  f.layers_per_stage = {2, 3, 3, 4};
  SearchResult r = search_plans(gpt(12, 768, 12, 1024), dgx("a100-80g"), f, Precision::bf16, 3);
  ASSERT_FALSE(r.top.empty());
  for (const auto& c : r.top) {
    EXPECT_EQ(c.plan.vp, 2);
    EXPECT_EQ(c.plan.layers_per_stage, f.layers_per_stage);
  }
  auto message = [&](const ParallelSpec& spec) {
    try {
      search_plans(gpt(12, 768, 12, 1024), dgx("a100-80g"), spec, Precision::bf16, 3);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  f.vp = 3;  // pp * vp = 6 stages, but 4 listed: an error, not an empty search
  EXPECT_NE(message(f).find("[parallel] layers_per_stage has 4 entries, expected pp * vp = 2 * 3 = 6"),
            std::string::npos) << message(f);
  f.vp.reset();
  f.layers_per_stage = {6, 5};
  EXPECT_NE(message(f).find("[parallel] layers_per_stage sums to 11 but the model has layers = 12"),
            std::string::npos) << message(f);
}

// The optimizer's sharding rule is a plan rule: predict and plan refuse what train would.
TEST(PlanRules, WholeEntryOptimizersRefuseZeroStagesThatCutEntries) {
  ModelSpec m = gpt(12, 768, 12, 1024);
  for (const char* o : {"muon", "lamb", "adafactor", "shampoo", "kfac"}) {
    Plan p;
    TrainSpec t;
    t.optimizer = o;
    p.set_optimizer(t);
    p.gpus = 4; p.dp = 4; p.global_batch = 16; p.zero = 2;
    EXPECT_EQ(plan_error(m, p), fmt::format("zero = 2 with optimizer = \"{}\" at dp = 4: {} needs every parameter "
                                            "tensor whole on one rank and ZeRO 2 shards tensors across the dp ranks; "
                                            "expected zero = 0 or 1", o, o));
    p.zero = 1;
    EXPECT_EQ(plan_error(m, p), "") << o;
    p.zero = 3; p.dp = 1; p.gpus = 1;  // nothing is sharded over one replica
    EXPECT_EQ(plan_error(m, p), "") << o;
    p.cp = 2; p.gpus = 2;  // ZeRO shards over the dp x cp replicas
    EXPECT_EQ(plan_error(m, p), fmt::format("zero = 3 with optimizer = \"{}\" at dp = 1 x cp = 2: {} needs every "
                                            "parameter tensor whole on one rank and ZeRO 3 shards tensors across the "
                                            "dp ranks; expected zero = 0 or 1", o, o));
  }
  for (const char* o : {"adamw", "sgd", "lion"}) {  // elementwise: any ZeRO stage
    Plan p;
    TrainSpec t;
    t.optimizer = o;
    p.set_optimizer(t);
    p.gpus = 4; p.dp = 4; p.global_batch = 16; p.zero = 3;
    EXPECT_EQ(plan_error(m, p), "") << o;
  }
}

// K-FAC's gradient workers: a whole divisor of the dp x cp replicas under ZeRO 0; only 1 under ZeRO 1.
TEST(PlanRules, KfacGradWorkerFractionDividesTheReplicas) {
  ModelSpec m = gpt(12, 768, 12, 1024);
  Plan p;
  TrainSpec t;
  t.optimizer = "kfac";
  auto with = [&](double f, int64_t dp, int64_t zero) {
    t.kfac.grad_worker_fraction = f;
    p.set_optimizer(t);
    p.gpus = dp, p.dp = dp, p.global_batch = 4 * dp, p.zero = zero;
    return plan_error(m, p);
  };
  EXPECT_EQ(with(1.0, 8, 0), "");
  EXPECT_EQ(with(0.125, 8, 0), "");  // MEM-OPT
  EXPECT_EQ(with(0.5, 8, 0), "");    // HYBRID-OPT: groups of 4
  EXPECT_EQ(with(0.3, 8, 0), "grad_worker_fraction = 0.3 x dp = 8 = 2.4 gradient workers per layer: expected a whole "
                             "number that divides 8");
  EXPECT_EQ(with(0.375, 8, 0), "grad_worker_fraction = 0.375 x dp = 8 = 3 gradient workers per layer: expected a whole "
                               "number that divides 8");
  EXPECT_EQ(with(1.0, 8, 1), "");
  EXPECT_EQ(with(0.5, 8, 1), "grad_worker_fraction = 0.5 with zero = 1: under ZeRO >= 1 every layer has one owner "
                             "among the dp = 8 replicas; expected grad_worker_fraction = 1 or zero = 0");
  EXPECT_EQ(with(0.5, 1, 1), "");  // one replica: nothing to distribute
  EXPECT_EQ(with(0.5, 1, 0), "");
}

TEST(PlanRules, ErrorsPrintTheEquation) {
  ModelSpec m = gpt(96, 12288, 96, 2048);
  Plan p;
  p.gpus = 80; p.tp = 5; p.pp = 4; p.dp = 4; p.global_batch = 64;
  EXPECT_EQ(plan_error(m, p), "tp must divide heads: heads % tp = 96 % 5 = 1, expected 0");
  p.tp = 8; p.gpus = 100;
  EXPECT_EQ(plan_error(m, p), "gpus = tp * pp * dp * cp: 8 * 4 * 4 * 1 = 128, but gpus = 100");
  p.gpus = 128;
  p.global_batch = 62;
  EXPECT_EQ(plan_error(m, p), "global_batch must be divisible by dp * micro_batch: 62 % (4 * 1) = "
                              "2, expected 0");
  p.global_batch = 8;
  EXPECT_EQ(plan_error(m, p), "micro-batches >= pp: global_batch / (dp * micro_batch) = 8 / (4 * 1) = "
                              "2 < pp = 4");
  p.global_batch = 64; p.pp = 4; p.vp = 5;
  // Without a list the default split is balanced by cost (plan/stages.hpp): 20 stages of 96 layers
  // need not be even; 4 * 25 = 100 stages cannot each hold a layer.
  EXPECT_EQ(plan_error(m, p), "");
  p.vp = 25;
  EXPECT_EQ(plan_error(m, p), "every virtual stage needs a layer: pp * vp = 4 * 25 = 100 > layers = 96");
  EXPECT_THROW(check_plan(m, p), Error);
  p.vp = 2;
  p.layers_per_stage = {11, 13, 13, 11, 12, 12, 12, 12};  // one entry per virtual stage (pp * vp)
  EXPECT_EQ(plan_error(m, p), "");
  p.layers_per_stage = {23, 25, 25, 23};  // per pipeline rank: the old meaning, rejected
  EXPECT_EQ(plan_error(m, p), "layers_per_stage has 4 entries, expected pp * vp = 4 * 2 = 8 (one per "
                              "virtual stage, stage s = chunk * pp + pp_rank)");
  p.layers_per_stage = {11, 13, 13, 11, 12, 12, 12, 11};
  EXPECT_EQ(plan_error(m, p), "sum(layers_per_stage) = 95 must equal layers = 96");
}

// An independent reference: every integer tuple in range, filtered only by plan_error and the
// device's memory, with the search's stated equivalences collapsed (ZeRO > 0 without replicas is
// ZeRO 0; GPipe and 1F1B are the same schedule without a pipeline; sequence parallelism at tp 1 is
// none).
TEST(Search, MatchesIndependentEnumeration) {
  ModelSpec m;
  m.layers = 4; m.hidden = 256; m.heads = 4; m.kv_heads = 4; m.ffn_hidden = 1024;
  m.seq_len = 128; m.vocab = 1000;
  MachineSpec mach = dgx("a100-40g");
  const int64_t G = 8, B = 16;
  const Device& dev = find_device(mach.device);
  std::vector<std::tuple<double, double, std::string>> all;  // step, memory, plan
  for (int64_t tp = 1; tp <= G; ++tp)
    for (int64_t pp = 1; pp <= G; ++pp)
      for (int64_t dp = 1; dp <= G; ++dp)
        for (int64_t cp = 1; cp <= G; ++cp) {
          if (tp * pp * dp * cp != G) continue;
          for (int64_t vp = 1; vp <= m.layers; ++vp)
            for (int64_t zero = 0; zero <= 3; ++zero)
              for (int64_t mb = 1; mb <= B; ++mb)
                for (Recompute rc : {Recompute::none, Recompute::selective, Recompute::full})
                  for (bool sp : {false, true})
                    for (Schedule sc : {Schedule::gpipe, Schedule::one_f_one_b}) {
                      if (zero > 0 && dp * cp == 1) continue;
                      if (pp == 1 && sc == Schedule::gpipe) continue;
                      if (tp == 1 && sp) continue;  // sequence parallelism at tp 1: a no-op (resolve_plan)
                      Plan p;
                      p.gpus = G; p.tp = tp; p.pp = pp; p.dp = dp; p.cp = cp; p.vp = vp;
                      p.zero = zero; p.micro_batch = mb; p.global_batch = B; p.recompute = rc;
                      p.seq_parallel = sp; p.schedule = sc; p.precision = Precision::bf16;
                      if (!plan_error(m, p).empty()) continue;
                      Prediction pr = predict(m, mach, p);
                      if (pr.memory.total > dev.hbm_gib * double(1 << 30)) continue;
                      all.push_back({pr.step_time_s, pr.memory.total, plan_summary(p)});
                    }
        }
  ParallelSpec f;
  f.gpus = G; f.global_batch = B;
  SearchResult r = search_plans(m, mach, f, Precision::bf16, 3);
  EXPECT_EQ(r.feasible, int64_t(all.size()));
  std::sort(all.begin(), all.end());
  ASSERT_EQ(r.top.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_DOUBLE_EQ(r.top[i].step_time_s, std::get<0>(all[i])) << std::get<2>(all[i]);
  // The winner: the fastest, and of equally fast plans the leanest (search.cpp's ranking; the
  // enumeration order that breaks what remains differs between the two, so any of those).
  EXPECT_DOUBLE_EQ(r.top[0].memory.total, std::get<1>(all[0]));
  bool among_best = false;
  for (const auto& [step, memory, name] : all)
    if (step == std::get<0>(all[0]) && memory == std::get<1>(all[0])) among_best |= name == plan_summary(r.top[0].plan);
  EXPECT_TRUE(among_best) << plan_summary(r.top[0].plan);
}

TEST(Search, MemoryHeadroomIsKeptFree) {
  // 13B on 16 A100-40GB: with 10% headroom every listed plan leaves 10% of the device free, and
  // fewer plans are feasible than with none.
  ParallelSpec f;
  f.gpus = 16; f.global_batch = 128;
  ModelSpec m = gpt(40, 5120, 40, 2048);
  SearchResult none = search_plans(m, dgx("a100-40g"), f, Precision::bf16, 5);
  SearchResult ten = search_plans(m, dgx("a100-40g"), f, Precision::bf16, 5,
                                  default_calibration(), 0.10);
  ASSERT_FALSE(ten.top.empty());
  EXPECT_LT(ten.feasible, none.feasible);
  double capacity = find_device("a100-40g").hbm_gib * double(1 << 30);
  for (const auto& c : ten.top) EXPECT_LE(c.memory.total, 0.9 * capacity);
  EXPECT_THROW(search_plans(m, dgx("a100-40g"), f, Precision::bf16, 5, default_calibration(), 1.0),
               Error);
}

TEST(Search, ExactTiesRankTheSameWhateverTopK) {
  // ZeRO 1 and 2 predict the same time when there is one micro-batch per step (same traffic), so
  // exact ties exist; the ranking is a total order (time, then enumeration order), so the best k
  // are the first k of the best 40 for every k, and `plan --top 2` and `--top 3` name one winner.
  ParallelSpec f;
  f.gpus = 16;
  f.global_batch = 32;
  const ModelSpec m = gpt(12, 768, 12, 1024);
  const SearchResult all = search_plans(m, dgx("a100-80g"), f, Precision::bf16, 40);
  ASSERT_EQ(all.top.size(), 40u);
  int ties = 0;
  for (size_t i = 1; i < all.top.size(); ++i) ties += all.top[i].step_time_s == all.top[i - 1].step_time_s;
  ASSERT_GT(ties, 0) << "the space needs an exact tie for this test to mean anything";
  for (int k = 1; k <= 12; ++k) {
    const SearchResult r = search_plans(m, dgx("a100-80g"), f, Precision::bf16, k);
    ASSERT_EQ(r.top.size(), size_t(k));
    for (int i = 0; i < k; ++i) EXPECT_EQ(plan_summary(r.top[size_t(i)].plan), plan_summary(all.top[size_t(i)].plan)) << "k " << k;
  }
}
