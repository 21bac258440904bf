// CudaBackend: memory, streams, GEMMs (cuBLASLt) and the kernels' launches (cuda_backend.hpp says
// what runs where; the kernels are cuda_kernels.cu, the host fallbacks cuda_backend_fallback.cpp).
#include <fmt/format.h>

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <string>

#include "backend/cuda/cuda_backend_impl.hpp"

namespace exatrain {
namespace {

// The node-local rank from the launcher's environment (one rank per GPU), 0 without one.
int local_rank() {
  for (const char* var : {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID", "LOCAL_RANK"})
    if (const char* v = std::getenv(var)) return std::atoi(v);
  return 0;
}

constexpr size_t kWorkspaceBytes = size_t(32) << 20;  // cuBLASLt's workspace (H100: 32 MiB recommended)

}  // namespace

const LtApi& lt_api() {
  static LtApi api;
  static std::once_flag once;
  std::call_once(once, [] {
    void* lib = nullptr;
    std::string tried;
    // The soname of the toolkit built against, then the unversioned name, then the build's own copy.
    for (const char* name : {"libcublasLt.so." EXATRAIN_CUBLAS_MAJOR, "libcublasLt.so", EXATRAIN_CUBLASLT_PATH}) {
      if ((lib = dlopen(name, RTLD_NOW | RTLD_LOCAL))) break;
      tried += fmt::format("{}{} ({})", tried.empty() ? "" : ", ", name, dlerror());
    }
    EXA_CHECK(lib != nullptr, "cuda backend: cannot load cuBLASLt: tried {}", tried);
#define EXA_LT_LOAD(f)                                                                                   \
  api.f = reinterpret_cast<decltype(api.f)>(dlsym(lib, #f));                                             \
  EXA_CHECK(api.f != nullptr, "cuda backend: cuBLASLt has no symbol {} ({})", #f, dlerror());
    EXA_LT_FUNCTIONS(EXA_LT_LOAD)
#undef EXA_LT_LOAD
  });
  return api;
}

// One GEMM shape's cuBLASLt descriptors and the algorithm the heuristic chose for it, built on the
// shape's first call and reused by every later one: a training step calls the same few dozen
// shapes thousands of times, and creating the descriptors and querying the heuristic costs host
// microseconds per call, as much as a small GEMM's run (llm.c and PyTorch's cuBLASLt path cache
// them too). The key holds every input of the descriptors and the heuristic, alignments included.
struct LtPlan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  ~LtPlan() {
    for (auto* l : {a, b, c})
      if (l) lt_api().cublasLtMatrixLayoutDestroy(l);
    if (op) lt_api().cublasLtMatmulDescDestroy(op);
  }
};

CudaBackend::CudaBackend(int device) : device_(device), compute_(device) {
  EXA_CUBLAS(lt_api().cublasLtCreate(&lt_));
  EXA_CUDA(cudaMalloc(&workspace_, kWorkspaceBytes));
  EXA_CUDA(cudaMalloc(&reduce_scratch_, sizeof(double) * (cuda::kReduceBlocks + 1)));
  EXA_CUDA(cudaMallocHost(&reduce_host_, sizeof(double)));
  const char* tf32 = std::getenv("EXATRAIN_CUDA_TF32");
  const std::string tf32_value = tf32 ? tf32 : "";
  EXA_CHECK(tf32_value.empty() || tf32_value == "0" || tf32_value == "1" || tf32_value == "attention",
            "cuda backend: EXATRAIN_CUDA_TF32='{}': expected 0, 1 (every fp32 GEMM on TF32) or attention "
            "(attention's GEMMs only)", tf32_value);
  tf32_ = tf32_value == "1";
  tf32_attention_ = tf32_value == "attention";
  const char* flash = std::getenv("EXATRAIN_CUDA_FLASH");
  const std::string flash_value = flash ? flash : "";
  EXA_CHECK(flash_value.empty() || flash_value == "0" || flash_value == "1",
            "cuda backend: EXATRAIN_CUDA_FLASH='{}': expected 1 (the default: the fused attention kernel under "
            "mixed precision) or 0 (float32 GEMMs around the softmax, as for fp32)", flash_value);
  flash_ = flash_value != "0";
  int optin = 0;
  EXA_CUDA(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device_));
  smem_optin_ = size_t(optin);
  const char* profile = std::getenv("EXATRAIN_CUDA_PROFILE");
  profile_.on = profile != nullptr && std::string(profile) == "1";
  cpu_ = make_cpu_backend(0);
}

void CudaBackend::launched(const char* op) {
  const cudaError_t err = cudaGetLastError();
  EXA_CHECK(err == cudaSuccess, "cuda backend: {}: kernel launch failed: {} ({})", op, cudaGetErrorString(err),
            cudaGetErrorName(err));
  mark(op);
}

// ---- the per-op profile (EXATRAIN_CUDA_PROFILE=1) ---------------------------------------------------
void CudaBackend::mark(const char* op) {
  if (profile_.on && profile_.scope == nullptr) mark(std::string(op));
}

void CudaBackend::mark(std::string op) {
  if (!profile_.on || profile_.scope != nullptr) return;
  cudaEvent_t e = nullptr;
  EXA_CUDA(cudaEventCreate(&e));
  EXA_CUDA(cudaEventRecord(e, cs()));
  profile_.pending.emplace_back(std::move(op), e);
  if (profile_.pending.size() >= 4096) profile_flush();
}

void CudaBackend::profile_flush() {
  for (auto& [op, e] : profile_.pending) {
    EXA_CUDA(cudaEventSynchronize(e));
    if (profile_.last != nullptr) {
      float ms = 0;
      EXA_CUDA(cudaEventElapsedTime(&ms, profile_.last, e));
      auto& t = profile_.totals[op];
      t.first += ms;
      t.second++;
      EXA_CUDA(cudaEventDestroy(profile_.last));
    }
    profile_.last = e;
  }
  profile_.pending.clear();
}

void CudaBackend::profile_reset() {
  if (!profile_.on) return;
  mark("(before the reset)");
  profile_flush();
  profile_.totals.clear();
}

std::string CudaBackend::profile_report() {
  if (!profile_.on) return "profile off (EXATRAIN_CUDA_PROFILE=1 turns it on)\n";
  profile_flush();
  std::vector<std::pair<double, std::string>> rows;
  double total = 0;
  for (const auto& [op, t] : profile_.totals) {
    rows.emplace_back(t.first, op);
    total += t.first;
  }
  std::sort(rows.rbegin(), rows.rend());
  std::string out = fmt::format("{:<44} {:>8} {:>11} {:>7} {:>11}\n", "op", "calls", "total ms", "share", "us/call");
  for (const auto& [ms, op] : rows) {
    const int64_t calls = profile_.totals[op].second;
    out += fmt::format("{:<44} {:>8} {:>11.3f} {:>6.1f}% {:>11.1f}\n", op, calls, ms, 100.0 * ms / std::max(total, 1e-9),
                       1e3 * ms / double(std::max<int64_t>(calls, 1)));
  }
  return out + fmt::format("{:<44} {:>8} {:>11.3f}\n", "all", "", total);
}

// The CPU backend's page rule (cpu_backend.cpp) on 4096-byte pages of the device address space:
// whole pages inside the free range read 0, the rest of [x, x+n) partial_fill. Nothing goes back to
// the driver: a block of the caching allocator cannot be partly freed (docs/cuda.md: ZeRO-3's
// release saves no GPU memory yet).
void CudaBackend::release(float* x, int64_t n, float partial_fill, const float* free_begin, const float* free_end) {
  EXA_CHECK(free_begin <= x && x + n <= free_end, "cuda backend: release of [{}, {}) outside the free range [{}, {})",
            static_cast<const void*>(x), static_cast<const void*>(x + n), static_cast<const void*>(free_begin),
            static_cast<const void*>(free_end));
  if (n <= 0) return;
  const uintptr_t page = 4096, b = uintptr_t(x), e = uintptr_t(x + n);
  uintptr_t lo = (b + page - 1) / page * page, hi = e / page * page;
  if (b / page * page >= uintptr_t(free_begin)) lo = b / page * page;
  if ((e + page - 1) / page * page <= uintptr_t(free_end)) hi = (e + page - 1) / page * page;
  if (hi <= lo) return fill(x, partial_fill, n);
  if (b < lo) fill(x, partial_fill, int64_t((lo - b) / sizeof(float)));
  if (hi < e) fill(reinterpret_cast<float*>(hi), partial_fill, int64_t((e - hi) / sizeof(float)));
  zero(reinterpret_cast<void*>(lo), hi - lo);  // as madvise: whole pages, inside the free range
}

void CudaBackend::check_heads(int64_t T, int64_t Hq, int64_t Hkv, int64_t B, const char* op) const {
  EXA_CHECK(Hkv > 0 && Hq % Hkv == 0, "cuda backend: {}: {} query heads are not a multiple of {} key-value heads", op,
            Hq, Hkv);
  EXA_CHECK(Hq <= 65535 && B <= 65535 && T < (int64_t(1) << 31) - 64,
            "cuda backend: {}: grid (T = {}, heads = {}, B = {}) beyond CUDA's limits (65535 heads, 65535 batch)", op, T,
            Hq, B);
}

// The fused kernel's parameters (flash_attention.hpp): `saved` holds lse, then the 16-bit output.
cuda::flash::Params CudaBackend::flash_params(float* out, float* saved, const float* qkv, const float* dout,
                                              float* dqkv, int64_t B, int64_t T, int64_t Hq, int64_t Hkv,
                                              int64_t D) {
  cuda::flash::Params p;
  p.qkv = qkv;
  p.out = out;
  p.lse = cuda::flash::saved_lse(saved);
  p.o16 = cuda::flash::saved_o16(saved, B, T, Hq);
  p.dout = dout;
  p.dqkv = dqkv;
  p.B = int(B), p.T = int(T), p.Hq = int(Hq), p.Hkv = int(Hkv);
  p.scale = 1.0f / std::sqrt(float(D));
  return p;
}

// Without the fused kernel (float32 operands, or a head size it was not compiled for):
// attention (its saved state: the probabilities [B,Hq,T,T], materialised) as cuBLASLt GEMMs around the
// softmax kernels. For batch b and group member g, the query heads h = kvh * group + g (kvh < Hkv)
// are one strided batch of Hkv matrices: q_h at h * D (stride group * D), its kv head's k and v at
// (Hq + kvh) * D and (Hq + Hkv + kvh) * D (stride D), its scores at (b Hq + h) T T (stride group T T).
// All T x T scores are computed (the causal half above the diagonal too) and masked by the softmax.
// Forward: S = (q k^T) / sqrt(D), P = causal softmax(S), out_h = P v. Backward: dP = dout_h v^T,
// dS = P (dP - rowsum(P dP)) / sqrt(D), dq_h = dS k, dk = sum_g dS^T q_h, dv = sum_g P^T dout_h (the
// group's heads in order, beta 0 then 1: no atomics). Every GEMM is fp32 (TF32 as gemm's).
void CudaBackend::attention_forward(float* out, float* probs, const float* qkv, int64_t B, int64_t T, int64_t Hq,
                                    int64_t Hkv, int64_t D, std::optional<Half> operands) {
  check_heads(T, Hq, Hkv, B, "attention_forward");
  if (B * T * Hq <= 0) return;
  if (fused_attention(D, operands)) {
    const cuda::flash::Params p = flash_params(out, probs, qkv, nullptr, nullptr, B, T, Hq, Hkv, D);
    EXA_CUDA(cuda::flash_forward(cs(), *operands == Half::bf16 ? 0 : 1, D, p));
    launched("attention_forward");
    return;
  }
  const int64_t W = (Hq + 2 * Hkv) * D, G = Hq / Hkv;  // qkv's row width, the query heads per kv head
  const float scale = 1.0f / std::sqrt(float(D));
  AttentionScope scope(*this, "attention_forward");
  for (int64_t b = 0; b < B; b++)
    for (int64_t g = 0; g < G; g++) {
      const float* q = qkv + b * T * W + g * D;  // [T, D] rows W apart
      const float* k = qkv + b * T * W + Hq * D;
      matmul(CUDA_R_32F, false, true, T, T, D, scale, q, W, G * D, k, W, D, 0.0f, probs + (b * Hq + g) * T * T, T,
             G * T * T, Hkv);
    }
  cuda::causal_softmax(cs(), probs, B * Hq * T, T);
  if (out != nullptr)
    for (int64_t b = 0; b < B; b++)
      for (int64_t g = 0; g < G; g++) {
        const float* v = qkv + b * T * W + (Hq + Hkv) * D;
        matmul(CUDA_R_32F, false, false, T, D, T, 1.0f, probs + (b * Hq + g) * T * T, T, G * T * T, v, W, D, 0.0f,
               out + b * T * Hq * D + g * D, Hq * D, G * D, Hkv);
      }
  scope.end();
  launched("attention_forward");
}

void CudaBackend::attention_backward(float* dqkv, const float* dout, const float* qkv, const float* probs, int64_t B,
                                     int64_t T, int64_t Hq, int64_t Hkv, int64_t D, std::optional<Half> operands) {
  check_heads(T, Hq, Hkv, B, "attention_backward");
  if (fused_attention(D, operands)) {
    if (B * T * Hq <= 0) return;
    const cuda::Scratch delta(alloc_, sizeof(float) * size_t(B * Hq * T));  // rowsum(dout * out) [B, Hq, T]
    // the kernels only read `saved` (lse, o16), as its const promises; Params has one pointer for both passes
    cuda::flash::Params p = flash_params(nullptr, const_cast<float*>(probs), qkv, dout, dqkv, B, T, Hq, Hkv, D);
    p.delta = delta.get<float>();
    EXA_CUDA(cuda::flash_backward(cs(), *operands == Half::bf16 ? 0 : 1, D, p));
    launched("attention_backward");
    return;
  }
  const size_t bytes = sizeof(float) * size_t(B * Hq * T * T);
  if (bytes == 0) return;
  const int64_t W = (Hq + 2 * Hkv) * D, G = Hq / Hkv, HD = Hq * D;
  const cuda::Scratch dscores(alloc_, bytes);  // the scores' gradients [B, Hq, T, T]
  float* ds = dscores.get<float>();
  AttentionScope scope(*this, "attention_backward");
  for (int64_t b = 0; b < B; b++)
    for (int64_t g = 0; g < G; g++)  // dP = dout_h v^T
      matmul(CUDA_R_32F, false, true, T, T, D, 1.0f, dout + b * T * HD + g * D, HD, G * D,
             qkv + b * T * W + (Hq + Hkv) * D, W, D, 0.0f, ds + (b * Hq + g) * T * T, T, G * T * T, Hkv);
  cuda::causal_softmax_backward(cs(), ds, probs, B * Hq * T, T, 1.0f / std::sqrt(float(D)));
  for (int64_t b = 0; b < B; b++)
    for (int64_t g = 0; g < G; g++) {
      const float* dsg = ds + (b * Hq + g) * T * T;
      const float* pg = probs + (b * Hq + g) * T * T;
      const float* q = qkv + b * T * W + g * D;
      const float* k = qkv + b * T * W + Hq * D;
      float* dq = dqkv + b * T * W + g * D;
      float* dk = dqkv + b * T * W + Hq * D;
      float* dv = dqkv + b * T * W + (Hq + Hkv) * D;
      const float beta = g == 0 ? 0.0f : 1.0f;
      matmul(CUDA_R_32F, false, false, T, D, T, 1.0f, dsg, T, G * T * T, k, W, D, 0.0f, dq, W, G * D, Hkv);
      matmul(CUDA_R_32F, true, false, T, D, T, 1.0f, dsg, T, G * T * T, q, W, G * D, beta, dk, W, D, Hkv);
      matmul(CUDA_R_32F, true, false, T, D, T, 1.0f, pg, T, G * T * T, dout + b * T * HD + g * D, HD, G * D, beta, dv,
             W, D, Hkv);
    }
  scope.end();
  launched("attention_backward");
}

double CudaBackend::reduce(int kind, const float* a, const float* b, int64_t n, const char* op) {
  if (n <= 0) return 0.0;
  cuda::reduce_double(cs(), kind, a, b, n, reduce_scratch_, reduce_scratch_ + cuda::kReduceBlocks);
  launched(op);
  EXA_CUDA(cudaMemcpyAsync(reduce_host_, reduce_scratch_ + cuda::kReduceBlocks, sizeof(double),
                           cudaMemcpyDeviceToHost, cs()));
  EXA_CUDA(cudaStreamSynchronize(cs()));
  return *reduce_host_;
}

namespace {

// A column-major rows x cols layout with leading dimension ld, `batch` of them `stride` apart.
void make_layout(cublasLtMatrixLayout_t* l, cudaDataType type, int64_t rows, int64_t cols, int64_t ld, int64_t stride,
                 int64_t batch) {
  EXA_CUBLAS(lt_api().cublasLtMatrixLayoutCreate(l, type, uint64_t(rows), uint64_t(cols), ld));
  if (batch <= 1) return;
  const int32_t count = int32_t(batch);
  EXA_CUBLAS(lt_api().cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
  EXA_CUBLAS(lt_api().cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
}

// The alignment cuBLASLt may assume of p (the heuristic otherwise assumes 256 bytes).
uint32_t alignment_of(const void* p) {
  uint32_t a = 256;
  while (a > 1 && uintptr_t(p) % a != 0) a /= 2;
  return a;
}

// The alignment of every row and every batch entry of an operand: its base's, and no more than
// its leading dimension's and (batched) its stride's in bytes allow. Matrix i of a batch starts at
// base + i * stride * esz, so a base alone overstates it (a misaligned-address fault, sticky).
uint32_t operand_alignment(const void* p, int64_t ld, int64_t stride, int64_t batch, int64_t esz) {
  uint32_t a = std::min(alignment_of(p), alignment_of(reinterpret_cast<const void*>(uintptr_t(ld * esz))));
  if (batch > 1) a = std::min(a, alignment_of(reinterpret_cast<const void*>(uintptr_t(stride * esz))));
  return a;
}

}  // namespace

namespace {

// The preference of one heuristic query: the workspace and the operands' alignments.
struct LtPreference {
  cublasLtMatmulPreference_t pref = nullptr;
  LtPreference(uint32_t align_first, uint32_t align_second, uint32_t align_c) {
    EXA_CUBLAS(lt_api().cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t ws = kWorkspaceBytes;
    set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
    set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_first, sizeof(uint32_t));
    set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_second, sizeof(uint32_t));
    set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c, sizeof(uint32_t));
    set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c, sizeof(uint32_t));
  }
  void set(cublasLtMatmulPreferenceAttributes_t attr, const void* v, size_t n) const {
    EXA_CUBLAS(lt_api().cublasLtMatmulPreferenceSetAttribute(pref, attr, v, n));
  }
  ~LtPreference() {
    if (pref) lt_api().cublasLtMatmulPreferenceDestroy(pref);
  }
};

}  // namespace

int64_t CudaBackend::scratch_bytes() const { return int64_t(kWorkspaceBytes); }

CudaBackend::~CudaBackend() {
  // A backend destroyed at exit after the CUDA runtime has unloaded (a static's destructor) frees
  // nothing: the driver takes the context's memory back with the process.
  if (cudaStreamSynchronize(cs()) == cudaErrorCudartUnloading) {
    alloc_.abandon();
    return;
  }
  lt_plans_.clear();
  for (auto& [op, e] : profile_.pending) cudaEventDestroy(e);
  if (profile_.last != nullptr) cudaEventDestroy(profile_.last);
  lt_api().cublasLtDestroy(lt_);
  cudaFree(workspace_);
  cudaFree(reduce_scratch_);
  cudaFreeHost(reduce_host_);
}

// The cached plan of a GEMM (LtPlan), made on the shape's first call.
const LtPlan& CudaBackend::lt_plan(const LtKey& key) {
  auto& slot = lt_plans_[key];
  if (slot) return *slot;
  const auto [ab, compute, ta, tb, M, N, K, lda, ldb, ldc, stride_a, stride_b, stride_c, batch, align_first,
              align_second, align_c] = key;
  auto plan = std::make_unique<LtPlan>();
  EXA_CUBLAS(lt_api().cublasLtMatmulDescCreate(&plan->op, cublasComputeType_t(compute), CUDA_R_32F));
  const cublasOperation_t op_first = tb ? CUBLAS_OP_T : CUBLAS_OP_N, op_second = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  EXA_CUBLAS(lt_api().cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSA, &op_first, sizeof(op_first)));
  EXA_CUBLAS(lt_api().cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSB, &op_second, sizeof(op_second)));
  const auto type = cudaDataType(ab);
  make_layout(&plan->a, type, tb ? K : N, tb ? N : K, ldb, stride_b, batch);
  make_layout(&plan->b, type, ta ? M : K, ta ? K : M, lda, stride_a, batch);
  make_layout(&plan->c, CUDA_R_32F, N, M, ldc, stride_c, batch);
  const LtPreference pref{static_cast<uint32_t>(align_first), static_cast<uint32_t>(align_second),
                          static_cast<uint32_t>(align_c)};
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  EXA_CUBLAS(lt_api().cublasLtMatmulAlgoGetHeuristic(lt_, plan->op, plan->a, plan->b, plan->c, plan->c, pref.pref, 1,
                                                     &result, &found));
  EXA_CHECK(found > 0, "cuda backend: cuBLASLt has no algorithm for the GEMM M={} N={} K={} (ta={}, tb={}, lda={}, "
            "ldb={}, ldc={}, batch={}, {})", M, N, K, ta, tb, lda, ldb, ldc, batch, type == CUDA_R_32F ? "fp32" : "16-bit");
  plan->algo = result.algo;
  slot = std::move(plan);
  return *slot;
}

void CudaBackend::matmul(cudaDataType ab, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                         const void* A, int64_t lda, int64_t stride_a, const void* B, int64_t ldb, int64_t stride_b,
                         float beta, float* C, int64_t ldc, int64_t stride_c, int64_t batch) {
  gemm_flops += 2.0 * double(M) * double(N) * double(K) * double(std::max<int64_t>(batch, 0));
  if (M <= 0 || N <= 0 || batch <= 0) return;
  if (K <= 0) {  // C = beta C (cuBLASLt refuses K = 0): on the host, rare
    for (int64_t i = 0; i < batch; i++) {
      std::vector<float> h(size_t(M * N));
      EXA_CUDA(cudaMemcpy2DAsync(h.data(), N * 4, C + i * stride_c, ldc * 4, N * 4, M, cudaMemcpyDeviceToHost, cs()));
      EXA_CUDA(cudaStreamSynchronize(cs()));
      for (float& x : h) x = beta == 0.0f ? 0.0f : beta * x;
      EXA_CUDA(cudaMemcpy2DAsync(C + i * stride_c, ldc * 4, h.data(), N * 4, N * 4, M, cudaMemcpyHostToDevice, cs()));
      EXA_CUDA(cudaStreamSynchronize(cs()));
    }
    return;
  }
  matmul_lt(ab, ta, tb, M, N, K, alpha, A, lda, stride_a, B, ldb, stride_b, beta, C, ldc, stride_c, batch);
}

// GEMMs whose rows are not a multiple of 16 bytes apart make cuBLASLt pick slow kernels (on the
// H100, 6.6 ms for GPT-2's 8192 x 50257 x 768 logits against 1.1 ms at 50,304: bench_gpu --profile,
// docs/cuda.md); the model pads the logits' rows for that reason (Gpt::logits_ld), so no operand is
// copied here: the real alignment is told to the heuristic (operand_alignment) and it chooses.
//
// Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: cuBLASLt's first operand is B
// (stored [K,N] column-major as N x K when !tb), its second A, and C is N x M column-major.
void CudaBackend::matmul_lt(cudaDataType ab, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                            const void* A, int64_t lda, int64_t stride_a, const void* B, int64_t ldb,
                            int64_t stride_b, float beta, float* C, int64_t ldc, int64_t stride_c, int64_t batch) {
  const int64_t esz = ab == CUDA_R_32F ? 4 : 2;
  const bool tf32 = ab == CUDA_R_32F && (tf32_ || (tf32_attention_ && in_attention_));
  const cublasComputeType_t compute = tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  const LtPlan& plan = lt_plan({int64_t(ab), int64_t(compute), ta, tb, M, N, K, lda, ldb, ldc, stride_a, stride_b,
                                stride_c, batch, operand_alignment(B, ldb, stride_b, batch, esz),
                                operand_alignment(A, lda, stride_a, batch, esz), operand_alignment(C, ldc, stride_c, batch, 4)});
  EXA_CUBLAS(lt_api().cublasLtMatmul(lt_, plan.op, &alpha, B, plan.a, A, plan.b, &beta, C, plan.c, C, plan.c, &plan.algo,
                                     workspace_, kWorkspaceBytes, cs()));
  if (profile_.on && profile_.scope == nullptr)  // each shape apart: M N K, transposes, the operands' alignments
    mark(fmt::format("gemm {} {}x{}x{}{}{} al {}/{}/{}", ab == CUDA_R_32F ? "fp32" : "16-bit", M, N, K, ta ? " tA" : "",
                     tb ? " tB" : "", operand_alignment(A, lda, stride_a, batch, esz),
                     operand_alignment(B, ldb, stride_b, batch, esz), operand_alignment(C, ldc, stride_c, batch, 4)));
}

// ---- the public functions (cuda_backend.hpp, backend.hpp) -----------------------------------------

int cuda_visible_devices(std::string* why) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    count = 0;
  }
  if (count == 0 && why)
    *why = fmt::format("no CUDA device visible: cudaGetDeviceCount = 0 ({}: {})", cudaGetErrorName(err),
                       cudaGetErrorString(err));
  return count;
}

