// The GEMM-efficiency shape constants of a CPU device (catalog/devices.toml gemm_efficiency,
// gemm_dim_half, gemm_tokens_half), measured: the twelve GEMMs of one transformer layer's forward
// and backward (QKV, out-projection, fc1, fc2; each y = x W^T, dW += dy^T x, dx = dy W) through
// the engine's backend at the shapes a tensor-parallel rank runs (hidden h, shard h/tp, `tokens`
// rows), the fastest of --reps runs in each of --rounds passes over all shapes (the machine is
// shared: the fastest is the least disturbed),
// then a least-squares fit in log space of the planner's model
//   rate = peak * gemm_efficiency / (1 + dim_half / (h/tp)) / (1 + tokens_half / tokens)
// with the device's catalog peak. Prints one row per shape and the fitted constants.
//   build/bench/parallel/bench_gemm_shapes [--threads 1] [--device cpu-local] [--reps 7] [--rounds 3]
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "catalog/device.hpp"

using namespace exatrain;

namespace {

struct Shape { int64_t h, tp, tokens; };
struct Point { Shape s; double gflops; };

// Seconds of the layer's twelve GEMMs (GELU MLP, f = 4h, multi-head), best of `reps`.
double layer_gemm_seconds(Backend& be, const Shape& s, int reps, double* flops) {
  const int64_t h = s.h, f = 4 * h, N = s.tokens, tp = s.tp;
  struct Lin { int64_t out, in; };
  const Lin lins[] = {{3 * h / tp, h}, {h, h / tp}, {f / tp, h}, {h, f / tp}};
  const int64_t big = std::max(f, 3 * h);
  float* x = be.alloc(N * big);
  float* y = be.alloc(N * big);
  float* w = be.alloc(big * h);
  float* dw = be.alloc(big * h);
  *flops = 0;
  for (const Lin& l : lins) *flops += 3 * 2.0 * double(N) * double(l.out) * double(l.in);
  double best = 1e30;
  for (int r = 0; r < reps; r++) {
    const auto t0 = std::chrono::steady_clock::now();
    for (const Lin& l : lins) {
      be.gemm(false, true, N, l.out, l.in, 1.0f, x, l.in, w, l.in, 0.0f, y, l.out);   // y = x W^T
      be.gemm(true, false, l.out, l.in, N, 1.0f, y, l.out, x, l.in, 1.0f, dw, l.in);  // dW += dy^T x
      be.gemm(false, false, N, l.in, l.out, 1.0f, y, l.out, w, l.in, 0.0f, x, l.in);  // dx = dy W
    }
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  for (float* p : {x, y, w, dw}) be.free_bytes(p);
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 1, reps = 7, rounds = 3;
  std::string device = "cpu-local";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--threads") threads = std::atoi(argv[i + 1]);
    else if (k == "--reps") reps = std::atoi(argv[i + 1]);
    else if (k == "--rounds") rounds = std::atoi(argv[i + 1]);
    else if (k == "--device") device = argv[i + 1];
  }
  const Device& d = find_device(device);
  const double peak = d.peak_tflops_fp32 * 1e3;  // GFLOP/s
  auto be = make_cpu_backend(threads);
  omp_set_num_threads(threads);
  std::vector<Point> pts;
  for (int64_t h : {256, 512})
    for (int64_t tp : {1, 2, 4})
      for (int64_t tokens : {128, 256, 512, 1024}) pts.push_back({{h, tp, tokens}, 0.0});
  // Rounds over all shapes, best per shape: a burst of other work on the shared cores spoils a
  // few consecutive measurements, rarely the same shape in every round.
  for (int round = 0; round < rounds; round++)
    for (Point& p : pts) {
      double flops = 0;
      layer_gemm_seconds(*be, p.s, 1, &flops);  // warm the caches and the allocator
      const double sec = layer_gemm_seconds(*be, p.s, reps, &flops);
      p.gflops = std::max(p.gflops, flops / sec / 1e9);
    }
  std::printf("%d thread(s), device %s (peak %.1f GFLOP/s fp32), best of %d reps x %d rounds\n", threads,
              device.c_str(), peak, reps, rounds);
  std::printf("%6s %4s %7s %8s %10s %8s\n", "h", "tp", "h/tp", "tokens", "GFLOP/s", "of peak");
  for (const Point& p : pts)
    std::printf("%6lld %4lld %7lld %8lld %10.1f %8.3f\n", (long long)p.s.h, (long long)p.s.tp,
                (long long)(p.s.h / p.s.tp), (long long)p.s.tokens, p.gflops, p.gflops / peak);
  // Least squares of log(rate / peak) = log E - log(1 + dh / shard) - log(1 + th / tokens): a
  // grid over (dh, th); log E is then the mean residual (closed form).
  double best = 1e30, bdh = 0, bth = 0, bE = 0;
  for (double dh = 0; dh <= 400; dh += 1)
    for (double th = 0; th <= 2000; th += 2) {
      double sum = 0, sq = 0;
      for (const Point& p : pts) {
        const double r = std::log(p.gflops / peak) + std::log1p(dh * double(p.s.tp) / double(p.s.h)) +
                         std::log1p(th / double(p.s.tokens));
        sum += r, sq += r * r;
      }
      const double n = double(pts.size()), mean = sum / n, err = sq - n * mean * mean;
      if (err < best) best = err, bdh = dh, bth = th, bE = std::exp(mean);
    }
  double worst = 0;
  for (const Point& p : pts) {
    const double model = peak * bE / (1 + bdh * double(p.s.tp) / double(p.s.h)) / (1 + bth / double(p.s.tokens));
    worst = std::max(worst, std::fabs(model / p.gflops - 1));
  }
  std::printf("fit: gemm_efficiency = %.3f, gemm_dim_half = %.0f, gemm_tokens_half = %.0f "
              "(rms log error %.3f, worst shape %.1f%%)\n",
              bE, bdh, bth, std::sqrt(best / double(pts.size())), 100 * worst);
  return 0;
}
