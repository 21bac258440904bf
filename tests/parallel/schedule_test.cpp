// Pipeline action tables and stage balancing (pure functions, simulated execution).
#include <gtest/gtest.h>

#include <limits>
#include <numeric>

#include "core/check.hpp"
#include "parallel/schedule.hpp"
#include "plan/memory.hpp"
#include "../test_util/error_of.hpp"

using namespace exatrain;
using namespace exatrain::parallel;

static std::vector<PipelinePlan> plans() {
  std::vector<PipelinePlan> out;
  for (int pp : {1, 2, 3, 4, 8})
    for (int m : {pp, pp + 1, 2 * pp, 3 * pp + 1}) {
      out.push_back({PipeSchedule::gpipe, pp, 1, m});
      out.push_back({PipeSchedule::one_f_one_b, pp, 1, m});
      if (pp > 1 && m % pp == 0)
        for (int vp : {2, 3, 4}) out.push_back({PipeSchedule::interleaved, pp, vp, m});
    }
  return out;
}

static std::string name(const PipelinePlan& p) {
  return fmt::format("{} pp{} vp{} m{}", to_string(p.schedule), p.pp, p.vp, p.micro_batches);
}

TEST(Pipeline, TablesRunWithoutDeadlockAndMatchTheFormulas) {
  for (const PipelinePlan& p : plans()) {
    PipelineTable t = build_pipeline(p);
    // The simulator throws on backward-before-forward, unmatched send/receive, wrong peer,
    // missing or repeated units, and deadlock.
    for (auto [tf, tb] : {std::pair{1.0, 1.0}, std::pair{1.0, 2.0}}) {
      SimResult sim = simulate_pipeline(t, tf, tb);
      for (int r = 0; r < p.pp; r++)
        EXPECT_EQ(sim.peak_in_flight[r], expected_peak_in_flight(p, r)) << name(p) << " rank " << r;
      EXPECT_NEAR(sim.bubble_fraction, expected_bubble_fraction(p), 1e-12)
            << name(p) << " tf " << tf << " tb " << tb;
    }
  }
}

TEST(Pipeline, PeakInFlightFormulasAreTheTextbookOnes) {
  // 1F1B: stage r keeps pp - r micro-batches (rank 0 holds pp); GPipe holds all m.
  PipelinePlan a{PipeSchedule::one_f_one_b, 4, 1, 8};
  EXPECT_EQ(expected_peak_in_flight(a, 0), 4);
  EXPECT_EQ(expected_peak_in_flight(a, 3), 1);
  PipelinePlan g{PipeSchedule::gpipe, 4, 1, 8};
  EXPECT_EQ(expected_peak_in_flight(g, 0), 8);
  // Interleaved (Megatron): rank 0 of pp 4, vp 2 warms up 2*3 + 1*4 = 10 units, holds 11.
  PipelinePlan i{PipeSchedule::interleaved, 4, 2, 8};
  EXPECT_EQ(expected_peak_in_flight(i, 0), 11);
  EXPECT_DOUBLE_EQ(expected_bubble_fraction(i), 3.0 / 16);
  EXPECT_DOUBLE_EQ(expected_bubble_fraction(a), 3.0 / 8);
}

TEST(Pipeline, MemoryModelHoldsWhatTheScheduleHolds) {
  // plan/memory.cpp counts each rank's activations with microbatches_in_flight (in whole-rank
  // micro-batches); the runtime's schedule holds expected_peak_in_flight units of one chunk each.
  for (const PipelinePlan& pl : plans()) {
    plan::Plan p;
    p.pp = pl.pp, p.vp = pl.vp, p.dp = 1, p.micro_batch = 1, p.global_batch = pl.micro_batches;
    p.schedule = pl.schedule == PipeSchedule::gpipe ? Schedule::gpipe : Schedule::one_f_one_b;
    for (int r = 0; r < pl.pp; r++)
      EXPECT_DOUBLE_EQ(plan::microbatches_in_flight(p, r) * pl.vp, expected_peak_in_flight(pl, r)) << name(pl) << " rank " << r;
  }
}