std::unique_ptr<Backend> make_cuda_backend(int device) {
  std::string why;
  const int count = cuda_visible_devices(&why);
  EXA_CHECK(count > 0, "cuda backend: {}; run on a GPU node or set [train] device = \"cpu\"", why);
  if (device < 0) {  // one rank per GPU: two ranks on one GPU would fail later in NCCL, less clearly
    device = local_rank();
    EXA_CHECK(device < count, "cuda backend: local rank {} but {} GPU(s) visible on this node; the cuda backend runs "
              "one rank per GPU (start at most {} ranks per node)", device, count, count);
  }
  EXA_CHECK(device < count, "cuda backend: device {} requested, {} visible", device, count);
  return std::make_unique<CudaBackend>(device);
}

void* cuda_stream_handle(Stream& s) { return CudaBackend::stream(s); }
void* cuda_event_handle(const Event& e) { return CudaBackend::event(e); }

int cuda_device_of(const Backend& be) {
  auto* c = dynamic_cast<const CudaBackend*>(&be);
  return c ? c->device() : -1;
}

void cuda_load_libraries() { (void)lt_api(); }

int64_t cuda_half_gemm_count(const Backend& be) {
  auto* c = dynamic_cast<const CudaBackend*>(&be);
  return c ? c->half_gemms : -1;
}

void cuda_profile_reset(Backend& be) {
  if (auto* c = dynamic_cast<CudaBackend*>(&be)) c->profile_reset();
}

std::string cuda_profile_report(Backend& be) {
  auto* c = dynamic_cast<CudaBackend*>(&be);
  return c ? c->profile_report() : std::string();
}

std::string cuda_memory_stats(const Backend& be) {
  auto* c = dynamic_cast<const CudaBackend*>(&be);
  return c ? c->allocator().describe() : std::string();
}

}  // namespace exatrain
