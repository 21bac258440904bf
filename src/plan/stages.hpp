// Pipeline stage splits, shared by the planner (src/plan) and the runtime (src/parallel), so that
// both place the same transformer layers on the same pipeline rank. Pure functions, no MPI.
//
// Stages: with pp pipeline ranks and vp virtual stages (model chunks) per rank there are
// S = pp * vp stages in model order; stage s = chunk * pp + pp_rank (Megatron's interleaving:
// rank r holds chunks r, r + pp, ...). Stage 0 (on pp rank 0) also holds the embedding, stage S-1
// (on pp rank pp-1) the final norm, the LM head and the loss.
//
// `[parallel] layers_per_stage` has one entry per STAGE (pp * vp entries, in stage order); without
// it the split is `balance_stages` over `stage_costs(model)`. A pipeline rank holds the layers of
// its vp stages (`layers_per_pp_rank`).
#pragma once
#include <cstdint>
#include <vector>

#include "job/job.hpp"

namespace exatrain::plan {

struct StageLayers {
  int first = 0, end = 0;  // transformer layers [first, end)
  bool embedding = false;  // stage 0 holds the embedding
  bool head = false;       // stage S-1 holds the final norm + LM head (+ loss)
  double cost = 0;
};

// Cost of each part per token, in forward FLOPs (the backward is about twice each part's forward,
// so the ratio, and with it the split, is the same for the whole step). Device independent on
// purpose: the planner and the runtime must agree without knowing each other's device.
//   layer      2 * (QKV + out-proj + MLP weights) + 4 * seq_len * hidden (attention scores and
//              values, causal mask not discounted) + its element-wise passes, memory bound: two
//              norms (2 hidden each), two residual adds (3 hidden each), the activation (2 ffn)
//   head       2 * hidden * vocab (LM head GEMM) + the fp32 softmax / cross-entropy passes over the
//              logits (3 element passes of vocab, memory bound) + final norm (memory bound)
//   embedding  the lookup is memory bound: read the token's row (hidden) and, with learned
//              positions, the position row, write the sum (hidden); the backward's scatter-add
//              touches the same elements. Its share of a tied embedding's gradient exchange is
//              communication, not compute, and is not counted here.
// Memory-bound work is converted at kFlopsPerElementMoved FLOPs per element: about the balance of
// current accelerators (A100 312 TFLOP/s / 2.0 TB/s = 156 FLOP per byte, MI250X GCD ~120, H100
// ~295; ~2 bytes per element in bf16), so an element moved costs about as long as 200 FLOPs.
constexpr double kFlopsPerElementMoved = 200.0;
struct StageCosts {
  std::vector<double> layer;  // [layers]
  double embedding = 0, head = 0;
};
StageCosts stage_costs(const ModelSpec& model);

// Minimises the most expensive stage (exact DP) given each layer's cost and the embedding and head
// costs; every stage gets at least one layer ("layers 3 < stages 4" otherwise). Among splits with
// the same most expensive stage, the backtrack takes each stage's earliest optimal start, walking
// back from the last stage: later stages tend to be long and the first ones short (GPT-2 124M at
// pp 4: 3, 4, 4, 1), which also suits memory, since under 1F1B the first pipeline ranks keep the
// most micro-batches in flight.
std::vector<StageLayers> balance_stages(const std::vector<double>& layer_cost, double embed_cost,
                                        double head_cost, int stages);
// An explicit layers-per-stage list ([parallel] layers_per_stage, one entry per stage); checks
// count, sum and that every stage has a layer, the errors printing the equation.
std::vector<StageLayers> stages_from_list(const std::vector<double>& layer_cost, double embed_cost,
                                          double head_cost, const std::vector<int64_t>& per_stage,
                                          int stages);

// The split both the planner and the runtime use: the list when given, else balanced by cost.
std::vector<StageLayers> pipeline_stages(const ModelSpec& model, int64_t pp, int64_t vp,
                                         const std::vector<int64_t>& layers_per_stage);

// Transformer layers on each pipeline rank (size pp): the sum over the rank's vp stages of
// pipeline_stages. Memoised per (model shape, pp, vp) when the list is empty (the search asks for
// it for every candidate); throws like pipeline_stages on an impossible split.
std::vector<int64_t> layers_per_pp_rank(const ModelSpec& model, int64_t pp, int64_t vp,
                                        const std::vector<int64_t>& layers_per_stage);

}  // namespace exatrain::plan