TEST(Pipeline, PhasesAreOrderedAndSteadyAlternates) {
  PipelinePlan p{PipeSchedule::one_f_one_b, 4, 1, 8};
  PipelineTable t = build_pipeline(p);
  for (int r = 0; r < p.pp; r++) {
    std::vector<Action> compute;
    for (const Action& a : t.ranks[r])
      if (is_compute(a.kind)) compute.push_back(a);
    int w = p.pp - r - 1;
    for (int k = 0; k < w; k++) {
      EXPECT_EQ(compute[k].kind, ActionKind::forward);
      EXPECT_EQ(compute[k].phase, Phase::warmup);
    }
    for (int k = w; k < w + 2 * (p.micro_batches - w); k++) {
      EXPECT_EQ(compute[k].phase, Phase::steady);
      EXPECT_EQ(compute[k].kind, (k - w) % 2 == 0 ? ActionKind::forward : ActionKind::backward);
    }
    for (size_t k = w + 2 * (p.micro_batches - w); k < compute.size(); k++) {
      EXPECT_EQ(compute[k].phase, Phase::cooldown);
      EXPECT_EQ(compute[k].kind, ActionKind::backward);
    }
  }
  // Last stage: no warm-up, strict F B F B ...; first compute on rank 0 needs no receive.
  EXPECT_EQ(t.ranks[0][0].kind, ActionKind::forward);
}

TEST(Pipeline, InvalidPlansNameTheEquation) {
  EXPECT_NE(error_of([] { build_pipeline({PipeSchedule::one_f_one_b, 4, 1, 2}); })
                .find("micro_batches 2 < pp 4"),
            std::string::npos);
  EXPECT_NE(error_of([] { build_pipeline({PipeSchedule::interleaved, 4, 2, 6}); })
                .find("micro_batches 6 % pp 4 = 2"),
            std::string::npos);
  EXPECT_NE(error_of([] { build_pipeline({PipeSchedule::gpipe, 2, 2, 4}); })
                .find("vp must be 1, got vp 2"),
            std::string::npos);
  EXPECT_NE(error_of([] { build_pipeline({PipeSchedule::interleaved, 1, 2, 4}); })
                .find("needs pp > 1"),
            std::string::npos);
}

TEST(Pipeline, SimulatorCatchesBrokenTables) {
  PipelineTable t = build_pipeline({PipeSchedule::one_f_one_b, 2, 1, 2});
  // Drop rank 0's first SendAct: rank 1 waits forever.
  PipelineTable dead = t;
  for (size_t i = 0; i < dead.ranks[0].size(); i++)
    if (dead.ranks[0][i].kind == ActionKind::send_act) {
      dead.ranks[0].erase(dead.ranks[0].begin() + i);
      break;
    }
  EXPECT_NE(error_of([&] { simulate_pipeline(dead, 1, 2); }).find("rank 1 waits at action 1 Forward(mb 0, chunk 0)"),
            std::string::npos);
  // Move a backward before its forward on the last rank.
  PipelineTable early = t;
  auto& acts = early.ranks[1];
  size_t f = 0, b = 0;
  for (size_t i = 0; i < acts.size(); i++) {
    if (acts[i].kind == ActionKind::forward && acts[i].mb == 0 && !f) f = i + 1;
    if (acts[i].kind == ActionKind::backward && acts[i].mb == 0) b = i;
  }
  std::swap(acts[f - 1], acts[b]);
  EXPECT_NE(error_of([&] { simulate_pipeline(early, 1, 2); }).find("before its Forward"),
            std::string::npos);
}

TEST(StageBalance, CountsEmbeddingAndHeadAndMinimisesTheMax) {
  // 8 equal layers of cost 1, embedding 1, head 3 over 4 stages: the first stage takes fewer
  // layers because of the embedding, the last fewer because of the head.
  std::vector<double> layers(8, 1.0);
  auto st = balance_stages(layers, 1.0, 3.0, 4);
  ASSERT_EQ(st.size(), 4u);
  EXPECT_TRUE(st[0].embedding && st[3].head);
  EXPECT_EQ(st[0].first, 0);
  EXPECT_EQ(st[3].end, 8);
  for (int s = 1; s < 4; s++) EXPECT_EQ(st[s].first, st[s - 1].end);
  double worst = 0;
  for (auto& s : st) worst = std::max(worst, s.cost);
  // Total 12 over 4 stages: 3 is a lower bound; last stage = head 3 + >= 1 layer = 4 is forced.
  EXPECT_DOUBLE_EQ(worst, 4.0);
  EXPECT_EQ(st[3].end - st[3].first, 1);
  // Brute force over all splits of 8 layers into 4 non-empty ranges agrees on the optimum.
  double brute = 1e9;
  for (int a = 1; a < 8; a++)
    for (int b = a + 1; b < 8; b++)
      for (int c = b + 1; c < 8; c++)
        brute = std::min(brute, std::max({1.0 + a, 1.0 * (b - a), 1.0 * (c - b), 3.0 + (8 - c)}));
  EXPECT_DOUBLE_EQ(worst, brute);
}

