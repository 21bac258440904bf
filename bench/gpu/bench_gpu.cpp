// bench_gpu: the CUDA backend's figures on one GPU (bench/gpu/run.sh runs it; docs/cuda.md).
//   1. GEMM rates through the backend: cuBLASLt bf16 (gemm_half: bf16 in, fp32 accumulate and out)
//      and fp32 (TF32 off unless EXATRAIN_CUDA_TF32=1), square n^3, timed between device
//      synchronisations, median of --repeats.
//   2. Training steps of GPT-2 124M / 350M / 774M (the gpt2, gpt2-medium, gpt2-large presets'
//      shapes) on the trainer exactly as `exatrain train` builds it (one rank, AdamW, clip 1.0):
//      tokens/s and MFU, for each of --precisions (fp32, bf16). MFU is printed against the bf16
//      dense peak (--peak-bf16, 989 TFLOP/s for H100/H200 SXM), the fp32 peak (--peak-fp32,
//      67 TFLOP/s non-tensor-core fp32 of H100/H200 SXM; TF32 off) and the measured bf16 GEMM rate.
//      A bf16 run that made no gemm_half call (a check that the trainer's mixed precision,
//      docs/precision.md, reached the GEMMs) is reported as such, not as bf16.
//   bench_gpu [--models 124m,350m,774m] [--precisions fp32,bf16] [--batch 8] [--seq 1024] [--steps 3]
//             [--gemm 8192] [--repeats 5] [--peak-bf16 989] [--peak-fp32 67] [--vocab 50257] [--profile]
//   --vocab: the vocabulary (50304: GPT-2's padded to a multiple of 128, as llm.c and Megatron pad it, so
//   the head's GEMMs have aligned rows; the tokens stay below 50257).
//   --profile: the GPU time of each backend op over the timed steps (EXATRAIN_CUDA_PROFILE=1: an event
//   after every op, so the steps run slower; read the shares, not the speed).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "backend/cuda/cuda_backend.hpp"
#include "core/check.hpp"
#include "data/token_source.hpp"
#include "parallel/runtime.hpp"
#include "train/trainer.hpp"

