// AdamW with 1-bit Adam's frozen variance ([comm] adam_variance = "freeze", docs/compression.md
// "Under Adam"): up to the freeze step exactly AdamW; afterwards the second moment stays as it was
// and the step is m̂ / (sqrt(v_F / bc2_F) + eps) with the frozen v_F and bias correction bc2_F,
// checked against a double reference; the update is then linear in the gradient (a gradient g sent
// once moves the weights as far as g/2 twice, up to the momentum's bias correction: what error
// feedback's delayed values need).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "backend/backend.hpp"
#include "core/check.hpp"
#include "optim/optimizer.hpp"

using namespace exatrain;

namespace {

struct Final {
  std::vector<float> w, v;
};

// `steps` AdamW steps on 5 weights with the given gradients per step, freezing after `freeze`.
Final adamw(const std::vector<std::vector<float>>& grads, int64_t freeze, float wd = 0) {
  std::unique_ptr<Backend> be = make_backend("cpu", 1);
  ParamLayout l;
  ParamInfo p;
  p.name = "w", p.global_shape = p.shard_shape = {5}, p.decay = true;
  l.add(p);
  TrainSpec t;
  t.weight_decay = wd;
  t.comm.compressor = "topk";
  t.comm.warmup_steps = freeze;
  t.comm.adam_variance = freeze > 0 ? "freeze" : "update";
  std::unique_ptr<Optimizer> opt = make_optimizer(*be, t);
  DeviceBuffer w(*be, 5), g(*be, 5);
  std::vector<float> host(5, 0.25f);
  be->upload(w.data(), host.data(), 20);
  const std::vector<ParamRegion> regions = {{&l, 0, 5, w.data(), g.data()}};
  opt->init_state(regions);
  for (size_t s = 0; s < grads.size(); s++) {
    be->upload(g.data(), grads[s].data(), 20);
    opt->step(regions, OptimStep{int64_t(s) + 1, 0.01f, 1.0f});
  }
  Final r{std::vector<float>(5), std::vector<float>(5)};
  be->download(r.w.data(), w.data(), 20);
  be->download(r.v.data(), opt->state(0, 1), 20);  // exp_avg_sq
  return r;
}

std::vector<float> grad(int s) {
  std::vector<float> g(5);
  for (int i = 0; i < 5; i++) g[size_t(i)] = float(std::sin(0.7 * i + 1.3 * s) * (1 + i));
  return g;
}

}  // namespace

TEST(FrozenVariance, MatchesAdamWUntilTheFreezeThenKeepsTheSecondMoment) {
  std::vector<std::vector<float>> g = {grad(1), grad(2), grad(3)};
  const Final plain = adamw(g, 0), frozen = adamw(g, 3);
  EXPECT_EQ(plain.w, frozen.w);  // the first 3 steps are AdamW's
  EXPECT_EQ(plain.v, frozen.v);
  g.push_back(grad(4));
  g.push_back(grad(5));
  const Final later = adamw(g, 3);
  EXPECT_EQ(later.v, frozen.v);  // steps 4 and 5 leave v as it was after step 3
  // The reference in double: AdamW (beta1 0.9, beta2 0.95, eps 1e-8) with v and bc2 frozen after step 3.
  std::vector<double> w(5, 0.25), m(5, 0), v(5, 0);
  for (int s = 1; s <= 5; s++)
    for (int i = 0; i < 5; i++) {
      const double x = g[size_t(s - 1)][size_t(i)];
      m[size_t(i)] = 0.9 * m[size_t(i)] + 0.1 * x;
      if (s <= 3) v[size_t(i)] = 0.95 * v[size_t(i)] + 0.05 * x * x;
      const double bc1 = 1 - std::pow(0.9, s), bc2 = 1 - std::pow(0.95, std::min(s, 3));
      w[size_t(i)] -= 0.01 * (m[size_t(i)] / bc1) / (std::sqrt(v[size_t(i)] / bc2) + 1e-8);
    }
  for (int i = 0; i < 5; i++) EXPECT_NEAR(later.w[size_t(i)], w[size_t(i)], 1e-6) << i;
}

