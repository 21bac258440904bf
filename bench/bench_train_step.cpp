// bench_train_step: one training step of GPT-2 124M (12 layers, hidden 768, 12 heads, vocab
// 50257, 1024 positions; batch 4 x 64 tokens; AdamW, clip 1.0) in our engine and in PyTorch
// 1.13, both on the same number of threads, medians over a few steps after a warm-up.
// Last line: speedup_vs_pytorch=<PyTorch ms per step / ours>.
//   bench_train_step [--threads 2] [--steps 4] [--no-pytorch]
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unistd.h>
#include <random>
#include <string>
#include <vector>

#include "core/check.hpp"
#include "train/machine_peak.hpp"
#include "train/trainer.hpp"

using namespace exatrain;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// Runs the PyTorch script and returns its median ms per step (0 when it failed).
double run_pytorch(int threads, int steps) {
  std::string cmd = std::string("/usr/bin/python3 ") + EXATRAIN_BENCH_DIR +
                    "/pytorch_train_step.py --threads " + std::to_string(threads) +
                    " --steps " + std::to_string(steps) + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  EXA_SYSCHECK(p != nullptr, "popen {}", cmd);
  char line[512];
  double ms = 0;
  while (fgets(line, sizeof line, p)) {
    std::printf("  %s", line);
    if (std::strncmp(line, "ms_per_step=", 12) == 0) ms = std::atof(line + 12);
  }
  int rc = pclose(p);
  if (rc != 0) std::printf("  pytorch script exited with status %d\n", rc);
  return ms;
}

}  // namespace

int main(int argc, char** argv) try {
  // libgomp reads OMP_WAIT_POLICY once at load time, so set it by re-executing ourselves.
  // passive: idle OpenMP threads sleep instead of spinning. On this shared 2-core machine the
  // spinning (active) policy made steps 1.3-2x slower whenever other processes were running;
  // PyTorch (its own OpenMP runtime) is started with the same environment.
  if (std::getenv("OMP_WAIT_POLICY") == nullptr) {
    EXA_SYSCHECK(setenv("OMP_WAIT_POLICY", "passive", 1) == 0, "setenv OMP_WAIT_POLICY");
    execv("/proc/self/exe", argv);
    EXA_SYSCHECK(false, "execv /proc/self/exe");
  }
  std::printf("OMP_WAIT_POLICY=%s\n", std::getenv("OMP_WAIT_POLICY"));
  int threads = 2, steps = 4;
  bool pytorch = true;
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    if (a == "--threads" && i + 1 < argc) threads = std::atoi(argv[++i]);
    else if (a == "--steps" && i + 1 < argc) steps = std::atoi(argv[++i]);
    else if (a == "--no-pytorch") pytorch = false;
    else EXA_FAIL("bench_train_step: unknown argument '{}' (--threads N, --steps N, --no-pytorch)", a);
  }
  auto be = make_cpu_backend(threads);
  const double peak = measure_sgemm_gflops(*be, 2048, 3);
  std::printf("OpenBLAS sgemm 2048^3 on %d threads: %.1f GFLOP/s\n", threads, peak);

  TrainerOptions o;  // ModelSpec defaults are GPT-2 124M
  o.model.vocab = 50257;
  o.micro_batch = 4;
  o.seq = 64;
  o.train.lr = 6e-4;
  o.train.warmup_steps = 0;
  o.train.steps = 1000;
  o.peak_gflops = peak;
  std::mt19937 rng(1);
  std::vector<int32_t> tokens(100000);
  for (auto& t : tokens) t = int32_t(rng() % 50257);
  InMemoryTokenStream data(tokens);
  Trainer tr(*be, o, data);
  std::printf("engine: %lld parameters, %.2f GFLOP per step (model FLOPs)\n",
              (long long)tr.model().num_params(), tr.model().flops_per_step() / 1e9);

  std::vector<double> ms, gemm_ms, gemm_gflops;
  StepMetrics last;
  for (int s = 0; s <= steps; s++) {  // step 0 warms up
    be->gemm_seconds = be->gemm_flops = 0;
    last = tr.train_step();
    std::printf("engine step %d loss %.4f grad_norm %.3f %.0f ms (GEMM %.0f ms) %.1f GFLOP/s "
                "MFU %.2f\n", s, last.loss, last.grad_norm, last.seconds * 1e3,
                be->gemm_seconds * 1e3, last.gflops, last.mfu);
    if (s == 0) continue;
    ms.push_back(last.seconds * 1e3);
    gemm_ms.push_back(be->gemm_seconds * 1e3);
    gemm_gflops.push_back(be->gemm_flops / be->gemm_seconds / 1e9);
  }
  // Measure the sgemm reference again after our steps and keep the better one: on a shared
  // machine a single measurement can land in a busy moment (MFU would then exceed 1).
  const double peak_after = measure_sgemm_gflops(*be, 2048, 3);
  std::printf("OpenBLAS sgemm 2048^3 after the steps: %.1f GFLOP/s\n", peak_after);
  const double peak_best = std::max(peak, peak_after);
  const double ours = median(ms);
  const double accounted = double(tr.accounted_bytes()), rss = double(peak_rss_bytes());
  const ModelMemory mm = tr.model().memory();
  double torch_ms = pytorch ? run_pytorch(threads, 3) : 0;

  std::printf("\n== GPT-2 124M train step, batch 4 x 64, %d threads ==\n", threads);
  std::printf("ours:    %.0f ms/step (median of %d)\n", ours, steps);
  if (torch_ms > 0) std::printf("pytorch: %.0f ms/step\n", torch_ms);
  std::printf("GEMM share of our step: %.0f%% (%.0f ms)\n", 100 * median(gemm_ms) / ours,
              median(gemm_ms));
  std::printf("our GEMM throughput: %.1f GFLOP/s vs OpenBLAS sgemm 2048^3 %.1f GFLOP/s (%.0f%%)\n",
              median(gemm_gflops), peak_best, 100 * median(gemm_gflops) / peak_best);
  const double model_gflops = tr.model().flops_per_step() / (ours / 1e3) / 1e9;
  std::printf("model FLOP/s: %.1f GFLOP/s, MFU %.2f (vs the better sgemm measurement)\n",
              model_gflops, model_gflops / peak_best);
  std::printf("memory: peak RSS %.0f MiB vs accounted %.0f MiB (params %.0f, grads %.0f, "
              "AdamW %.0f, activations %.0f): RSS/accounted = %.3f\n", rss / 1048576,
              accounted / 1048576, mm.params / 1048576.0, mm.grads / 1048576.0,
              tr.optimizer().state_bytes() / 1048576.0, mm.activations / 1048576.0,
              rss / accounted);
  if (torch_ms > 0) std::printf("speedup_vs_pytorch=%.2f\n", torch_ms / ours);
  else std::printf("speedup_vs_pytorch=nan\n");
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_train_step: %s\n", e.what());
  return 1;
}