using namespace exatrain;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// TFLOP/s of C[n,n] = A B on the device (A, B random; bf16 through gemm_half, or fp32 gemm).
double gemm_tflops(Backend& be, int64_t n, bool half, int repeats) {
  std::vector<float> h(size_t(n * n));
  std::mt19937 rng(1);
  std::normal_distribution<float> d(0, 1);
  for (auto& x : h) x = d(rng);
  float *a = be.alloc(n * n), *b = be.alloc(n * n), *c = be.alloc(n * n);
  be.upload(a, h.data(), 4 * h.size());
  be.upload(b, h.data(), 4 * h.size());
  auto* ah = static_cast<uint16_t*>(be.alloc_bytes(2 * h.size()));
  auto* bh = static_cast<uint16_t*>(be.alloc_bytes(2 * h.size()));
  be.f32_to_half(Half::bf16, ah, a, n * n);
  be.f32_to_half(Half::bf16, bh, b, n * n);
  auto run = [&] {
    if (half) be.gemm_half(Half::bf16, false, false, n, n, n, 1.0f, ah, n, bh, n, 0.0f, c, n);
    else be.gemm(false, false, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
  };
  run();  // warm-up: cuBLASLt's heuristic and kernels loaded
  be.synchronize();
  std::vector<double> s;
  for (int r = 0; r < repeats; r++) {
    const double t0 = now_s();
    run();
    be.synchronize();
    s.push_back(now_s() - t0);
  }
  be.free_bytes(a), be.free_bytes(b), be.free_bytes(c), be.free_bytes(ah), be.free_bytes(bh);
  return 2.0 * double(n) * double(n) * double(n) / median(s) / 1e12;
}

struct Shape {
  std::string name;
  int64_t layers, hidden, heads;
};

void train_model(Backend& be, const Shape& m, Precision precision, int64_t batch, int64_t seq, int steps,
                 double peak_bf16, double peak_fp32, double gemm_bf16, int64_t vocab) {
  TrainerOptions o;
  o.model.layers = m.layers;
  o.model.hidden = m.hidden;
  o.model.heads = o.model.kv_heads = m.heads;
  o.model.ffn_hidden = 4 * m.hidden;
  o.model.vocab = vocab;
  o.model.seq_len = 1024;
  o.seq = seq;
  o.plan = single_rank_plan(batch, 1);
  o.plan.precision = precision;
  o.train.lr = 6e-4;
  o.train.warmup_steps = 0;
  o.train.steps = 1000;
  o.peak_gflops = peak_bf16 * 1e3;
  std::mt19937 rng(1);
  std::vector<int32_t> tokens(size_t(batch * seq * (steps + 2) + 1));
  for (auto& t : tokens) t = int32_t(rng() % 50257);  // a padded --vocab's extra rows are never a target
  InMemoryTokenStream data(tokens);
  auto rt = parallel::ParallelRuntime::local(be);
  Trainer tr(be, *rt, o, data);
  std::printf("model %s: %lld parameters, batch %lld x %lld tokens, %.1f TFLOP per step (model FLOPs)\n",
              m.name.c_str(), (long long)tr.model().num_params(), (long long)batch, (long long)seq,
              tr.model().flops_per_step() / 1e12);
  std::fflush(stdout);
  const int64_t half_before = cuda_half_gemm_count(be);
  tr.train_step();  // warm-up: allocations, cuBLASLt heuristics
  const bool used_half = cuda_half_gemm_count(be) > half_before;
  if (precision != Precision::fp32 && !used_half) {
    std::printf("RESULT model=%s precision=%s not measured: the trainer made no 16-bit GEMM (no %s mixed precision "
                "in this build)\n", m.name.c_str(), to_string(precision), to_string(precision));
    return;
  }
  cuda_profile_reset(be);  // the timed steps only (EXATRAIN_CUDA_PROFILE=1, --profile)
  std::vector<double> sec, tps;
  for (int s = 0; s < steps; s++) {
    const StepMetrics x = tr.train_step();
    sec.push_back(x.seconds);
    tps.push_back(x.tokens_per_s);
    std::printf("  step %d loss %.4f %.3f s %.0f tokens/s\n", s + 1, x.loss, x.seconds, x.tokens_per_s);
  }
  const double tflops = tr.model().flops_per_step() / median(sec) / 1e12;
  const char* tf32 = std::getenv("EXATRAIN_CUDA_TF32");
  std::printf("RESULT model=%s precision=%s tf32=%s vocab=%lld tokens_per_s=%.0f step_s=%.3f model_tflops=%.1f mfu_vs_bf16_peak=%.4f "
              "mfu_vs_fp32_peak=%.3f fraction_of_measured_bf16_gemm=%.4f\n",
              m.name.c_str(), to_string(precision), tf32 && std::string(tf32) == "1" ? "on" : "off", (long long)vocab, median(tps),
              median(sec), tflops, tflops / peak_bf16, tflops / peak_fp32, tflops / gemm_bf16);
  std::printf("memory: %s\n", cuda_memory_stats(be).c_str());
  if (std::getenv("EXATRAIN_CUDA_PROFILE"))
    std::printf("profile of %d steps, model %s %s:\n%s", steps, m.name.c_str(), to_string(precision),
                cuda_profile_report(be).c_str());
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) try {
  std::string models = "124m,350m,774m", precisions = "fp32,bf16";
  int64_t batch = 8, seq = 1024, gemm_n = 8192, vocab = 50257;
  int steps = 3, repeats = 5;
  double peak_bf16 = 989, peak_fp32 = 67;
  for (int i = 1; i < argc; i++) {
    const std::string a = argv[i];
    auto next = [&] {
      EXA_CHECK(i + 1 < argc, "bench_gpu: {} needs a value", a);
      return std::string(argv[++i]);
    };
    if (a == "--models") models = next();
    else if (a == "--precisions") precisions = next();
    else if (a == "--batch") batch = std::stoll(next());
    else if (a == "--seq") seq = std::stoll(next());
    else if (a == "--steps") steps = std::stoi(next());
    else if (a == "--gemm") gemm_n = std::stoll(next());
    else if (a == "--repeats") repeats = std::stoi(next());
    else if (a == "--peak-bf16") peak_bf16 = std::stod(next());
    else if (a == "--peak-fp32") peak_fp32 = std::stod(next());
    else if (a == "--vocab") vocab = std::stoll(next());
    else if (a == "--profile") setenv("EXATRAIN_CUDA_PROFILE", "1", 1);  // read when the backend is made
    else EXA_FAIL("bench_gpu: unknown argument '{}' (--models, --precisions, --batch, --seq, --steps, --gemm, --repeats, "
                  "--peak-bf16, --peak-fp32, --vocab, --profile)", a);
  }
  EXA_CHECK(batch >= 1 && seq >= 1 && steps >= 1 && gemm_n >= 1 && repeats >= 1 && vocab >= 50257,
            "bench_gpu: --batch, --seq, --steps, --gemm and --repeats must be >= 1, --vocab >= 50257");
  auto be = make_backend("cuda");
  const double bf16 = gemm_tflops(*be, gemm_n, true, repeats);
  const double fp32 = gemm_tflops(*be, gemm_n / 2, false, repeats);
  std::printf("RESULT gemm bf16 %lld^3 (cuBLASLt, fp32 accumulate): %.1f TFLOP/s = %.3f of %.0f\n", (long long)gemm_n,
              bf16, bf16 / peak_bf16, peak_bf16);
  std::printf("RESULT gemm fp32 %lld^3 (cuBLASLt, TF32 %s): %.1f TFLOP/s = %.3f of %.0f\n", (long long)(gemm_n / 2),
              std::getenv("EXATRAIN_CUDA_TF32") ? "as EXATRAIN_CUDA_TF32" : "off", fp32, fp32 / peak_fp32, peak_fp32);
  std::fflush(stdout);
  const std::vector<Shape> all = {{"124m", 12, 768, 12}, {"350m", 24, 1024, 16}, {"774m", 36, 1280, 20}};
  std::stringstream list(models);
  for (std::string name; std::getline(list, name, ',');) {
    const Shape* m = nullptr;
    for (const Shape& s : all)
      if (s.name == name) m = &s;
    EXA_CHECK(m != nullptr, "bench_gpu: model '{}' is not one of 124m, 350m, 774m", name);
    std::stringstream plist(precisions);
    for (std::string p; std::getline(plist, p, ',');) {
      EXA_CHECK(p == "fp32" || p == "bf16", "bench_gpu: precision '{}' is not fp32 or bf16", p);
      try {  // one shape that does not fit (out of memory) leaves the others measured
        train_model(*be, *m, p == "fp32" ? Precision::fp32 : Precision::bf16, batch, seq, steps, peak_bf16, peak_fp32,
                    bf16, vocab);
      } catch (const std::exception& e) {
        std::printf("RESULT model=%s precision=%s failed: %s\n", m->name.c_str(), p.c_str(), e.what());
        std::fflush(stdout);
      }
    }
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_gpu: %s\n", e.what());
  return 1;
}
