// Muon against an independent reference (muon_test.py, PyTorch float64): this driver runs our
// Muon (optim/muon.hpp) for kSteps steps on four entries of both orientations and both optimizers:
//   h.0.attn.q_proj.weight [8, 24]  matrix, m < n (Muon on X X^T)
//   h.0.mlp.fc2.weight     [24, 8]  matrix, m > n (Muon on X^T X)
//   h.0.ln_1.weight        [24]     norm (AdamW, no weight decay)
//   wte.weight             [16, 8]  embedding (AdamW with weight decay)
// and writes into WORKDIR: meta.json (layout, hyper-parameters, every step's lr and grad_scale),
// init.f32 (the arena before step 1), grad<s>.f32 (step s's gradient) and param<s>.f32 (the arena
// after step s). Usage: muon_driver WORKDIR SCALE(rms_match|shape) NESTEROV(0|1) BACKEND(cpu|cpu-guarded)
#include <cmath>
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
#include "optim/muon.hpp"

using namespace exatrain;
using exatrain::reference::write_floats;

namespace {

constexpr int kSteps = 6;

}  // namespace

int main(int argc, char** argv) {
  EXA_CHECK(argc == 5, "usage: muon_driver WORKDIR rms_match|shape 0|1 cpu|cpu-guarded");
  const std::string dir = argv[1], scale = argv[2];
  const bool nesterov = std::string(argv[3]) == "1";
  std::unique_ptr<Backend> be = make_backend(argv[4], 1);
  const ParamLayout l = reference::four_entries();
  const int64_t n = l.total();
  MuonConfig cfg;
  cfg.momentum = 0.9f, cfg.nesterov = nesterov, cfg.ns_steps = 5, cfg.rms_match = scale == "rms_match";
  cfg.adamw = AdamWConfig{0.9f, 0.95f, 1e-8f, 0.1f};
  Muon opt(*be, cfg);

  std::mt19937 rng(42);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> w(static_cast<size_t>(n)), g(static_cast<size_t>(n));
  for (float& x : w) x = 0.2f * normal(rng);
  write_floats(dir + "/init.f32", w);
  DeviceBuffer params(*be, n), grads(*be, n);
  be->upload(params.data(), w.data(), sizeof(float) * size_t(n));
  const std::vector<ParamRegion> regions = {{&l, 0, n, params.data(), grads.data()}};
  opt.init_state(regions);

  std::string steps;
  for (int s = 1; s <= kSteps; s++) {
    for (float& x : g) x = normal(rng);
    if (s == 4)  // a rank-deficient matrix gradient: q_proj's rows 4-7 repeat rows 0-3
      for (int64_t i = 0; i < 4 * 24; i++) g[size_t(4 * 24 + i)] = g[size_t(i)];
    write_floats(fmt::format("{}/grad{}.f32", dir, s), g);
    be->upload(grads.data(), g.data(), sizeof(float) * size_t(n));
    const OptimStep ctx{s, 0.01f * float(s) / kSteps + 0.002f, s == 3 ? 0.5f : 1.0f};
    opt.step(regions, ctx);
    be->download(w.data(), params.data(), sizeof(float) * size_t(n));
    write_floats(fmt::format("{}/param{}.f32", dir, s), w);
    steps += fmt::format("{}{{\"lr\": {:.9g}, \"grad_scale\": {:.9g}}}", s > 1 ? ", " : "", ctx.lr, ctx.grad_scale);
  }
  std::string entries;
  for (const ParamInfo& p : l.entries())
    entries += fmt::format("{}{{\"name\": \"{}\", \"shape\": [{}], \"offset\": {}, \"muon\": {}, \"decay\": {}}}",
                           entries.empty() ? "" : ", ", p.name, fmt::join(p.shard_shape, ", "), p.offset,
                           Muon::orthogonalised(p) ? "true" : "false", p.decay ? "true" : "false");
  std::ofstream meta(dir + "/meta.json");
  meta << fmt::format("{{\"entries\": [{}], \"steps\": [{}], \"momentum\": {:.9g}, \"nesterov\": {}, \"ns_steps\": {}, "
                      "\"scale\": \"{}\", \"beta1\": 0.9, \"beta2\": 0.95, \"eps\": 1e-8, \"weight_decay\": 0.1}}\n",
                      entries, steps, cfg.momentum, nesterov ? "true" : "false", cfg.ns_steps, scale);
  EXA_CHECK(meta.good(), "muon_driver: cannot write {}/meta.json", dir);
  std::printf("muon_driver: %d steps of %lld parameters written to %s (backend %s)\n", kSteps, (long long)n,
              dir.c_str(), be->name());
  return 0;
}
