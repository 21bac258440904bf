#include "plan/stages.hpp"

#include <algorithm>
#include <limits>
#include <map>
#include <tuple>

#include "core/check.hpp"

namespace exatrain::plan {

StageCosts stage_costs(const ModelSpec& m) {
  const double h = double(m.hidden), kv = double(m.kv_heads * m.head_dim()), f = double(m.ffn_hidden);
  const double mlp = (m.activation == Activation::swiglu ? 3.0 : 2.0) * h * f;
  const double layer_flops = 2.0 * (h * (h + 2.0 * kv) + h * h + mlp) + 4.0 * double(m.seq_len) * h;
  const double layer_elems = 2 * 2 * h + 2 * 3 * h + 2 * f;  // norms, residual adds, activation
  StageCosts c;
  c.layer.assign(size_t(m.layers), layer_flops + kFlopsPerElementMoved * layer_elems);
  const double embed_elems = (m.position == Position::learned ? 3.0 : 2.0) * h;
  c.embedding = kFlopsPerElementMoved * embed_elems;
  const double head_elems = 3.0 * double(m.vocab) + 2.0 * h;  // softmax / loss passes, final norm
  c.head = 2.0 * h * double(m.vocab) + kFlopsPerElementMoved * head_elems;
  return c;
}

static std::vector<StageLayers> describe(const std::vector<double>& layer_cost, double embed_cost,
                                         double head_cost, const std::vector<int>& bounds) {
  int S = static_cast<int>(bounds.size()) - 1;
  std::vector<StageLayers> out(S);
  for (int s = 0; s < S; s++) {
    StageLayers& st = out[s];
    st.first = bounds[s];
    st.end = bounds[s + 1];
    st.embedding = s == 0;
    st.head = s == S - 1;
    for (int i = st.first; i < st.end; i++) st.cost += layer_cost[i];
    if (st.embedding) st.cost += embed_cost;
    if (st.head) st.cost += head_cost;
  }
  return out;
}

namespace {

// The earliest j in [lo, hi) minimising max(f[j], g(j)), and that minimum in *value: f is
// non-decreasing in j (more layers on the earlier stages never cost less) and g non-increasing
// (fewer on this one), both exactly so in floating point (prefix sums of non-negative costs, and
// rounding is monotone). So max(f, g) falls (as g) until f reaches g and rises (as f) after: with
// k the first j where f[j] >= g(j), the minimum is g(k - 1) or f[k], and the earliest j reaching a
// minimum g(k - 1) is the first where g(j) <= it. Two binary searches instead of the O(n) scan the
// DP would make, with the scan's result (the first optimum) -- O(S n log n) in all.
template <class G>
int best_start(const std::vector<double>& f, G&& g, int lo, int hi, double* value) {
  int a = lo, b = hi;  // k in [lo, hi]: the first j with f[j] >= g(j) (hi when none)
  while (a < b) {
    const int m = a + (b - a) / 2;
    if (f[size_t(m)] >= g(m)) b = m; else a = m + 1;
  }
  const int k = a;
  const double at_k = k < hi ? f[size_t(k)] : std::numeric_limits<double>::infinity();
  if (k == lo || at_k < g(k - 1)) {
    *value = at_k;
    return k;
  }
  const double v = g(k - 1);  // reached first where g(j) <= v (g falls until k - 1)
  a = lo, b = k - 1;
  while (a < b) {
    const int m = a + (b - a) / 2;
    if (g(m) <= v) b = m; else a = m + 1;
  }
  *value = v;
  return a;
}

}  // namespace

std::vector<StageLayers> balance_stages(const std::vector<double>& layer_cost, double embed_cost,
                                        double head_cost, int stages) {
  int n = static_cast<int>(layer_cost.size());
  EXA_CHECK(stages >= 1, "pipeline needs >= 1 stage, got {}", stages);
  EXA_CHECK(n >= stages,
            "[parallel] every pipeline stage needs at least one layer: layers {} < stages {} "
            "(pp * vp)",
            n, stages);
  EXA_CHECK(int64_t(stages) * (n + 1) <= (int64_t(1) << 26),
            "[parallel] balancing {} layers over {} pipeline stages needs a table of {} x {} entries (over 2^26): "
            "give [parallel] layers_per_stage instead", n, stages, stages, n + 1);
  std::vector<double> prefix(n + 1, 0);
  for (int i = 0; i < n; i++) prefix[i + 1] = prefix[i] + layer_cost[i];
  auto cost = [&](int s, int j, int i) {  // stage s holds layers [j, i)
    return prefix[i] - prefix[j] + (s == 0 ? embed_cost : 0) + (s == stages - 1 ? head_cost : 0);
  };
  const double inf = std::numeric_limits<double>::infinity();
  // prev[i] / best[i]: smallest max-stage cost placing layers [0, i) on stages 0..s-1 / 0..s;
  // from[s][i]: start of stage s's range in that optimum (the earliest optimal start).
  std::vector<double> prev(n + 1, inf), best(n + 1, inf);
  std::vector<std::vector<int>> from(stages, std::vector<int>(n + 1, 0));
  for (int i = 1; i <= n; i++) prev[i] = cost(0, 0, i);
  for (int s = 1; s < stages; s++) {
    std::fill(best.begin(), best.end(), inf);
    for (int i = s + 1; i <= n; i++) from[s][i] = best_start(prev, [&](int j) { return cost(s, j, i); }, s, i, &best[i]);
    std::swap(prev, best);
  }
  std::vector<int> bounds(stages + 1);
  bounds[stages] = n;
  for (int s = stages - 1; s >= 1; s--) bounds[s] = from[s][bounds[s + 1]];
  bounds[0] = 0;
  return describe(layer_cost, embed_cost, head_cost, bounds);
}

std::vector<StageLayers> stages_from_list(const std::vector<double>& layer_cost, double embed_cost,
                                          double head_cost, const std::vector<int64_t>& per_stage,
                                          int stages) {
  int n = static_cast<int>(layer_cost.size());
  EXA_CHECK(static_cast<int>(per_stage.size()) == stages,
            "[parallel] layers_per_stage has {} entries but the pipeline has pp * vp = {} stages "
            "(one entry per virtual stage, stage s = chunk * pp + pp_rank)",
            per_stage.size(), stages);
  int64_t sum = 0;
  std::vector<int> bounds{0};
  for (size_t s = 0; s < per_stage.size(); s++) {
    EXA_CHECK(per_stage[s] >= 1, "[parallel] layers_per_stage[{}] = {}: every stage needs >= 1 layer",
              s, per_stage[s]);
    sum += per_stage[s];
    bounds.push_back(static_cast<int>(sum));
  }
  EXA_CHECK(sum == n, "[parallel] layers_per_stage sums to {} but the model has layers = {}", sum, n);
  return describe(layer_cost, embed_cost, head_cost, bounds);
}

std::vector<StageLayers> pipeline_stages(const ModelSpec& m, int64_t pp, int64_t vp,
                                         const std::vector<int64_t>& layers_per_stage) {
  const StageCosts c = stage_costs(m);
  const int S = int(pp * vp);
  return layers_per_stage.empty() ? balance_stages(c.layer, c.embedding, c.head, S)
                                  : stages_from_list(c.layer, c.embedding, c.head, layers_per_stage, S);
}

static std::vector<int64_t> sum_per_rank(const std::vector<StageLayers>& stages, int64_t pp) {
  std::vector<int64_t> out(size_t(pp), 0);
  for (size_t s = 0; s < stages.size(); s++) out[s % size_t(pp)] += stages[s].end - stages[s].first;
  return out;
}

std::vector<int64_t> layers_per_pp_rank(const ModelSpec& m, int64_t pp, int64_t vp,
                                        const std::vector<int64_t>& layers_per_stage) {
  if (!layers_per_stage.empty()) return sum_per_rank(pipeline_stages(m, pp, vp, layers_per_stage), pp);
  // Every field stage_costs reads, and the split's shape.
  using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, int, int64_t, int64_t>;
  const Key key{m.layers, m.hidden, m.kv_heads, m.head_dim(), m.ffn_hidden, m.seq_len, m.vocab,
                int(m.activation), int(m.position), pp, vp};
  thread_local std::map<Key, std::vector<int64_t>> memo;
  auto it = memo.find(key);
  if (it != memo.end()) return it->second;
  std::vector<int64_t> out = sum_per_rank(pipeline_stages(m, pp, vp, {}), pp);
  memo.emplace(key, out);
  return out;
}

}  // namespace exatrain::plan
