// The pipeline split shared by the planner and the runtime (plan/stages.hpp): the cost model's
// numbers for GPT-2 124M worked out by hand, the default split they give, the meaning of
// layers_per_stage (one entry per virtual stage) and the validation errors with their equation.
#include <gtest/gtest.h>

#include "plan/plan.hpp"
#include "plan/stages.hpp"

using namespace exatrain;

namespace {

ModelSpec gpt2_124m() {
  ModelSpec m;  // gelu, layernorm, learned positions, tied, biases (the ModelSpec defaults)
  m.layers = 12, m.hidden = 768, m.heads = 12, m.kv_heads = 12, m.ffn_hidden = 3072, m.seq_len = 1024;
  m.vocab = 50257;
  return m;
}

plan::Plan pipeline(int64_t pp, int64_t vp, std::vector<int64_t> list = {}) {
  plan::Plan p;
  p.pp = pp, p.vp = vp, p.gpus = pp, p.global_batch = 8, p.micro_batch = 1;
  p.layers_per_stage = std::move(list);
  return p;
}

}  // namespace

TEST(Stages, Gpt2CostsByHand) {
  const plan::StageCosts c = plan::stage_costs(gpt2_124m());
  ASSERT_EQ(c.layer.size(), 12u);
  // layer: 2 (768*2304 + 768*768 + 2*768*3072) + 4*1024*768 = 14,155,776 + 3,145,728 FLOPs;
  // element-wise 10*768 + 2*3072 = 13,824 elements at 200 FLOPs each = 2,764,800.
  EXPECT_DOUBLE_EQ(c.layer[0], 14155776.0 + 3145728.0 + 2764800.0);
  // head: 2*768*50257 = 77,194,752 FLOPs + (3*50257 + 2*768) elements * 200 = 30,461,400.
  EXPECT_DOUBLE_EQ(c.head, 77194752.0 + 30461400.0);
  // embedding: token row + position row + output = 3*768 elements * 200.
  EXPECT_DOUBLE_EQ(c.embedding, 460800.0);
}

TEST(Stages, Gpt2DefaultSplitCountsTheHead) {
  // pp 2: 9 layers + embedding = 181.06 MFLOP vs 3 layers + head = 167.86; 8 + 4 would leave
  // 187.92 on the last stage. So the default split is 9 + 3, in the planner as in the runtime.
  const ModelSpec m = gpt2_124m();
  const std::vector<plan::StageLayers> st = plan::pipeline_stages(m, 2, 1, {});
  ASSERT_EQ(st.size(), 2u);
  EXPECT_EQ(st[0].end, 9);
  EXPECT_TRUE(st[0].embedding && !st[0].head && st[1].head);
  EXPECT_EQ(plan::layers_per_rank(m, pipeline(2, 1)), (std::vector<int64_t>{9, 3}));
  // pp 4: the head stage (1 layer + head = 128 MFLOP) sets the pace whatever the others hold; among
  // the splits with that maximum the DP keeps the earliest boundaries: 3, 4, 4, 1.
  EXPECT_EQ(plan::layers_per_rank(m, pipeline(4, 1)), (std::vector<int64_t>{3, 4, 4, 1}));
  // pp 4 x vp 2: stages 1, 1, 1, 2 | 2, 2, 2, 1 (the last one with the head); rank r holds stages
  // r and r + 4, so 3 layers each.
  std::vector<int64_t> per_stage;
  for (const plan::StageLayers& st : plan::pipeline_stages(m, 4, 2, {})) per_stage.push_back(st.end - st.first);
  EXPECT_EQ(per_stage, (std::vector<int64_t>{1, 1, 1, 2, 2, 2, 2, 1}));
  EXPECT_EQ(plan::layers_per_rank(m, pipeline(4, 2)), (std::vector<int64_t>{3, 3, 3, 3}));
}

TEST(Stages, ListHasOneEntryPerVirtualStage) {
  ModelSpec m = gpt2_124m();
  // pp 2, vp 2: stages 0..3 live on pp ranks 0, 1, 0, 1 (stage s = chunk * pp + pp_rank).
  const plan::Plan p = pipeline(2, 2, {1, 2, 3, 6});
  EXPECT_EQ(plan::plan_error(m, p), "");
  EXPECT_EQ(plan::layers_per_rank(m, p), (std::vector<int64_t>{4, 8}));
  EXPECT_EQ(plan::layers_on_rank(m, p, 1), 8);
  // The old per-rank meaning (pp entries) is rejected with the equation.
  EXPECT_EQ(plan::plan_error(m, pipeline(2, 2, {6, 6})),
            "layers_per_stage has 2 entries, expected pp * vp = 2 * 2 = 4 (one per virtual stage, "
            "stage s = chunk * pp + pp_rank)");
  EXPECT_EQ(plan::plan_error(m, pipeline(2, 2, {6, 0, 3, 3})),
            "layers_per_stage[1] = 0: every virtual stage needs >= 1 layer");
  EXPECT_EQ(plan::plan_error(m, pipeline(2, 2, {1, 2, 3, 5})), "sum(layers_per_stage) = 11 must equal layers = 12");
  // Without a list any pp * vp up to the layers is valid (the default split need not be even)...
  EXPECT_EQ(plan::plan_error(m, pipeline(5, 1)), "");
  EXPECT_EQ(plan::layers_per_rank(m, pipeline(5, 1)).size(), 5u);
  // ...but every virtual stage needs a layer.
  m.layers = 6;
  EXPECT_EQ(plan::plan_error(m, pipeline(4, 2)), "every virtual stage needs a layer: pp * vp = 4 * 2 = 8 > layers = 6");
}
