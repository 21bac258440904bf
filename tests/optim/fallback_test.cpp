// Shampoo's and SOAP's preconditioners fall back instead of poisoning the weights: a gradient whose
// outer products overflow float (1e25^2 = inf) makes every eigendecomposition fail; each failure is
// counted (Optimizer::fallbacks, written to metrics.jsonl as optimizer_fallbacks) and the weights
// stay finite.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "backend/backend.hpp"
#include "optim/optimizer.hpp"

using namespace exatrain;

TEST(PreconditionerFallback, AnOverflowingFactorIsCountedAndTheWeightsStayFinite) {
  for (const char* name : {"shampoo", "soap"}) {
    std::unique_ptr<Backend> be = make_backend("cpu", 1);
    ParamLayout l;
    ParamInfo p;
    p.name = "h.0.attn.q_proj.weight", p.global_shape = p.shard_shape = {4, 3}, p.decay = true;
    l.add(p);
    TrainSpec t;
    t.optimizer = name;
    t.shampoo.start_preconditioning_step = 1, t.shampoo.precondition_frequency = 1;
    t.soap.precondition_frequency = 1;
    std::unique_ptr<Optimizer> opt = make_optimizer(*be, t);
    DeviceBuffer w(*be, 12), g(*be, 12);
    std::vector<float> host(12, 0.5f), grad(12);
    be->upload(w.data(), host.data(), sizeof(float) * 12);
    const std::vector<ParamRegion> regions = {{&l, 0, 12, w.data(), g.data()}};
    opt->init_state(regions);
    EXPECT_EQ(opt->fallbacks(), 0) << name;
    for (int s = 1; s <= 3; s++) {
      for (size_t i = 0; i < grad.size(); i++) grad[i] = (i % 2 ? -1e25f : 1e25f) / float(i + 1);
      be->upload(g.data(), grad.data(), sizeof(float) * 12);
      opt->step(regions, OptimStep{s, 0.01f, 1.0f});
    }
    // Shampoo: both roots at each of 3 refreshes; SOAP: both first bases, then both refreshes at
    // steps 2 and 3.
    EXPECT_EQ(opt->fallbacks(), 6) << name;
    be->download(host.data(), w.data(), sizeof(float) * 12);
    for (float x : host) EXPECT_TRUE(std::isfinite(x)) << name;
  }
}

// K-FAC: the layer's inputs overflow float in the factor (1e25^2 = inf), so every eigendecomposition
// of A fails (G's succeeds) and is counted; the matrix has no eigenbasis yet, so it takes the plain
// gradient (P = g): its weights are exactly SGD's with the same momentum, and finite.
TEST(PreconditionerFallback, KfacCountsAFailedEigendecompositionAndStepsAlongTheGradient) {
  std::unique_ptr<Backend> be = make_backend("cpu", 1);
  ParamLayout l;
  ParamInfo p;
  p.name = "h.0.attn.q_proj.weight", p.global_shape = p.shard_shape = {4, 3}, p.decay = true;
  l.add(p);
  auto run = [&](const char* name) {
    TrainSpec t;
    t.optimizer = name;
    t.kfac.factor_update_steps = 1, t.kfac.inv_update_steps = 1;
    std::unique_ptr<Optimizer> opt = make_optimizer(*be, t);
    DeviceBuffer w(*be, 12), g(*be, 12), x(*be, 6), dy(*be, 8);
    std::vector<float> host(12, 0.5f), grad(12), hx(6, 1e25f), hdy(8, 0.01f);
    for (size_t i = 0; i < grad.size(); i++) grad[i] = 0.1f / float(i + 1);
    be->upload(w.data(), host.data(), sizeof(float) * 12);
    be->upload(g.data(), grad.data(), sizeof(float) * 12);
    be->upload(x.data(), hx.data(), sizeof(float) * 6);
    be->upload(dy.data(), hdy.data(), sizeof(float) * 8);
    const std::vector<ParamRegion> regions = {{&l, 0, 12, w.data(), g.data()}};
    LocalReplicaComm one;
    opt->connect(OptimizerTopology{&one, {&l}, true});
    opt->init_state(regions);
    for (int s = 1; s <= 3; s++) {
      opt->begin_step(s);
      if (LinearObserver* o = opt->linear_observer()) o->linear_backward(l.entries()[0], x.data(), 3, dy.data(), 4, 2);
      opt->step(regions, OptimStep{s, 0.01f, 1.0f});
    }
    be->download(host.data(), w.data(), sizeof(float) * 12);
    return std::make_pair(host, opt->fallbacks());
  };
  const auto [kfac, fallbacks] = run("kfac");
  EXPECT_EQ(fallbacks, 3);  // A's at each of the 3 refreshes
  for (float v : kfac) EXPECT_TRUE(std::isfinite(v));
  EXPECT_EQ(kfac, run("sgd").first);
}