TEST(FrozenVariance, TheFrozenUpdateIsLinearInTheGradient) {
  // After a freeze at step 30 the weights move linearly in the gradients sent: 2g at one step moves
  // them exactly twice as far as g at that step, and as far as g at two successive steps up to the
  // momentum's bias correction at those steps (1 - 0.9^31 against 1 - 0.9^32: under 1%). That is
  // what error feedback needs: a value delayed by a step moves the weights as far as if sent on time.
  std::vector<std::vector<float>> warm;
  for (int s = 1; s <= 30; s++) warm.push_back(grad(s));
  const std::vector<float> g = grad(31), zero(5, 0.0f);
  std::vector<float> twice(5);
  for (int i = 0; i < 5; i++) twice[size_t(i)] = 2 * g[size_t(i)];
  auto after = [&](const std::vector<std::vector<float>>& tail) {
    std::vector<std::vector<float>> all = warm;
    for (size_t s = 0; s < 40; s++) all.push_back(s < tail.size() ? tail[s] : zero);  // the momentum passes all on
    return all;
  };
  auto moved = [](const Final& r, const Final& base) {
    std::vector<double> d(5);
    for (int i = 0; i < 5; i++) d[size_t(i)] = double(r.w[size_t(i)]) - double(base.w[size_t(i)]);
    return d;
  };
  const Final base = adamw(after({}), 30);
  const std::vector<double> once = moved(adamw(after({g}), 30), base), spike = moved(adamw(after({twice}), 30), base),
                            spread = moved(adamw(after({g, g}), 30), base);
  for (int i = 0; i < 5; i++) {
    EXPECT_GT(std::fabs(once[size_t(i)]), 1e-3) << i;
    EXPECT_NEAR(spike[size_t(i)], 2 * once[size_t(i)], 1e-4 * std::fabs(spike[size_t(i)]) + 2e-7) << i;
    EXPECT_NEAR(spread[size_t(i)], spike[size_t(i)], 1e-2 * std::fabs(spike[size_t(i)])) << i;
  }
  // Without the freeze the spike raises v and is normalised away: Adam moves it less than the spread.
  const Final base_adam = adamw(after({}), 0);
  const std::vector<double> spike_adam = moved(adamw(after({twice}), 0), base_adam),
                            spread_adam = moved(adamw(after({g, g}), 0), base_adam);
  double sum_spike = 0, sum_spread = 0;
  for (int i = 0; i < 5; i++) sum_spike += std::fabs(spike_adam[size_t(i)]), sum_spread += std::fabs(spread_adam[size_t(i)]);
  std::printf("unfrozen: the spike moves %.4g, the spread %.4g\n", sum_spike, sum_spread);
  EXPECT_LT(sum_spike, 0.95 * sum_spread);
}

// Compressed momentum ([comm] compress = "momentum"): after the freeze the reduced "gradients" are
// the synchronised momentum M (OptimStep::grads_are_momentum), which AdamW takes as its m exactly
// (times grad_scale) with v frozen: the update is m̂ = M / bc1 over the frozen v. Refused before the
// freeze (v would be measured on momenta) and by an optimizer without that path (SGD).
TEST(FrozenVariance, TheSynchronisedMomentumBecomesAdamWsFirstMoment) {
  std::unique_ptr<Backend> be = make_backend("cpu", 1);
  ParamLayout l;
  ParamInfo p;
  p.name = "w", p.global_shape = p.shard_shape = {5}, p.decay = false;
  l.add(p);
  TrainSpec t;
  t.comm.compressor = "topk", t.comm.warmup_steps = 2, t.comm.adam_variance = "freeze", t.comm.compress = "momentum";
  std::unique_ptr<Optimizer> opt = make_optimizer(*be, t);
  DeviceBuffer w(*be, 5), g(*be, 5);
  std::vector<float> host(5, 0.25f);
  be->upload(w.data(), host.data(), 20);
  const std::vector<ParamRegion> regions = {{&l, 0, 5, w.data(), g.data()}};
  opt->init_state(regions);
  std::vector<double> ref(5, 0.25), m(5, 0), v(5, 0);
  for (int s = 1; s <= 4; s++) {
    const std::vector<float> x = grad(s);  // steps 1-2: gradients; 3-4: the synchronised momentum M
    be->upload(g.data(), x.data(), 20);
    OptimStep step{s, 0.01f, s == 4 ? 0.5f : 1.0f};
    step.grads_are_momentum = s > 2;
    if (s == 1) {  // before the freeze the momentum path is refused: v would be measured on momenta
      step.grads_are_momentum = true;
      EXPECT_THROW(opt->step(regions, step), Error);
      step.grads_are_momentum = false;
    }
    opt->step(regions, step);
    for (int i = 0; i < 5; i++) {
      const double xi = double(x[size_t(i)]) * step.grad_scale;
      m[size_t(i)] = s > 2 ? xi : 0.9 * m[size_t(i)] + 0.1 * xi;
      if (s <= 2) v[size_t(i)] = 0.95 * v[size_t(i)] + 0.05 * xi * xi;
      const double bc1 = 1 - std::pow(0.9, s), bc2 = 1 - std::pow(0.95, std::min(s, 2));
      ref[size_t(i)] -= 0.01 * (m[size_t(i)] / bc1) / (std::sqrt(v[size_t(i)] / bc2) + 1e-8);
    }
  }
  std::vector<float> got(5), exp_avg(5);
  be->download(got.data(), w.data(), 20);
  be->download(exp_avg.data(), opt->state(0, 0), 20);
  const std::vector<float> last = grad(4);
  for (int i = 0; i < 5; i++) {
    EXPECT_EQ(exp_avg[size_t(i)], last[size_t(i)] * 0.5f) << i;  // m = grad_scale M, exactly
    EXPECT_NEAR(got[size_t(i)], ref[size_t(i)], 1e-6) << i;
  }
  TrainSpec sgd;
  sgd.optimizer = "sgd";
  std::unique_ptr<Optimizer> other = make_optimizer(*be, sgd);
  other->init_state(regions);
  OptimStep step{1, 0.01f, 1.0f};
  step.grads_are_momentum = true;
  EXPECT_THROW(other->step(regions, step), Error);
}
