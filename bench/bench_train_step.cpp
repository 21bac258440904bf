// bench_train_step: one training step of GPT-2 124M (12 layers, hidden 768, 12 heads, vocab
// 50257, 1024 positions; batch 4 x 64 tokens; AdamW, clip 1.0) in our engine and in PyTorch
// 1.13, both on the same number of threads and the same batches.
//
// Method (a shared, noisy machine): PyTorch runs as a persistent subprocess
// (bench/pytorch_train_step.py --serve); after one warm-up step on each side, the two sides
// alternate over --rounds rounds of --steps steps each (the order flips every round, so a slow
// drift of the machine's load hits both sides alike). Per round: ratio = median PyTorch step /
// median our step. Reported: per-side min and median step time over all rounds, each round's
// ratio, their median and spread (min-max). Both sides read the same token file, batched the
// same way (InMemoryTokenStream); each step prints a checksum of its batch to show it.
// Last line: speedup_vs_pytorch=<median of the per-round ratios>.
//   bench_train_step [--threads 2] [--rounds 5] [--steps 3] [--no-pytorch]
#include <omp.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/check.hpp"
#include "train/machine_peak.hpp"
#include "train/trainer.hpp"

using namespace exatrain;

namespace {

double median(std::vector<double> v) {
  EXA_CHECK(!v.empty(), "median of no values");
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

double min_of(const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }
double max_of(const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); }

// The bench's token source: InMemoryTokenStream plus a checksum of the last batch (sum of inputs
// and targets), printed per step on both sides to show they train on the same data.
class ChecksummedStream final : public TokenSource {
 public:
  explicit ChecksummedStream(std::vector<int32_t> tokens) : inner_(std::move(tokens)) {}
  void next_batch(int64_t B, int64_t T, int32_t* inputs, int32_t* targets) override {
    inner_.next_batch(B, T, inputs, targets);
    last_sum = 0;
    for (int64_t i = 0; i < B * T; i++) last_sum += int64_t(inputs[i]) + int64_t(targets[i]);
  }
  uint64_t position() const override { return inner_.position(); }
  void seek(uint64_t position) override { inner_.seek(position); }
  int64_t last_sum = 0;

 private:
  InMemoryTokenStream inner_;
};

// bench/pytorch_train_step.py --serve as a child process, driven line by line over two pipes.
class PytorchWorker {
 public:
  PytorchWorker(int threads, const std::string& token_file) {
    int to_child[2], from_child[2];
    EXA_SYSCHECK(pipe(to_child) == 0 && pipe(from_child) == 0, "pipe");
    pid_ = fork();
    EXA_SYSCHECK(pid_ >= 0, "fork");
    if (pid_ == 0) {
      dup2(to_child[0], 0);
      dup2(from_child[1], 1);
      dup2(from_child[1], 2);
      close(to_child[1]);
      close(from_child[0]);
      const std::string script = std::string(EXATRAIN_BENCH_DIR) + "/pytorch_train_step.py";
      const std::string t = std::to_string(threads);
      execl("/usr/bin/python3", "python3", script.c_str(), "--serve", "--threads", t.c_str(),
            "--tokens", token_file.c_str(), (char*)nullptr);
      std::perror("execl /usr/bin/python3");
      _exit(127);
    }
    close(to_child[0]);
    close(from_child[1]);
    in_ = fdopen(from_child[0], "r");
    out_ = fdopen(to_child[1], "w");
    EXA_SYSCHECK(in_ != nullptr && out_ != nullptr, "fdopen");
    std::string line;
    while (read_line(line) && line != "ready\n") std::printf("  %s", line.c_str());
    EXA_CHECK(line == "ready\n", "pytorch worker ended before printing 'ready'");
  }
  ~PytorchWorker() {
    std::fputs("quit\n", out_);
    std::fclose(out_);
    std::fclose(in_);
    int status = 0;
    waitpid(pid_, &status, 0);
  }
  // Runs n steps; returns their times in ms (echoing the worker's step lines).
  std::vector<double> run(int n) {
    EXA_SYSCHECK(std::fprintf(out_, "steps %d\n", n) > 0 && std::fflush(out_) == 0,
                 "write to the pytorch worker");
    std::string line;
    while (read_line(line)) {
      if (line.rfind("round_ms=", 0) != 0) {
        std::printf("  %s", line.c_str());
        continue;
      }
      std::vector<double> ms;
      for (const char* p = line.c_str() + 9; *p;) {
        char* end = nullptr;
        ms.push_back(std::strtod(p, &end));
        if (*end != ',') break;
        p = end + 1;
      }
      EXA_CHECK(int(ms.size()) == n, "pytorch worker: '{}' should hold {} times", line, n);
      return ms;
    }
    EXA_FAIL("pytorch worker ended in the middle of a round");
  }