// The O(S n^2) DP that balance_stages replaced by binary searches (the scan over every start j,
// the first optimum kept): the same bounds on random costs, with ties (small integers) and zeros.
std::vector<int> scan_dp_bounds(const std::vector<double>& c, double e, double h, int S) {
  const int n = int(c.size());
  std::vector<double> pre(n + 1, 0);
  for (int i = 0; i < n; i++) pre[i + 1] = pre[i] + c[i];
  auto cost = [&](int s, int j, int i) { return pre[i] - pre[j] + (s == 0 ? e : 0) + (s == S - 1 ? h : 0); };
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(S, std::vector<double>(n + 1, inf));
  std::vector<std::vector<int>> from(S, std::vector<int>(n + 1, 0));
  for (int i = 1; i <= n; i++) best[0][i] = cost(0, 0, i);
  for (int s = 1; s < S; s++)
    for (int i = s + 1; i <= n; i++)
      for (int j = s; j < i; j++) {
        const double v = std::max(best[s - 1][j], cost(s, j, i));
        if (v < best[s][i]) best[s][i] = v, from[s][i] = j;
      }
  std::vector<int> b(S + 1);
  b[S] = n;
  for (int s = S - 1; s >= 1; s--) b[s] = from[s][b[s + 1]];
  return b;
}

TEST(StageBalance, BinarySearchedDpEqualsTheFullScan) {
  uint64_t x = 12345;
  auto next = [&] { return x = x * 6364136223846793005ULL + 1442695040888963407ULL, int((x >> 33) % 1000); };
  for (int trial = 0; trial < 400; trial++) {
    const int n = 1 + next() % 40, S = 1 + next() % n, kind = trial % 3;
    std::vector<double> c(static_cast<size_t>(n));
    for (double& v : c) v = kind == 0 ? next() % 4 : kind == 1 ? 1.0 : next() / 7.0;  // ties, equal, distinct
    const double e = next() % 5, h = next() % 9;
    const std::vector<StageLayers> st = balance_stages(c, e, h, S);
    const std::vector<int> want = scan_dp_bounds(c, e, h, S);
    for (int s = 0; s < S; s++)
      ASSERT_EQ(st[size_t(s)].first, want[size_t(s)]) << "trial " << trial << " n " << n << " S " << S << " stage " << s;
  }
  // Large enough that the scan took seconds (9216 layers over 24 stages, found by fuzz/csv_fuzz.cpp).
  const std::vector<StageLayers> big = balance_stages(std::vector<double>(9216, 1.0), 3.0, 7.0, 24);
  EXPECT_EQ(big.back().end, 9216);
  EXPECT_NE(error_of([&] { balance_stages(std::vector<double>(100000, 1.0), 0, 0, 1000); })
                .find("give [parallel] layers_per_stage instead"),
            std::string::npos);
}

TEST(StageBalance, ExplicitListIsChecked) {
  std::vector<double> layers(6, 1.0);
  auto st = stages_from_list(layers, 0.5, 0.5, {1, 2, 3}, 3);
  EXPECT_EQ(st[1].first, 1);
  EXPECT_EQ(st[1].end, 3);
  EXPECT_DOUBLE_EQ(st[2].cost, 3.5);
  EXPECT_NE(error_of([&] { stages_from_list(layers, 0, 0, {1, 2, 2}, 3); })
                .find("layers_per_stage sums to 5 but the model has layers = 6"),
            std::string::npos);
  EXPECT_NE(error_of([&] { stages_from_list(layers, 0, 0, {3, 3}, 3); }).find("has 2 entries"),
            std::string::npos);
  EXPECT_NE(error_of([&] { balance_stages(layers, 0, 0, 8); }).find("layers 6 < stages 8"),
            std::string::npos);
}

TEST(Pipeline, TimelineOfTheSmallest1F1B) {
  // Worked by hand: rank 1 runs F0 at t=1 (after rank 0's F0), B0 at 2..4; rank 0's B0 waits for
  // that gradient (4..6); rank 1's F1 waits for rank 0's F1 (done at 2) but runs after its own
  // B0, at 4; B1 5..7; rank 0's B1 7..9. Makespan 9, busy 6: bubble 0.5 = (pp-1)/m.
  PipelineTable t = build_pipeline({PipeSchedule::one_f_one_b, 2, 1, 2});
  SimResult sim = simulate_pipeline(t, 1, 2);
  EXPECT_EQ(render_timeline(t, sim),
            "rank 0 | F0 F1 .  .  B0 B0 .  B1 B1\n"
            "rank 1 | .  F0 B0 B0 F1 B1 B1 .  .\n");
  EXPECT_DOUBLE_EQ(sim.makespan, 9);
  EXPECT_DOUBLE_EQ(sim.bubble_fraction, 0.5);
}
