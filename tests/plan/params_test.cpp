// The planner's per-rank parameter count equals the floats of the runtime model's arena, for every
// architecture the model supports (gelu/swiglu, layernorm/rmsnorm, learned/rope, multi-head/GQA,
// tied/untied, with and without biases), tp 1/2/4 with even and odd vocabularies, and pipeline
// splits (even, uneven, interleaved). Memory, ZeRO shards and the dp byte counts all use this count.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include "backend/backend.hpp"
#include "model/gpt.hpp"
#include "plan/flops.hpp"
#include "plan/memory.hpp"

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
            plan::Plan p;
            p.tp = tp, p.pp = s.pp, p.vp = s.vp, p.gpus = tp * s.pp;
            for (int64_t r = 0; r < s.pp; r++) {  // the planner's list: layers per pipeline rank
              int64_t n = 0;
              for (int64_t c = 0; c < s.vp; c++) n += s.per_stage[size_t(c * s.pp + r)];
              p.layers_per_stage.push_back(n);
            }
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
