// The planner's per-rank parameter count equals the floats of the runtime model's arena, for every
// architecture the model supports (gelu/swiglu, layernorm/rmsnorm, learned/rope, multi-head/GQA,
// tied/untied, with and without biases), tp 1/2/4 with even and odd vocabularies, and pipeline
// splits (even, uneven, interleaved; listed, and the default cost-balanced split the runtime builds).
// Memory, ZeRO shards and the dp byte counts all use this count.
#include <gtest/gtest.h>

#include <algorithm>

#include <fmt/format.h>

#include "backend/backend.hpp"
#include "model/gpt.hpp"
#include "plan/flops.hpp"
#include "plan/memory.hpp"
#include "plan/stages.hpp"

using namespace exatrain;

namespace {

struct Split {
  int64_t pp, vp;
  std::vector<int64_t> per_stage;  // pp * vp entries, stage s = chunk * pp + pp_rank
};

// Floats of the runtime's arenas on the rank at (pp_rank, tp_rank): one Gpt per virtual stage.
int64_t runtime_params(Backend& be, const ModelSpec& m, const Split& s, int64_t pp_rank, int tp, int tp_rank) {
  NoParallelHooks hooks;  // construction only: no collective runs
  const int64_t stages = s.pp * s.vp;
  int64_t total = 0;
  for (int64_t c = 0; c < s.vp; c++) {
    const int64_t stage = c * s.pp + pp_rank;
    int64_t first = 0;
    for (int64_t i = 0; i < stage; i++) first += s.per_stage[size_t(i)];
    GptOptions o;
    o.model = m;
    o.tp = TensorParallel{tp_rank, tp, false};
    o.stage = StageRange{first, first + s.per_stage[size_t(stage)], stage == 0, stage == stages - 1};
    Gpt g(be, o, &hooks);
    total += g.layout().total();
  }
  return total;
}

}  // namespace

TEST(Params, PlannerCountEqualsRuntimeArenaOnEveryRank) {
  auto be = make_cpu_backend(1);
  const std::vector<Split> splits = {
      {1, 1, {6}}, {2, 1, {3, 3}}, {3, 1, {1, 3, 2}}, {2, 2, {1, 2, 2, 1}}};
  int checked = 0;
  for (int arch = 0; arch < 32; arch++)
    for (int64_t kv : {4, 2})
      for (int64_t vocab : {61, 64})
        for (int tp : {1, 2, 4}) {
          if (kv % tp != 0) continue;  // the runtime splits kv heads (no replication)
          ModelSpec m;
          m.layers = 6, m.hidden = 32, m.heads = 4, m.kv_heads = kv, m.ffn_hidden = 48, m.seq_len = 8;
          m.vocab = vocab;
          m.activation = arch & 1 ? Activation::swiglu : Activation::gelu;
          m.norm = arch & 2 ? Norm::rmsnorm : Norm::layernorm;
          m.position = arch & 4 ? Position::rope : Position::learned;
          m.tie_embeddings = !(arch & 8);
          m.bias = !(arch & 16);
          for (const Split& s : splits) {
            plan::Plan p;  // the same list as the runtime: one entry per virtual stage
            p.tp = tp, p.pp = s.pp, p.vp = s.vp, p.gpus = tp * s.pp, p.layers_per_stage = s.per_stage;
            for (int64_t r = 0; r < s.pp; r++)
              for (int t = 0; t < tp; t++) {
                const int64_t want = runtime_params(*be, m, s, r, tp, t);
                ASSERT_EQ(plan::parameters_on_rank(m, p, r, t), want)
                    << fmt::format("arch {} ({}, {}, {}, tie {}, bias {}) kv {} vocab {} tp {} pp {} vp {} at "
                                   "pp_rank {} tp_rank {}",
                                   arch, to_string(m.activation), to_string(m.norm), to_string(m.position),
                                   m.tie_embeddings, m.bias, kv, vocab, tp, s.pp, s.vp, r, t);
                ++checked;
              }
          }
          // The whole tp = 1, pp = 1 model is total_parameters.
          if (tp == 1) {
            plan::Plan one;
            EXPECT_EQ(plan::total_parameters(m), plan::parameters_on_rank(m, one, 0, 0));
          }
        }
  EXPECT_GT(checked, 3000);
}

