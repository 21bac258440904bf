// The mixed-order optimizer (optim/mixed.hpp) routes by role and by step: the matrix optimizer on
// the layers' matrices and the first-order one elsewhere give, bit for bit, what each gives alone
// on those entries; a schedule runs the first-order one everywhere first, then the matrix one from
// its own step 1 on the weights it finds. The job's keys build it (make_optimizer).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "backend/backend.hpp"
#include "optim/optimizer.hpp"

using namespace exatrain;

namespace {

// q [4, 3] (matrix), ln [3] (norm), wte [5, 3] (embedding: 2-D, but not a layer's matrix).
ParamLayout layout() {
  ParamLayout l;
  auto add = [&](const char* name, std::vector<int64_t> shape, ParamRole role) {
    ParamInfo p;
    p.name = name, p.global_shape = shape, p.shard_shape = shape, p.role = role, p.decay = role != ParamRole::norm;
    l.add(p);
  };
  add("h.0.attn.q_proj.weight", {4, 3}, ParamRole::matrix);
  add("h.0.ln_1.weight", {3}, ParamRole::norm);
  add("wte.weight", {5, 3}, ParamRole::embedding);
  return l;
}

// One optimizer on its own arena: init weights, then steps with given (step, gradient seed).
struct OneOptimizer {
  OneOptimizer(Backend& be, const ParamLayout& l, const TrainSpec& t, const std::vector<float>& w0)
      : be(be), opt(make_optimizer(be, t)), params(be, l.total()), grads(be, l.total()),
        regions{{&l, 0, l.total(), params.data(), grads.data()}} {
    be.upload(params.data(), w0.data(), sizeof(float) * w0.size());
    opt->init_state(regions);
  }
  void step(int64_t step, int seed) {
    std::vector<float> g(static_cast<size_t>(regions[0].size()));
    for (size_t i = 0; i < g.size(); i++) g[i] = float(std::sin(0.7 * double(i) + 1.3 * seed));
    be.upload(grads.data(), g.data(), sizeof(float) * g.size());
    opt->step(regions, OptimStep{step, 0.01f, seed == 2 ? 0.5f : 1.0f});
  }
  std::vector<float> weights(const ParamInfo& p) const {
    std::vector<float> h(static_cast<size_t>(p.numel));
    be.download(h.data(), params.data() + p.offset, sizeof(float) * h.size());
    return h;
  }
  std::vector<float> all() const {
    std::vector<float> h(static_cast<size_t>(regions[0].size()));
    be.download(h.data(), params.data(), sizeof(float) * h.size());
    return h;
  }
  Backend& be;
  std::unique_ptr<Optimizer> opt;
  DeviceBuffer params, grads;
  std::vector<ParamRegion> regions;
};

TrainSpec spec(const char* optimizer, const char* others = "", int64_t first_order_steps = 0) {
  TrainSpec t;
  t.optimizer = optimizer, t.mixed.others = others, t.mixed.first_order_steps = first_order_steps;
  t.soap.precondition_frequency = 2;
  return t;
}

std::vector<float> initial(const ParamLayout& l) {
  std::vector<float> w(static_cast<size_t>(l.total()));
  for (size_t i = 0; i < w.size(); i++) w[i] = float(std::cos(0.4 * double(i)));
  return w;
}

}  // namespace

