// K-FAC (optim/kfac.hpp) against an independent float64 reference (kfac_test.py): this driver
// builds the optimizer as a job does (parse_job with the --set overrides, make_optimizer), connects
// it to driver_common's four entries on one rank, and for kSteps steps shows its LinearObserver
// kMicro micro-batches of random layer inputs x [rows, in] and output gradients dy [rows, out] per
// matrix (when it observes: the factor steps), then random gradients and a step (a changing lr, one
// clipped step with grad_scale 0.5). It writes into WORKDIR: meta.json (layout, [optimizer] values,
// every step's lr and grad_scale and whether it observed), init.f32, obs<s>.f32 (for each
// micro-batch, for each matrix in arena order: x then dy), grad<s>.f32 and param<s>.f32.
// Usage: kfac_driver WORKDIR BACKEND(cpu|cpu-guarded) SECTION.KEY=VALUE...
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "backend/backend.hpp"
#include "core/check.hpp"
#include "driver_common.hpp"
#include "job/parse.hpp"
#include "optim/optimizer.hpp"

using namespace exatrain;
using exatrain::reference::write_floats;

namespace {

constexpr int kSteps = 6, kMicro = 2;
constexpr int64_t kRows = 16;  // rows of one micro-batch: 32 per step, more than any side (24)

std::string meta_json(const ParamLayout& l, const TrainSpec& t, const std::string& steps) {
  std::string entries;
  for (const ParamInfo& p : l.entries())
    entries += fmt::format("{}{{\"name\": \"{}\", \"shape\": [{}], \"offset\": {}, \"decay\": {}, \"matrix\": {}}}",
                           entries.empty() ? "" : ", ", p.name, fmt::join(p.shard_shape, ", "), p.offset,
                           p.decay ? "true" : "false", p.role == ParamRole::matrix ? "true" : "false");
  const KfacSpec& k = t.kfac;
  return fmt::format(
      "{{\"entries\": [{}], \"steps\": [{}], \"rows\": {}, \"micro_batches\": {}, \"weight_decay\": {:.9g}, "
      "\"momentum\": {:.9g}, \"nesterov\": {}, \"damping\": {:.9g}, \"factor_decay\": {:.9g}, "
      "\"factor_update_steps\": {}, \"inv_update_steps\": {}, \"kl_clip\": {:.9g}}}\n",
      entries, steps, kRows, kMicro, t.weight_decay, float(k.momentum), k.nesterov ? "true" : "false",
      float(k.damping), float(k.factor_decay), k.factor_update_steps, k.inv_update_steps, float(k.kl_clip));
}

}  // namespace

int main(int argc, char** argv) {
  EXA_CHECK(argc >= 3, "usage: kfac_driver WORKDIR cpu|cpu-guarded SECTION.KEY=VALUE...");
  const std::string dir = argv[1];
  const Job job = parse_job("", "kfac_driver", std::vector<std::string>(argv + 3, argv + argc));
  std::unique_ptr<Backend> be = make_backend(argv[2], 1);
  std::unique_ptr<Optimizer> opt = make_optimizer(*be, job.train);
  const ParamLayout l = reference::four_entries();
  const int64_t n = l.total();

  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> w(static_cast<size_t>(n)), g(static_cast<size_t>(n));
  for (float& x : w) x = 0.05f * normal(rng);
  write_floats(dir + "/init.f32", w);
  DeviceBuffer params(*be, n), grads(*be, n);
  be->upload(params.data(), w.data(), sizeof(float) * size_t(n));
  const std::vector<ParamRegion> regions = {{&l, 0, n, params.data(), grads.data()}};
  LocalReplicaComm one;
  opt->connect(OptimizerTopology{&one, {&l}, true});
  opt->init_state(regions);
  LinearObserver* obs = opt->linear_observer();
  EXA_CHECK(obs, "kfac_driver: {} has no linear observer", opt->name());

  std::string steps;
  for (int s = 1; s <= kSteps; s++) {
    opt->begin_step(s);
    const bool observed = obs->observing();
    std::vector<float> seen;
    for (int mb = 0; mb < kMicro && observed; mb++)
      for (const ParamInfo& p : l.entries()) {
        if (p.role != ParamRole::matrix) continue;
        const int64_t out = p.shard_shape[0], in = p.shard_shape[1];
        std::vector<float> x(size_t(kRows * in)), dy(size_t(kRows * out));
        for (float& v : x) v = normal(rng);
        for (float& v : dy) v = normal(rng) / float(kRows * kMicro);  // a mean loss's per-row gradients
        seen.insert(seen.end(), x.begin(), x.end());
        seen.insert(seen.end(), dy.begin(), dy.end());
        DeviceBuffer dx(*be, int64_t(x.size())), ddy(*be, int64_t(dy.size()));
        be->upload(dx.data(), x.data(), sizeof(float) * x.size());
        be->upload(ddy.data(), dy.data(), sizeof(float) * dy.size());
        obs->linear_backward(p, dx.data(), in, ddy.data(), out, kRows);
      }
    if (observed) write_floats(fmt::format("{}/obs{}.f32", dir, s), seen);
    for (float& x : g) x = normal(rng);
    write_floats(fmt::format("{}/grad{}.f32", dir, s), g);
    be->upload(grads.data(), g.data(), sizeof(float) * size_t(n));
    const OptimStep ctx{s, 0.05f * float(s) / kSteps + 0.01f, s == 3 ? 0.5f : 1.0f};
    opt->step(regions, ctx);
    be->download(w.data(), params.data(), sizeof(float) * size_t(n));
    write_floats(fmt::format("{}/param{}.f32", dir, s), w);
    steps += fmt::format("{}{{\"lr\": {:.9g}, \"grad_scale\": {:.9g}, \"observed\": {}}}", s > 1 ? ", " : "", ctx.lr,
                         ctx.grad_scale, observed ? "true" : "false");
  }
  std::ofstream meta(dir + "/meta.json");
  meta << meta_json(l, job.train, steps);
  EXA_CHECK(meta.good(), "kfac_driver: cannot write {}/meta.json", dir);
  std::printf("kfac_driver: %s, %d steps of %lld parameters written to %s (backend %s, %lld state bytes, %lld fallbacks)\n",
              opt->name(), kSteps, (long long)n, dir.c_str(), be->name(), (long long)opt->state_bytes(),
              (long long)opt->fallbacks());
  return 0;
}
