// bench_guarded_backend: the cost of the guarded CPU backend (device memory PROT_NONE outside
// ops; a few mprotect calls per op) against the CPU backend, on one training step of a small
// Gpt (zero_grad, forward, backward, one AdamW update over the arena), same threads, same
// weights and batch.
//
// Method (a shared, noisy machine): one warm-up step on each side, then --rounds rounds of
// --steps steps per side, the order flipping every round. Per round: ratio = median guarded
// step / median cpu step, in wall time and in the process's CPU time (user + system: less
// sensitive to other processes on the machine, and it counts the kernel's mprotect work).
// Reported: each side's median step, each round's ratios, the median and spread of the
// ratios, and the host's sgemm rate. The two sides' losses must agree bit for bit (the
// guarded backend is the CPU backend behind an access check).
//   bench_guarded_backend [--threads 2] [--rounds 5] [--steps 5] [--layers 4] [--hidden 256]
#include <omp.h>
#include <time.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/check.hpp"
#include "model/gpt.hpp"
#include "train/machine_peak.hpp"

using namespace exatrain;

namespace {

double cpu_seconds() {
  timespec t;
  EXA_SYSCHECK(clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t) == 0, "clock_gettime");
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

double median(std::vector<double> v) {
  EXA_CHECK(!v.empty(), "median of no values");
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// One side: a backend, a model on it and its AdamW state.
struct Side {
  std::unique_ptr<Backend> be;
  std::unique_ptr<Gpt> model;
  DeviceBuffer m, v;
  std::vector<int32_t> tokens, targets;
  int64_t step = 0;

  Side(const std::string& backend, int threads, const GptOptions& o) : be(make_backend(backend, threads)) {
    model = std::make_unique<Gpt>(*be, o);
    model->init_weights(1);
    m = DeviceBuffer(*be, model->num_params(), "adamw exp_avg");
    v = DeviceBuffer(*be, model->num_params(), "adamw exp_avg_sq");
    const size_t n = size_t(o.micro_batch * o.model.seq_len);
    for (size_t i = 0; i < n; i++) {
      tokens.push_back(int32_t((i * 7919) % size_t(o.model.vocab)));
      targets.push_back(int32_t((i * 104729 + 3) % size_t(o.model.vocab)));
    }
  }
  // Returns the loss; *seconds: the step's wall time, *cpu: its CPU time.
  float train_step(double* seconds, double* cpu = nullptr) {
    const double t0 = omp_get_wtime(), c0 = cpu_seconds();
    model->zero_grad();
    const float loss = model->forward(tokens.data(), nullptr, targets.data());
    model->backward(nullptr, 1.0f);
    step++;
    const float b1 = 0.9f, b2 = 0.95f;
    be->adamw_update(model->params(), model->grads(), m.data(), v.data(), model->num_params(),
                     1e-3f, b1, b2, 1e-8f, 0.1f, 1.0f - std::pow(b1, float(step)),
                     1.0f - std::pow(b2, float(step)), 1.0f);
    *seconds = omp_get_wtime() - t0;
    if (cpu) *cpu = cpu_seconds() - c0;
    return loss;
  }
};

int arg(int argc, char** argv, const char* name, int fallback) {
  for (int i = 1; i + 1 < argc; i++)
    if (std::strcmp(argv[i], name) == 0) return std::atoi(argv[i + 1]);
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = arg(argc, argv, "--threads", 2), rounds = arg(argc, argv, "--rounds", 5),
            steps = arg(argc, argv, "--steps", 5);
  GptOptions o;
  o.model.layers = arg(argc, argv, "--layers", 4);
  o.model.hidden = arg(argc, argv, "--hidden", 256);
  o.model.heads = 4;
  o.model.kv_heads = 4;
  o.model.ffn_hidden = 4 * o.model.hidden;
  o.model.seq_len = 128;
  o.model.vocab = 4096;
  o.micro_batch = 4;
  Side cpu("cpu", threads, o), guarded("cpu-guarded", threads, o);
  std::printf("model: %lld layers, hidden %lld, seq %lld, vocab %lld, batch %lld; %lld params; "
              "%d threads\n", (long long)o.model.layers, (long long)o.model.hidden,
              (long long)o.model.seq_len, (long long)o.model.vocab, (long long)o.micro_batch,
              (long long)cpu.model->num_params(), threads);
  std::printf("host sgemm: %.1f GFLOP/s (1024^3, best of 3)\n", measure_sgemm_gflops(*cpu.be, 1024, 3));
  double s;
  EXA_CHECK(cpu.train_step(&s) == guarded.train_step(&s), "warm-up losses differ between backends");
  std::vector<double> ratios, cpu_ratios, all_cpu, all_guarded;
  for (int r = 0; r < rounds; r++) {
    std::vector<double> tc, tg, cc, cg;
    for (int side = 0; side < 2; side++) {
      const bool guarded_side = (side == 0) == (r % 2 == 1);  // order flips every round
      for (int i = 0; i < steps; i++) {
        double c;
        (guarded_side ? guarded : cpu).train_step(&s, &c);
        (guarded_side ? tg : tc).push_back(s);
        (guarded_side ? cg : cc).push_back(c);
      }
    }
    ratios.push_back(median(tg) / median(tc));
    cpu_ratios.push_back(median(cg) / median(cc));
    all_cpu.insert(all_cpu.end(), tc.begin(), tc.end());
    all_guarded.insert(all_guarded.end(), tg.begin(), tg.end());
    std::printf("round %d: wall cpu %.2f ms, cpu-guarded %.2f ms, ratio %.3f; CPU time ratio %.3f\n",
                r, 1e3 * median(tc), 1e3 * median(tg), ratios.back(), cpu_ratios.back());
  }
  double lc, lg;
  const float loss_c = cpu.train_step(&lc), loss_g = guarded.train_step(&lg);
  EXA_CHECK(loss_c == loss_g, "losses differ after {} steps: cpu {} guarded {}", cpu.step, loss_c, loss_g);
  std::printf("median step: cpu %.2f ms, cpu-guarded %.2f ms (losses identical after %lld steps: %.6f)\n",
              1e3 * median(all_cpu), 1e3 * median(all_guarded), (long long)cpu.step, double(loss_c));
  std::printf("CPU time: guarded/cpu %.3f (median of %d rounds; min %.3f max %.3f)\n",
              median(cpu_ratios), rounds, *std::min_element(cpu_ratios.begin(), cpu_ratios.end()),
              *std::max_element(cpu_ratios.begin(), cpu_ratios.end()));
  std::printf("guarded_over_cpu=%.3f (wall, median of %d rounds; min %.3f max %.3f)\n", median(ratios),
              rounds, *std::min_element(ratios.begin(), ratios.end()),
              *std::max_element(ratios.begin(), ratios.end()));
  return 0;
}