 private:
  bool read_line(std::string& line) {
    char buf[1024];
    line.clear();
    while (std::fgets(buf, sizeof buf, in_)) {
      line += buf;
      if (!line.empty() && line.back() == '\n') return true;
    }
    return !line.empty();
  }
  pid_t pid_ = -1;
  FILE* in_ = nullptr;
  FILE* out_ = nullptr;
};

}  // namespace

int main(int argc, char** argv) try {
  // libgomp reads OMP_WAIT_POLICY once at load time, so set it by re-executing ourselves.
  // passive: idle OpenMP threads sleep instead of spinning. On this shared 2-core machine the
  // spinning (active) policy made steps 1.3-2x slower whenever other processes were running;
  // PyTorch (its own OpenMP runtime) inherits the same environment.
  if (std::getenv("OMP_WAIT_POLICY") == nullptr) {
    EXA_SYSCHECK(setenv("OMP_WAIT_POLICY", "passive", 1) == 0, "setenv OMP_WAIT_POLICY");
    execv("/proc/self/exe", argv);
    EXA_SYSCHECK(false, "execv /proc/self/exe");
  }
  std::printf("OMP_WAIT_POLICY=%s\n", std::getenv("OMP_WAIT_POLICY"));
  int threads = 2, rounds = 5, steps = 3;
  bool pytorch = true;
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    if (a == "--threads" && i + 1 < argc) threads = std::atoi(argv[++i]);
    else if (a == "--rounds" && i + 1 < argc) rounds = std::atoi(argv[++i]);
    else if (a == "--steps" && i + 1 < argc) steps = std::atoi(argv[++i]);
    else if (a == "--no-pytorch") pytorch = false;
    else EXA_FAIL("unknown argument '{}' (--threads N, --rounds N, --steps N, "
                  "--no-pytorch)", a);
  }
  EXA_CHECK(threads >= 1 && rounds >= 1 && steps >= 1,
            "--threads, --rounds and --steps must be >= 1 (got {}, {}, {})", threads, rounds,
            steps);

  // The shared data: 100k random tokens, written for the PyTorch side (raw int32).
  std::mt19937 rng(1);
  std::vector<int32_t> tokens(100000);
  for (auto& t : tokens) t = int32_t(rng() % 50257);
  char token_file[] = "/tmp/exatrain_bench_tokens_XXXXXX";
  const int fd = mkstemp(token_file);
  EXA_SYSCHECK(fd >= 0, "mkstemp {}", token_file);
  const ssize_t want = ssize_t(tokens.size() * sizeof(int32_t));
  EXA_SYSCHECK(write(fd, tokens.data(), size_t(want)) == want && close(fd) == 0, "write {}",
               token_file);

  // Started before our model exists (a cheap fork) and waited for, so its set-up does not
  // overlap our sgemm measurement.
  std::unique_ptr<PytorchWorker> torch_worker;
  if (pytorch) torch_worker = std::make_unique<PytorchWorker>(threads, token_file);
  EXA_SYSCHECK(unlink(token_file) == 0, "unlink {}", token_file);  // the worker has read it

  auto be = make_cpu_backend(threads);
  const double peak = measure_sgemm_gflops(*be, 2048, 3);
  std::printf("OpenBLAS sgemm 2048^3 on %d threads: %.1f GFLOP/s\n", threads, peak);

  TrainerOptions o;  // ModelSpec defaults are GPT-2 124M
  o.model.vocab = 50257;
  o.seq = 64;  // 64-token sequences of the 1024-position model
  o.plan = single_rank_plan(/*micro_batch=*/4, /*micro_batches=*/1);
  o.train.lr = 6e-4;
  o.train.warmup_steps = 0;
  o.train.steps = 1000;
  o.peak_gflops = peak;
  ChecksummedStream data(tokens);
  auto rt = parallel::ParallelRuntime::local(*be);  // one rank, the same trainer as mpirun -np N
  Trainer tr(*be, *rt, o, data);
  std::printf("engine: %lld parameters, %.2f GFLOP per step (model FLOPs)\n",
              (long long)tr.model().num_params(), tr.model().flops_per_step() / 1e9);

  int our_step = 0;
  std::vector<double> gemm_ms, gemm_gflops;
  auto run_ours = [&](int n) {
    std::vector<double> ms;
    for (int s = 0; s < n; s++, our_step++) {
      be->gemm_seconds = be->gemm_flops = 0;
      const StepMetrics m = tr.train_step();
      std::printf("engine step %d loss %.4f batch_sum %lld %.0f ms (GEMM %.0f ms) "
                  "%.1f GFLOP/s MFU %.2f\n", our_step, m.loss, (long long)data.last_sum,
                  m.seconds * 1e3, be->gemm_seconds * 1e3, m.gflops, m.mfu);
      ms.push_back(m.seconds * 1e3);
      gemm_ms.push_back(be->gemm_seconds * 1e3);
      gemm_gflops.push_back(be->gemm_flops / be->gemm_seconds / 1e9);
    }
    return ms;
  };

  // Warm-up: one step each (first-touch page faults, OpenBLAS buffers, PyTorch allocator).
  run_ours(1);
  gemm_ms.clear();
  gemm_gflops.clear();
  if (torch_worker) torch_worker->run(1);

  std::vector<double> ours_all, torch_all, ratios;
  for (int r = 0; r < rounds; r++) {
    std::printf("-- round %d (%s first)\n", r + 1, r % 2 == 0 || !torch_worker ? "ours" : "pytorch");
    std::vector<double> ours, theirs;
    if (torch_worker && r % 2 == 1) theirs = torch_worker->run(steps);
    ours = run_ours(steps);
    if (torch_worker && r % 2 == 0) theirs = torch_worker->run(steps);
    ours_all.insert(ours_all.end(), ours.begin(), ours.end());
    if (!torch_worker) continue;
    torch_all.insert(torch_all.end(), theirs.begin(), theirs.end());
    ratios.push_back(median(theirs) / median(ours));
    std::printf("   round %d: ours %.0f ms, pytorch %.0f ms (medians), ratio %.2f\n", r + 1,
                median(ours), median(theirs), ratios.back());
  }
  torch_worker.reset();  // quit the worker before measuring the sgemm reference again

  // Measure the sgemm reference again after our steps and keep the better one: on a shared
  // machine a single measurement can land in a busy moment (MFU would then exceed 1).
  const double peak_after = measure_sgemm_gflops(*be, 2048, 3);
  std::printf("OpenBLAS sgemm 2048^3 after the steps: %.1f GFLOP/s\n", peak_after);
  const double peak_best = std::max(peak, peak_after);
  const double ours = median(ours_all);
  const double accounted = double(tr.accounted_bytes()), rss = double(peak_rss_bytes());
  const ModelMemory mm = tr.model().memory();

  std::printf("\n== GPT-2 124M train step, batch 4 x 64, %d threads, %d rounds x %d steps ==\n",
              threads, rounds, steps);
  std::printf("ours:    min %.0f ms, median %.0f ms per step\n", min_of(ours_all), ours);
  if (!ratios.empty()) {
    std::printf("pytorch: min %.0f ms, median %.0f ms per step\n", min_of(torch_all),
                median(torch_all));
    std::printf("per-round ratios (pytorch/ours):");
    for (double x : ratios) std::printf(" %.2f", x);
    std::printf("; median %.2f, spread %.2f - %.2f\n", median(ratios), min_of(ratios),
                max_of(ratios));
  }
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
  if (!ratios.empty()) std::printf("speedup_vs_pytorch=%.2f\n", median(ratios));
  else std::printf("speedup_vs_pytorch=nan\n");
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_train_step: %s\n", e.what());
  return 1;
}
