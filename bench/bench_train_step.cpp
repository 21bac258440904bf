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
// Both precisions in one run (--precision fp32,bf16, the default): our fp32 step against PyTorch
// fp32, then our bf16 step (precision = "bf16", docs/precision.md) against PyTorch under
// torch.autocast("cpu", dtype=torch.bfloat16), same shapes and batches; a table of both at the
// end, with the host's sgemm rate and which bf16 GEMM path ran.
// Last lines: speedup_vs_pytorch_fp32=<median of the per-round ratios>, speedup_vs_pytorch_bf16=...
//   bench_train_step [--threads 2] [--rounds 5] [--steps 3] [--precision fp32|bf16|fp32,bf16] [--no-pytorch]
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
  PytorchWorker(int threads, const std::string& token_file, bool bf16) {
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
      if (bf16)
        execl("/usr/bin/python3", "python3", script.c_str(), "--serve", "--threads", t.c_str(), "--tokens",
              token_file.c_str(), "--bf16", (char*)nullptr);
      else
        execl("/usr/bin/python3", "python3", script.c_str(), "--serve", "--threads", t.c_str(), "--tokens",
              token_file.c_str(), (char*)nullptr);
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

struct Args {
  int threads = 2, rounds = 5, steps = 3;
  bool pytorch = true;
};

// One precision's comparison: our step at `prec` against PyTorch's (fp32, or bf16 autocast).
struct Comparison {
  std::string name;
  std::vector<double> ours_all, torch_all, ratios, gemm_ms, gemm_gflops;
  double model_gflop = 0, accounted = 0;
  ModelMemory mm;
  double state_bytes = 0;
  std::string gemm_path;
};

Comparison compare(Precision prec, const Args& a, const std::vector<int32_t>& tokens, const std::string& token_file,
                   double peak) {
  Comparison c;
  c.name = prec == Precision::fp32 ? "fp32" : "bf16";
  std::printf("\n==== %s: ours (precision = \"%s\") vs PyTorch %s ====\n", c.name.c_str(), c.name.c_str(),
              prec == Precision::fp32 ? "fp32" : "torch.autocast(\"cpu\", dtype=torch.bfloat16)");
  // Started before our model exists (a cheap fork) and waited for, so its set-up does not
  // overlap our steps.
  std::unique_ptr<PytorchWorker> torch_worker;
  if (a.pytorch) torch_worker = std::make_unique<PytorchWorker>(a.threads, token_file, prec != Precision::fp32);
  auto be = make_cpu_backend(a.threads);
  c.gemm_path = prec == Precision::fp32 ? "OpenBLAS sgemm" : be->gemm_half_path(Half::bf16);
  std::printf("our GEMMs: %s\n", c.gemm_path.c_str());
  TrainerOptions o;  // ModelSpec defaults are GPT-2 124M
  o.model.vocab = 50257;
  o.seq = 64;  // 64-token sequences of the 1024-position model
  o.plan = single_rank_plan(/*micro_batch=*/4, /*micro_batches=*/1);
  o.plan.precision = prec;
  o.train.lr = 6e-4;
  o.train.warmup_steps = 0;
  o.train.steps = 1000;
  o.peak_gflops = peak;
  ChecksummedStream data(tokens);
  auto rt = parallel::ParallelRuntime::local(*be);  // one rank, the same trainer as mpirun -np N
  Trainer tr(*be, *rt, o, data);
  c.model_gflop = tr.model().flops_per_step() / 1e9;
  std::printf("engine: %lld parameters, %.2f GFLOP per step (model FLOPs)\n", (long long)tr.model().num_params(),
              c.model_gflop);

  int our_step = 0;
  auto run_ours = [&](int n) {
    std::vector<double> ms;
    for (int s = 0; s < n; s++, our_step++) {
      be->gemm_seconds = be->gemm_flops = 0;
      const StepMetrics m = tr.train_step();
      std::printf("engine step %d loss %.4f batch_sum %lld %.0f ms (GEMM %.0f ms) %.1f GFLOP/s MFU %.2f\n", our_step,
                  m.loss, (long long)data.last_sum, m.seconds * 1e3, be->gemm_seconds * 1e3, m.gflops, m.mfu);
      ms.push_back(m.seconds * 1e3);
      c.gemm_ms.push_back(be->gemm_seconds * 1e3);
      c.gemm_gflops.push_back(be->gemm_flops / be->gemm_seconds / 1e9);
    }
    return ms;
  };
  // Warm-up: one step each (first-touch page faults, OpenBLAS buffers, oneDNN's JIT, PyTorch's allocator).
  run_ours(1);
  c.gemm_ms.clear();
  c.gemm_gflops.clear();
  if (torch_worker) torch_worker->run(1);
  for (int r = 0; r < a.rounds; r++) {
    std::printf("-- round %d (%s first)\n", r + 1, r % 2 == 0 || !torch_worker ? "ours" : "pytorch");
    std::vector<double> ours, theirs;
    if (torch_worker && r % 2 == 1) theirs = torch_worker->run(a.steps);
    ours = run_ours(a.steps);
    if (torch_worker && r % 2 == 0) theirs = torch_worker->run(a.steps);
    c.ours_all.insert(c.ours_all.end(), ours.begin(), ours.end());
    if (!torch_worker) continue;
    c.torch_all.insert(c.torch_all.end(), theirs.begin(), theirs.end());
    c.ratios.push_back(median(theirs) / median(ours));
    std::printf("   round %d: ours %.0f ms, pytorch %.0f ms (medians), ratio %.2f\n", r + 1, median(ours),
                median(theirs), c.ratios.back());
  }
  c.accounted = double(tr.accounted_bytes());
  c.mm = tr.model().memory();
  c.state_bytes = double(tr.optimizer().state_bytes());
  return c;
}

void summarize(const Comparison& c, const Args& a, double peak_best) {
  const double ours = median(c.ours_all);
  std::printf("\n-- %s (our GEMMs: %s) --\n", c.name.c_str(), c.gemm_path.c_str());
  std::printf("ours:    min %.0f ms, median %.0f ms per step\n", min_of(c.ours_all), ours);
  if (!c.ratios.empty()) {
    std::printf("pytorch: min %.0f ms, median %.0f ms per step\n", min_of(c.torch_all), median(c.torch_all));
    std::printf("per-round ratios (pytorch/ours):");
    for (double x : c.ratios) std::printf(" %.2f", x);
    std::printf("; median %.2f, spread %.2f - %.2f\n", median(c.ratios), min_of(c.ratios), max_of(c.ratios));
  }
  std::printf("GEMM share of our step: %.0f%% (%.0f ms)\n", 100 * median(c.gemm_ms) / ours, median(c.gemm_ms));
  std::printf("our GEMM throughput: %.1f GFLOP/s vs OpenBLAS sgemm 2048^3 %.1f GFLOP/s (%.0f%%)\n",
              median(c.gemm_gflops), peak_best, 100 * median(c.gemm_gflops) / peak_best);
  const double model_gflops = c.model_gflop / (ours / 1e3);
  std::printf("model FLOP/s: %.1f GFLOP/s, MFU %.2f (vs the better sgemm measurement)\n", model_gflops,
              model_gflops / peak_best);
  std::printf("memory accounted %.0f MiB (params %.0f incl. any 16-bit copy, grads %.0f, AdamW %.0f, activations "
              "%.0f)\n", c.accounted / 1048576, c.mm.params / 1048576.0, c.mm.grads / 1048576.0,
              c.state_bytes / 1048576.0, c.mm.activations / 1048576.0);
  (void)a;
}

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
  Args a;
  std::string precisions = "fp32,bf16";
  for (int i = 1; i < argc; i++) {
    std::string s = argv[i];
    if (s == "--threads" && i + 1 < argc) a.threads = std::atoi(argv[++i]);
    else if (s == "--rounds" && i + 1 < argc) a.rounds = std::atoi(argv[++i]);
    else if (s == "--steps" && i + 1 < argc) a.steps = std::atoi(argv[++i]);
    else if (s == "--precision" && i + 1 < argc) precisions = argv[++i];
    else if (s == "--no-pytorch") a.pytorch = false;
    else EXA_FAIL("unknown argument '{}' (--threads N, --rounds N, --steps N, --precision fp32|bf16|fp32,bf16, "
                  "--no-pytorch)", s);
  }
  EXA_CHECK(a.threads >= 1 && a.rounds >= 1 && a.steps >= 1,
            "--threads, --rounds and --steps must be >= 1 (got {}, {}, {})", a.threads, a.rounds, a.steps);
  std::vector<Precision> precs;
  if (precisions == "fp32" || precisions == "fp32,bf16") precs.push_back(Precision::fp32);
  if (precisions == "bf16" || precisions == "fp32,bf16") precs.push_back(Precision::bf16);
  EXA_CHECK(!precs.empty(), "--precision {}: expected fp32, bf16 or fp32,bf16", precisions);

  // The shared data: 100k random tokens, written for the PyTorch side (raw int32).
  std::mt19937 rng(1);
  std::vector<int32_t> tokens(100000);
  for (auto& t : tokens) t = int32_t(rng() % 50257);
  char token_file[] = "/tmp/exatrain_bench_tokens_XXXXXX";
  const int fd = mkstemp(token_file);
  EXA_SYSCHECK(fd >= 0, "mkstemp {}", token_file);
  const ssize_t want = ssize_t(tokens.size() * sizeof(int32_t));
  EXA_SYSCHECK(write(fd, tokens.data(), size_t(want)) == want && close(fd) == 0, "write {}", token_file);

  double peak = 0;
  {
    auto be = make_cpu_backend(a.threads);
    peak = measure_sgemm_gflops(*be, 2048, 3);
  }
  std::printf("OpenBLAS sgemm 2048^3 on %d threads: %.1f GFLOP/s\n", a.threads, peak);
  std::vector<Comparison> results;
  for (Precision p : precs) results.push_back(compare(p, a, tokens, token_file, peak));
  EXA_SYSCHECK(unlink(token_file) == 0, "unlink {}", token_file);

  // Measure the sgemm reference again after our steps and keep the better one: on a shared
  // machine a single measurement can land in a busy moment (MFU would then exceed 1).
  double peak_after = 0;
  {
    auto be = make_cpu_backend(a.threads);
    peak_after = measure_sgemm_gflops(*be, 2048, 3);
  }
  std::printf("OpenBLAS sgemm 2048^3 after the steps: %.1f GFLOP/s\n", peak_after);
  const double peak_best = std::max(peak, peak_after);
  std::printf("\n== GPT-2 124M train step, batch 4 x 64, %d threads, %d rounds x %d steps per precision ==\n",
              a.threads, a.rounds, a.steps);
  for (const Comparison& c : results) summarize(c, a, peak_best);
  if (results.size() == 2) {
    std::printf("\n%-6s %12s %14s %22s\n", "", "ours (ms)", "pytorch (ms)", "pytorch/ours (median)");
    for (const Comparison& c : results)
      std::printf("%-6s %12.0f %14.0f %22.2f\n", c.name.c_str(), median(c.ours_all),
                  c.torch_all.empty() ? NAN : median(c.torch_all), c.ratios.empty() ? NAN : median(c.ratios));
    std::printf("our bf16 step / our fp32 step: %.2f\n", median(results[1].ours_all) / median(results[0].ours_all));
  }
  for (const Comparison& c : results) {
    if (!c.ratios.empty()) std::printf("speedup_vs_pytorch_%s=%.2f\n", c.name.c_str(), median(c.ratios));
    else std::printf("speedup_vs_pytorch_%s=nan\n", c.name.c_str());
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_train_step: %s\n", e.what());
  return 1;
}
