// SGD, Lion, LAMB, Adafactor (optim/first_order.hpp), Shampoo (optim/shampoo.hpp) and SOAP (optim/soap.hpp) against independent references
// (optim_test.py, PyTorch float64): this driver builds the optimizer as a job does (parse_job with
// the given --set overrides, then make_optimizer), runs it for kSteps steps on the five entries
// of five_entries() (three matrices, a norm, an embedding) with a changing lr and one clipped step (grad_scale 0.5), and writes into WORKDIR: meta.json
// (layout, the job's [train] and [optimizer] values, every step's lr and grad_scale), init.f32,
// grad<s>.f32 and param<s>.f32 (the arena after step s).
// Usage: optim_driver WORKDIR BACKEND(cpu|cpu-guarded) SECTION.KEY=VALUE...
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

constexpr int kSteps = 6;

// driver_common's four entries and a square matrix [12, 12]: at max_preconditioner_dim 12 SOAP
// rotates both its sides and one side of each other matrix. (A rotated side longer than the other
// has a rank-deficient factor at the first step, whose null-space eigenvectors are arbitrary; no
// two eigensolvers agree on them, so the references test SOAP where the factors have full rank.)
ParamLayout five_entries() {
  ParamLayout l = reference::four_entries();
  ParamInfo p;
  p.name = "h.0.attn.c_proj.weight", p.global_shape = p.shard_shape = {12, 12}, p.decay = true;
  l.add(p);
  return l;
}

std::string meta_json(const ParamLayout& l, const TrainSpec& t, const std::string& steps) {
  std::string entries;
  for (const ParamInfo& p : l.entries())
    entries += fmt::format("{}{{\"name\": \"{}\", \"shape\": [{}], \"offset\": {}, \"decay\": {}}}",
                           entries.empty() ? "" : ", ", p.name, fmt::join(p.shard_shape, ", "), p.offset,
                           p.decay ? "true" : "false");
  const AdafactorSpec& a = t.adafactor;
  return fmt::format(
      "{{\"optimizer\": \"{}\", \"entries\": [{}], \"steps\": [{}], \"weight_decay\": {:.9g}, \"beta1\": {:.9g}, "
      "\"beta2\": {:.9g}, \"eps\": {:.9g}, \"sgd\": {{\"momentum\": {:.9g}, \"nesterov\": {}}}, "
      "\"lion\": {{\"beta1\": {:.9g}, \"beta2\": {:.9g}}}, \"adafactor\": {{\"beta1\": {:.9g}, \"decay_rate\": {:.9g}, "
      "\"eps1\": {:.9g}, \"clip_threshold\": {:.9g}, \"factored\": {}}}, \"shampoo\": {{\"factor_decay\": {:.9g}, "
      "\"epsilon\": {:.9g}, \"max_preconditioner_dim\": {}, \"precondition_frequency\": {}, "
      "\"start_preconditioning_step\": {}}}, \"soap\": {}}}\n",
      t.optimizer, entries, steps, t.weight_decay, t.beta1, t.beta2, t.eps, t.sgd.momentum,
      t.sgd.nesterov ? "true" : "false", t.lion.beta1, t.lion.beta2, a.beta1, a.decay_rate, a.eps1, a.clip_threshold,
      a.factored ? "true" : "false", float(t.shampoo.factor_decay), t.shampoo.epsilon, t.shampoo.max_preconditioner_dim,
      t.shampoo.precondition_frequency, t.shampoo.start_preconditioning_step,
      fmt::format("{{\"factor_decay\": {:.9g}, \"max_preconditioner_dim\": {}, \"precondition_frequency\": {}}}",
                  float(t.soap.factor_decay), t.soap.max_preconditioner_dim, t.soap.precondition_frequency));
}

}  // namespace

int main(int argc, char** argv) {
  EXA_CHECK(argc >= 3, "usage: optim_driver WORKDIR cpu|cpu-guarded SECTION.KEY=VALUE...");
  const std::string dir = argv[1];
  const Job job = parse_job("", "optim_driver", std::vector<std::string>(argv + 3, argv + argc));
  std::unique_ptr<Backend> be = make_backend(argv[2], 1);
  std::unique_ptr<Optimizer> opt = make_optimizer(*be, job.train);
  const ParamLayout l = five_entries();
  const int64_t n = l.total();

  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> w(static_cast<size_t>(n)), g(static_cast<size_t>(n));
  for (float& x : w) x = 0.05f * normal(rng);
  write_floats(dir + "/init.f32", w);
  DeviceBuffer params(*be, n), grads(*be, n);
  be->upload(params.data(), w.data(), sizeof(float) * size_t(n));
  const std::vector<ParamRegion> regions = {{&l, 0, n, params.data(), grads.data()}};
  opt->init_state(regions);

  std::string steps;
  for (int s = 1; s <= kSteps; s++) {
    for (float& x : g) x = normal(rng);
    write_floats(fmt::format("{}/grad{}.f32", dir, s), g);
    be->upload(grads.data(), g.data(), sizeof(float) * size_t(n));
    const OptimStep ctx{s, 0.01f * float(s) / kSteps + 0.002f, s == 3 ? 0.5f : 1.0f};
    opt->step(regions, ctx);
    be->download(w.data(), params.data(), sizeof(float) * size_t(n));
    write_floats(fmt::format("{}/param{}.f32", dir, s), w);
    steps += fmt::format("{}{{\"lr\": {:.9g}, \"grad_scale\": {:.9g}}}", s > 1 ? ", " : "", ctx.lr, ctx.grad_scale);
  }
  std::ofstream meta(dir + "/meta.json");
  meta << meta_json(l, job.train, steps);
  EXA_CHECK(meta.good(), "optim_driver: cannot write {}/meta.json", dir);
  std::printf("optim_driver: %s, %d steps of %lld parameters written to %s (backend %s, %lld state bytes)\n",
              opt->name(), kSteps, (long long)n, dir.c_str(), be->name(), (long long)opt->state_bytes());
  return 0;
}