TEST(Params, OddVocabularySlicesGiveTheLastTpRankFewerRows) {
  // vocab 61 at tp 4: slices of ceil(61/4) = 16 rows, the last 61 - 48 = 13 (no padding).
  ModelSpec m;
  m.layers = 2, m.hidden = 32, m.heads = 4, m.kv_heads = 4, m.ffn_hidden = 64, m.seq_len = 8, m.vocab = 61;
  plan::Plan p;
  p.tp = 4, p.gpus = 4;
  EXPECT_EQ(plan::parameters_on_rank(m, p, 0, 0) - plan::parameters_on_rank(m, p, 0, 3), (16 - 13) * 32);
  EXPECT_EQ(plan::parameters_on_rank(m, p, 0, 1), plan::parameters_on_rank(m, p, 0, 0));
}

// Without layers_per_stage: the planner's layers and parameters on every pipeline rank equal the
// arenas of the Gpt stages the runtime builds from plan::pipeline_stages (what the Trainer
// calls), for models whose LM head is light (vocab 61: even splits) or heavy (vocab 1024: the last
// stage gets fewer layers), pp 2-4 and vp 1-2.
TEST(Params, DefaultSplitPlannerEqualsRuntimeStages) {
  auto be = make_cpu_backend(1);
  int checked = 0, uneven = 0;
  for (int arch = 0; arch < 4; arch++)
    for (int64_t layers : {6, 7})
      for (int64_t vocab : {61, 1024})
        for (int tp : {1, 2})
          for (int64_t pp : {2, 3, 4})
            for (int64_t vp : {1, 2}) {
              if (pp * vp > layers) continue;
              ModelSpec m;
              m.layers = layers, m.hidden = 32, m.heads = 4, m.kv_heads = 2, m.ffn_hidden = 48, m.seq_len = 8;
              m.vocab = vocab;
              m.activation = arch & 1 ? Activation::swiglu : Activation::gelu;
              m.position = arch & 2 ? Position::rope : Position::learned;
              m.tie_embeddings = !(arch & 2);
              Split s{pp, vp, {}};
              for (const plan::StageLayers& st : plan::pipeline_stages(m, pp, vp, {}))
                s.per_stage.push_back(st.end - st.first);
              plan::Plan p;  // no list: the planner's default split
              p.tp = tp, p.pp = pp, p.vp = vp, p.gpus = tp * pp, p.global_batch = 12;  // 12 micro-batches
              ASSERT_EQ(plan::plan_error(m, p), "") << fmt::format("layers {} pp {} vp {}", layers, pp, vp);
              const std::vector<int64_t> planned = plan::layers_per_rank(m, p);
              std::vector<int64_t> built(size_t(pp), 0);
              for (size_t st = 0; st < s.per_stage.size(); st++) built[st % size_t(pp)] += s.per_stage[st];
              const std::string what = fmt::format("arch {} layers {} vocab {} tp {} pp {} vp {} stages [{}]", arch,
                                                   layers, vocab, tp, pp, vp, fmt::join(s.per_stage, ","));
              ASSERT_EQ(planned, built) << what;
              uneven += *std::max_element(built.begin(), built.end()) != *std::min_element(built.begin(), built.end());
              for (int64_t r = 0; r < pp; r++)
                for (int t = 0; t < tp; t++) {
                  ASSERT_EQ(plan::parameters_on_rank(m, p, r, t), runtime_params(*be, m, s, r, tp, t))
                      << what << fmt::format(" at pp_rank {} tp_rank {}", r, t);
                  ++checked;
                }
            }
  EXPECT_GT(checked, 400);
  EXPECT_GT(uneven, 40);  // the grid exercises uneven default splits, not only even ones
}