TEST(MixedOrder, MatricesGetTheMatrixOptimizerAndTheRestTheFirstOrderOne) {
  std::unique_ptr<Backend> be = make_backend("cpu", 1);
  const ParamLayout l = layout();
  const std::vector<float> w0 = initial(l);
  OneOptimizer mixed(*be, l, spec("soap", "sgd"), w0), soap(*be, l, spec("soap"), w0), sgd(*be, l, spec("sgd"), w0);
  EXPECT_STREQ(mixed.opt->name(), "soap+sgd");
  for (int s = 1; s <= 5; s++)
    for (OneOptimizer* r : {&mixed, &soap, &sgd}) r->step(s, s);
  const ParamInfo &q = l.entries()[0], &ln = l.entries()[1], &wte = l.entries()[2];
  EXPECT_EQ(mixed.weights(q), soap.weights(q));
  EXPECT_EQ(mixed.weights(ln), sgd.weights(ln));
  EXPECT_EQ(mixed.weights(wte), sgd.weights(wte));  // SOAP alone would rotate the embedding
  EXPECT_NE(soap.weights(wte), sgd.weights(wte));
  // State: SOAP's for the matrix only, SGD's momentum (as an entry state) for the others.
  std::vector<std::string> names;
  for (const EntryStateTensor& t : mixed.opt->entry_state_tensors()) names.push_back(t.entry->name + ":" + t.spec.name);
  EXPECT_EQ(names, (std::vector<std::string>{"h.0.attn.q_proj.weight:exp_avg", "h.0.attn.q_proj.weight:exp_avg_sq",
                                             "h.0.attn.q_proj.weight:soap_GG_L", "h.0.attn.q_proj.weight:soap_Q_L",
                                             "h.0.attn.q_proj.weight:soap_GG_R", "h.0.attn.q_proj.weight:soap_Q_R",
                                             "h.0.ln_1.weight:sgd_momentum_buffer", "wte.weight:sgd_momentum_buffer"}));
  EXPECT_EQ(mixed.opt->state_bytes(), int64_t(sizeof(float)) * (2 * 12 + 2 * 16 + 2 * 9 + 3 + 15));
}

TEST(MixedOrder, AScheduleRunsFirstOrderEverywhereThenTheMatrixOptimizerFromItsStepOne) {
  std::unique_ptr<Backend> be = make_backend("cpu", 1);
  const ParamLayout l = layout();
  const std::vector<float> w0 = initial(l);
  OneOptimizer mixed(*be, l, spec("muon", "", 2), w0), adamw(*be, l, spec("adamw"), w0);
  EXPECT_STREQ(mixed.opt->name(), "muon+adamw");  // others defaults to adamw
  for (int s = 1; s <= 2; s++) mixed.step(s, s), adamw.step(s, s);
  EXPECT_EQ(mixed.all(), adamw.all());
  OneOptimizer muon(*be, l, spec("muon"), adamw.all());  // Muon from here, its own step 1
  for (int s = 3; s <= 4; s++) mixed.step(s, s), adamw.step(s, s), muon.step(s - 2, s);
  const ParamInfo &q = l.entries()[0], &ln = l.entries()[1];
  EXPECT_EQ(mixed.weights(q), muon.weights(q));
  EXPECT_NE(mixed.weights(q), adamw.weights(q));
  EXPECT_EQ(mixed.weights(ln), adamw.weights(ln));  // AdamW's moments on the rest, never reset
  std::vector<std::string> q_states;
  for (const EntryStateTensor& t : mixed.opt->entry_state_tensors())
    if (t.entry == &q) q_states.push_back(t.spec.name);
  EXPECT_EQ(q_states, (std::vector<std::string>{"adamw_exp_avg", "adamw_exp_avg_sq", "momentum_buffer"}));
}

// The same with SOAP, whose step count matters (its step 1 builds the bases and leaves the
// weights; its bias corrections and refreshes count from there): after 2 AdamW steps the
// matrices equal a fresh SOAP's started at its step 1 on the weights at the switch.
TEST(MixedOrder, AfterTheSwitchSoapCountsItsOwnSteps) {
  std::unique_ptr<Backend> be = make_backend("cpu", 1);
  const ParamLayout l = layout();
  const std::vector<float> w0 = initial(l);
  OneOptimizer mixed(*be, l, spec("soap", "adamw", 2), w0), adamw(*be, l, spec("adamw"), w0);
  for (int s = 1; s <= 2; s++) mixed.step(s, s), adamw.step(s, s);
  const ParamInfo& q = l.entries()[0];
  const std::vector<float> at_switch = adamw.all();
  OneOptimizer soap(*be, l, spec("soap"), at_switch);
  mixed.step(3, 3), soap.step(1, 3);
  EXPECT_EQ(mixed.weights(q), soap.weights(q));
  EXPECT_EQ(mixed.weights(q), std::vector<float>(at_switch.begin(), at_switch.begin() + q.numel));  // SOAP's step 1
  for (int s = 4; s <= 6; s++) mixed.step(s, s), soap.step(s - 2, s);  // a refresh at SOAP's t = 2 (step 3)
  EXPECT_EQ(mixed.weights(q), soap.weights(q));
  EXPECT_NE(mixed.weights(q), std::vector<float>(at_switch.begin(), at_switch.begin() + q.numel));
}
