// CudaBackend's class (internal to src/backend/cuda: it includes the CUDA headers). What runs where:
// cuda_backend.hpp. Methods: cuda_backend.cpp (memory, streams, GEMMs, kernels' launches) and
// cuda_backend_fallback.cpp (the host fallbacks).
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <map>
#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/cuda/cuda_allocator.hpp"
#include "backend/cuda/cuda_backend.hpp"
#include "backend/cuda/cuda_kernels.cuh"
#include "core/check.hpp"

#define EXA_CUDA(call)                                                                                \
  do {                                                                                                \
    const cudaError_t err_ = (call);                                                                  \
    EXA_CHECK(err_ == cudaSuccess, "cuda backend: {} failed: {} ({})", #call, cudaGetErrorString(err_), \
              cudaGetErrorName(err_));                                                                \
  } while (0)
#define EXA_CUBLAS(call)                                                                               \
  do {                                                                                                 \
    const cublasStatus_t st_ = (call);                                                                 \
    EXA_CHECK(st_ == CUBLAS_STATUS_SUCCESS, "cuda backend: {} failed: {} ({})", #call,                 \
              lt_api().cublasLtGetStatusString(st_), lt_api().cublasLtGetStatusName(st_));             \
  } while (0)

namespace exatrain {

// cuBLASLt's functions, loaded with dlopen when the first CUDA backend is made (cuda_backend.cpp):
// linking libcublasLt.so would cost every exatrain process about 200 MB of resident memory at
// start, CPU runs included (measured: an empty program linked with it peaks at 211 MB, 1.4 MB
// without), which broke a memory bound of tests/cli/bad_inputs.sh. The types are the header's.
#define EXA_LT_FUNCTIONS(X)                                                                            \
  X(cublasLtCreate) X(cublasLtDestroy) X(cublasLtGetStatusName) X(cublasLtGetStatusString)             \
  X(cublasLtMatmul) X(cublasLtMatmulAlgoGetHeuristic) X(cublasLtMatmulDescCreate)                      \
  X(cublasLtMatmulDescDestroy) X(cublasLtMatmulDescSetAttribute) X(cublasLtMatmulPreferenceCreate)     \
  X(cublasLtMatmulPreferenceDestroy) X(cublasLtMatmulPreferenceSetAttribute)                           \
  X(cublasLtMatrixLayoutCreate) X(cublasLtMatrixLayoutDestroy) X(cublasLtMatrixLayoutSetAttribute)
struct LtApi {
#define EXA_LT_MEMBER(f) decltype(&::f) f = nullptr;
  EXA_LT_FUNCTIONS(EXA_LT_MEMBER)
#undef EXA_LT_MEMBER
};
// Loaded once (thread-safe); an error naming the library and dlerror() when it cannot be.
const LtApi& lt_api();
struct LtPlan;  // cuda_backend.cpp

class CudaStream final : public Stream {
 public:
  explicit CudaStream(int device) {
    EXA_CUDA(cudaSetDevice(device));
    EXA_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  }
  ~CudaStream() override { cudaStreamDestroy(s); }
  cudaStream_t s = nullptr;
};

class CudaEvent final : public Event {
 public:
  CudaEvent() { EXA_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming)); }
  ~CudaEvent() override { cudaEventDestroy(e); }
  cudaEvent_t e = nullptr;
};


class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device);
  ~CudaBackend() override;
  const char* name() const override { return "cuda"; }
  int device() const { return device_; }
  const cuda::CachingAllocator& allocator() const { return alloc_; }

  // ---- streams and events -------------------------------------------------------------------
  Stream& compute_stream() override { return compute_; }
  std::unique_ptr<Stream> create_stream() override { return std::make_unique<CudaStream>(device_); }
  std::unique_ptr<Event> create_event() override { return std::make_unique<CudaEvent>(); }
  void record(Event& e, Stream& s) override {
    EXA_CUDA(cudaEventRecord(event(e), stream(s)));
    e.recorded = true;
  }
  void wait(Stream& s, const Event& e) override {
    Backend::wait(s, e);  // recorded?
    EXA_CUDA(cudaStreamWaitEvent(stream(s), event(e), 0));
  }
  void synchronize(const Event& e) override {
    Backend::synchronize(e);
    EXA_CUDA(cudaEventSynchronize(event(e)));
  }
  void synchronize() override { EXA_CUDA(cudaDeviceSynchronize()); }
  static cudaStream_t stream(Stream& s) {
    auto* c = dynamic_cast<CudaStream*>(&s);
    EXA_CHECK(c != nullptr, "cuda backend: a stream that is not a CUDA stream");
    return c->s;
  }
  static cudaEvent_t event(const Event& e) {
    auto* c = dynamic_cast<const CudaEvent*>(&e);
    EXA_CHECK(c != nullptr, "cuda backend: an event that is not a CUDA event");
    return c->e;
  }

  // ---- memory -------------------------------------------------------------------------------
  void* alloc_bytes(size_t bytes) override {
    void* p = alloc_.allocate(bytes);
    EXA_CUDA(cudaMemsetAsync(p, 0, cuda::CachingAllocator::size_class(bytes), cs()));
    return p;
  }
  void free_bytes(void* p) override { alloc_.release(p); }
  void upload(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    EXA_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, cs()));
    EXA_CUDA(cudaStreamSynchronize(cs()));  // the host may reuse src at once
  }
  void download(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    EXA_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, cs()));
    EXA_CUDA(cudaStreamSynchronize(cs()));
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes > 0) EXA_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, cs()));
  }
  void zero(void* p, size_t bytes) override {
    if (bytes > 0) EXA_CUDA(cudaMemsetAsync(p, 0, bytes, cs()));
  }
  void fill(float* x, float value, int64_t n) override { cuda::fill(cs(), x, value, n);
    launched("fill"); }
  void release(float* x, int64_t n, float partial_fill, const float* free_begin, const float* free_end) override;
  void* alloc_host(size_t bytes) override {
    void* p = nullptr;
    EXA_CUDA(cudaMallocHost(&p, bytes == 0 ? 64 : bytes));
    return p;
  }
  void free_host(void* p) override {
    if (p) EXA_CUDA(cudaFreeHost(p));
  }
  bool host_accessible() const override { return false; }

  // ---- GEMM ---------------------------------------------------------------------------------
  void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
            const float* B, int64_t ldb, float beta, float* C, int64_t ldc) override {
    matmul(CUDA_R_32F, ta, tb, M, N, K, alpha, A, lda, 0, B, ldb, 0, beta, C, ldc, 0, 1);
  }
  void gemm_strided_batched(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                            int64_t lda, int64_t stride_a, const float* B, int64_t ldb, int64_t stride_b, float beta,
                            float* C, int64_t ldc, int64_t stride_c, int64_t batch) override {
    matmul(CUDA_R_32F, ta, tb, M, N, K, alpha, A, lda, stride_a, B, ldb, stride_b, beta, C, ldc, stride_c, batch);
  }
  void gemm_half(Half type, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A,
                 int64_t lda, const uint16_t* B, int64_t ldb, float beta, float* C, int64_t ldc) override {
    matmul(type == Half::bf16 ? CUDA_R_16BF : CUDA_R_16F, ta, tb, M, N, K, alpha, A, lda, 0, B, ldb, 0, beta, C,
           ldc, 0, 1);
    half_gemms++;
  }
  std::string gemm_half_path(Half type) const override {
    return std::string("cuBLASLt ") + (type == Half::bf16 ? "bf16" : "fp16") + " matmul, fp32 accumulation";
  }
  int64_t scratch_bytes() const override;  // cuBLASLt's workspace
  int64_t half_gemms = 0;  // gemm_half calls so far (bench_gpu: did a "bf16" run use 16-bit GEMMs?)
  void f32_to_half(Half type, uint16_t* dst, const float* src, int64_t n) override {
    cuda::f32_to_half(cs(), type == Half::bf16 ? 0 : 1, dst, src, n);
    launched("f32_to_half");
  }
  void half_to_f32(Half type, float* dst, const uint16_t* src, int64_t n) override {
    cuda::half_to_f32(cs(), type == Half::bf16 ? 0 : 1, dst, src, n);
    launched("half_to_f32");
  }

  // ---- elementwise and reductions -------------------------------------------------------------
  void add_inplace(float* y, const float* x, int64_t n) override { cuda::add_inplace(cs(), y, x, n);
    launched("add_inplace"); }
  void add(float* out, const float* a, const float* b, int64_t n) override { cuda::add(cs(), out, a, b, n);
    launched("add"); }
  void scale(float* x, float alpha, int64_t n) override { cuda::scale(cs(), x, alpha, n);
    launched("scale"); }
  void add_bias(float* out, const float* bias, int64_t N, int64_t O) override {
    cuda::add_bias(cs(), out, bias, N, O);
    launched("add_bias");
  }
  void bias_backward(float* dbias, const float* dout, int64_t N, int64_t O) override {
    const cuda::Scratch scratch = colsum_scratch(N, O, 1);
    cuda::bias_backward(cs(), dbias, dout, N, O, scratch.get<float>());
    launched("bias_backward");
  }
  double sum_squares(const float* x, int64_t n) override { return reduce(0, x, nullptr, n, "sum_squares"); }
  double dot(const float* a, const float* b, int64_t n) override { return reduce(1, a, b, n, "dot"); }
  double sum_abs(const float* x, int64_t n) override { return reduce(2, x, nullptr, n, "sum_abs"); }
  void f32_to_bf16(uint16_t* dst, const float* src, int64_t n) override { f32_to_half(Half::bf16, dst, src, n); }
  void bf16_to_f32(float* dst, const uint16_t* src, int64_t n) override { half_to_f32(Half::bf16, dst, src, n); }

  // ---- norms, activations, rope, attention -----------------------------------------------------
  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b,
                         int64_t N, int64_t C, float eps) override {
    cuda::layernorm_forward(cs(), out, mean, rstd, inp, w, b, N, C, eps);
    launched("layernorm_forward");
  }
  void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w,
                          const float* mean, const float* rstd, int64_t N, int64_t C) override {
    const cuda::Scratch scratch = colsum_scratch(N, C, 2);
    cuda::layernorm_backward(cs(), dinp, dw, db, dout, inp, w, mean, rstd, N, C, scratch.get<float>());
    launched("layernorm_backward");
  }
  void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int64_t N, int64_t C,
                       float eps) override {
    cuda::rmsnorm_forward(cs(), out, rstd, inp, w, N, C, eps);
    launched("rmsnorm_forward");
  }
  void rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp, const float* w,
                        const float* rstd, int64_t N, int64_t C) override {
    const cuda::Scratch scratch = colsum_scratch(N, C, 1);
    cuda::rmsnorm_backward(cs(), dinp, dw, dout, inp, w, rstd, N, C, scratch.get<float>());
    launched("rmsnorm_backward");
  }
  void gelu_forward(float* out, const float* inp, int64_t n) override { cuda::gelu_forward(cs(), out, inp, n);
    launched("gelu_forward"); }
  void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n) override {
    cuda::gelu_backward(cs(), dinp, inp, dout, n);
    launched("gelu_backward");
  }
  void swiglu_forward(float* out, const float* inp, int64_t N, int64_t F) override {
    cuda::swiglu_forward(cs(), out, inp, N, F);
    launched("swiglu_forward");
  }
  void swiglu_backward(float* dinp, const float* inp, const float* dout, int64_t N, int64_t F) override {
    cuda::swiglu_backward(cs(), dinp, inp, dout, N, F);
    launched("swiglu_backward");
  }
  void rope(float* x, int64_t B, int64_t T, int64_t row_stride, int64_t n_heads, int64_t D, float theta,
            bool inverse) override {
    cuda::rope(cs(), x, B, T, row_stride, n_heads, D, theta, inverse);
    launched("rope");
  }
  // 16-bit operands and a head size with kernels: the fused flash kernel (flash_attention.hpp), which
  // saves per-row log-sum-exp and its 16-bit output; otherwise float32 GEMMs around the softmax
  // kernels, which save the probabilities [B, Hq, T, T] (cuda_backend.cpp).
  // EXATRAIN_CUDA_FLASH=0 turns the fused kernel off (flash_), for comparisons on one GPU; so does a
  // device whose blocks cannot have the kernels' shared memory (smem_optin_).
  bool fused_attention(int64_t D, std::optional<Half> operands) const {
    return flash_ && operands.has_value() && cuda::flash::supported_head_dim(D) &&
           cuda::flash::shared_bytes(D) <= smem_optin_;
  }
  int64_t attention_saved_floats(int64_t B, int64_t T, int64_t Hq, int64_t D,
                                 std::optional<Half> operands) const override {
    return fused_attention(D, operands) ? cuda::flash::saved_floats(B, T, Hq, D) : B * Hq * T * T;
  }
  void attention_forward(float* out, float* saved, const float* qkv, int64_t B, int64_t T, int64_t Hq, int64_t Hkv,
                         int64_t D, std::optional<Half> operands) override;
  void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* saved, int64_t B, int64_t T,
                          int64_t Hq, int64_t Hkv, int64_t D, std::optional<Half> operands) override;
  static cuda::flash::Params flash_params(float* out, float* saved, const float* qkv, const float* dout, float* dqkv,
                                    int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t D);

  // ---- embeddings, cross-entropy ---------------------------------------------------------------
  void embedding_forward(float* out, const int32_t* tokens, const float* wte, int64_t vocab_start, int64_t V,
                         int64_t N, int64_t C) override {
    cuda::embedding_forward(cs(), out, tokens, wte, vocab_start, V, N, C);
    launched("embedding_forward");
  }
  void embedding_backward(float* dwte, const float* dout, const int32_t* tokens, int64_t vocab_start, int64_t V,
                          int64_t N, int64_t C) override {
    const cuda::Scratch chains(alloc_, sizeof(int32_t) * size_t(2 * std::max<int64_t>(N, 1)));
    cuda::embedding_backward(cs(), dwte, dout, tokens, vocab_start, V, N, C, chains.get<int32_t>());
    launched("embedding_backward");
  }
  void positional_forward(float* out, const float* wpe, int64_t B, int64_t T, int64_t C) override {
    cuda::positional_forward(cs(), out, wpe, B, T, C);
    launched("positional_forward");
  }
  void positional_backward(float* dwpe, const float* dout, int64_t B, int64_t T, int64_t C) override {
    cuda::positional_backward(cs(), dwpe, dout, B, T, C);
    launched("positional_backward");
  }
  void embedding_forward_half(Half type, float* out, const int32_t* tokens, const uint16_t* wte,
                              int64_t vocab_start, int64_t V, int64_t N, int64_t C) override {
    cuda::embedding_forward_half(cs(), type == Half::bf16 ? 0 : 1, out, tokens, wte, vocab_start, V, N, C);
    launched("embedding_forward_half");
  }
  void positional_forward_half(Half type, float* out, const uint16_t* wpe, int64_t B, int64_t T,
                               int64_t C) override {
    cuda::positional_forward_half(cs(), type == Half::bf16 ? 0 : 1, out, wpe, B, T, C);
    launched("positional_forward_half");
  }
  void xent_max(float* rowmax, const float* logits, int64_t N, int64_t V, int64_t ld) override {
    cuda::xent_max(cs(), rowmax, logits, N, V, ld);
    launched("xent_max");
  }
  void xent_stats(float* sumexp, float* target_logit, const float* logits, const float* rowmax,
                  const int32_t* targets, int64_t vocab_start, int64_t N, int64_t V, int64_t ld) override {
    cuda::xent_stats(cs(), sumexp, target_logit, logits, rowmax, targets, vocab_start, N, V, ld);
    launched("xent_stats");
  }
  void xent_backward(float* logits, const float* rowmax, const float* sumexp, const int32_t* targets,
                     int64_t vocab_start, float scale, int64_t N, int64_t V, int64_t ld) override {
    cuda::xent_backward(cs(), logits, rowmax, sumexp, targets, vocab_start, scale, N, V, ld);
    launched("xent_backward");
  }

  // ---- optimizer (cuda_backend_fallback.cpp: the host fallbacks) ---------------------------------
  void adamw_update(float* param, const float* grad, float* m, float* v, int64_t n, float lr, float beta1,
                    float beta2, float eps, float weight_decay, float bc1, float bc2, float grad_scale) override {
    // The scalars as the CPU backend computes them (cpu_backend.cpp), so the kernel gives its bits.
    cuda::adamw_update(cs(), param, grad, m, v, n, beta1, beta2, eps, 1.0f - lr * weight_decay, lr / bc1,
                                std::sqrt(bc2), grad_scale);
    launched("adamw_update");
  }
  void momentum_update(float* out, float* buf, const float* grad, int64_t n, float momentum, bool nesterov,
                       float grad_scale) override {
    cuda::momentum_update(cs(), out, buf, grad, n, momentum, nesterov, grad_scale);
    launched("momentum_update");
  }
  void sgd_update(float* param, const float* grad, float* buf, int64_t n, float lr, float momentum, bool nesterov,
                  float weight_decay, float grad_scale) override {
    cuda::sgd_update(cs(), param, grad, buf, n, lr, momentum, nesterov, weight_decay, grad_scale);
    launched("sgd_update");
  }
  void lion_update(float* param, const float* grad, float* m, int64_t n, float lr, float beta1, float beta2,
                   float weight_decay, float grad_scale) override {
    cuda::lion_update(cs(), param, grad, m, n, lr, beta1, beta2, weight_decay, grad_scale);
    launched("lion_update");
  }
  void adam_direction(float* out, const float* grad, float* m, float* v, int64_t n, float beta1, float beta2,
                      float eps, float bc1, float bc2, float grad_scale) override {
    cuda::adam_direction(cs(), out, grad, m, v, n, beta1, beta2, eps, bc1, std::sqrt(bc2), grad_scale);
    launched("adam_direction");
  }
  void eigen_damped_divide(float* V, const float* dg, const float* da, int64_t rows, int64_t cols,
                           float damping) override {
    cuda::eigen_damped_divide(cs(), V, dg, da, rows, cols, damping);
    launched("eigen_damped_divide");
  }
  void permute_matrix(float* a, int64_t rows, int64_t cols, const int64_t* row_order,
                      const int64_t* col_order) override;
  void lamb_update(float* param, const float* grad, float* m, float* v, float* scratch, int64_t n,
                   const LambStep& s) override;
  void adafactor_update(float* param, const float* grad, float* row, float* col, float* v, float* m, float* scratch,
                        int64_t rows, int64_t cols, const AdafactorStep& s) override;
  bool sym_inverse_root(float* out, const float* A, int64_t n, double eps, int p) override;
  bool sym_eigenbasis(float* Q, const float* A, int64_t n) override;
  bool power_qr_refresh(float* Q, const float* A, int64_t n, int64_t* order) override;
  bool sym_eigh(float* Q, float* d, const float* A, int64_t n) override;

  // ---- gradient compression (host fallbacks: cuda_backend_fallback.cpp) ------------------------
  void topk_abs(int32_t* idx, float* val, const float* x, int64_t n, int64_t k, int64_t base) override;
  void sample_abs(float* out, const float* x, int64_t n, int64_t s, uint64_t seed) override;
  int64_t select_abs_at_least(int32_t* idx, float* val, const float* x, int64_t n, float threshold, int64_t cap,
                              int64_t base) override;
  void gather(float* out, const float* x, int64_t n, const int32_t* idx, int64_t k) override;
  void scatter_add(float* x, int64_t n, const int32_t* idx, const float* val, int64_t k, int64_t base) override;
  void scatter_fill(float* x, int64_t n, const int32_t* idx, int64_t k, float value) override;
  void block_sum_squares(float* out, const float* x, int64_t n, int64_t block) override;
  void gather_blocks(float* out, const float* x, int64_t n, const int32_t* blocks, int64_t kb,
                     int64_t block) override;
  void scatter_add_blocks(float* x, int64_t n, const int32_t* blocks, const float* val, int64_t kb,
                          int64_t block) override;
  void fill_blocks(float* x, int64_t n, const int32_t* blocks, int64_t kb, int64_t block, float value) override;
  void sign_pack(int32_t* bits, const float* x, int64_t n) override;
  void sign_unpack_add(float* x, const int32_t* bits, int64_t n, float scale) override;
  void orthonormalize_columns(float* P, int64_t rows, int64_t cols) override;
  int64_t count_common(const int32_t* a, int64_t ka, const int32_t* b, int64_t kb) override;
  void count_below(int64_t* below, const int32_t* idx, int64_t k, const int64_t* bounds, int64_t nb) override;

  // Host copies for the fallbacks (synchronous).
  template <class T>
  std::vector<T> host(const T* p, int64_t n) {
    std::vector<T> h(size_t(std::max<int64_t>(n, 0)));
    download(h.data(), p, sizeof(T) * h.size());
    return h;
  }
  template <class T>
  void device(T* p, const std::vector<T>& h) {
    upload(p, h.data(), sizeof(T) * h.size());
  }
  Backend& cpu() { return *cpu_; }

 private:
  cudaStream_t cs() { return compute_.s; }
  // Checks the launch of an op's kernels (configuration errors appear here; faults at the next sync);
  // with EXATRAIN_CUDA_PROFILE set, also marks the op's end on the stream (profile_).
  void launched(const char* op);
  // Scratch for the sums across rows (cuda_kernels.cuh kColChunk) of N rows, C columns, nout sums.
  cuda::Scratch colsum_scratch(int64_t N, int64_t C, int nout) {
    return cuda::Scratch(alloc_, size_t(4 * std::max<int64_t>(1, cuda::colsum_scratch_floats(N, C, nout))));
  }
  // While attention's GEMMs are enqueued: the profile charges them to the op, and
  // EXATRAIN_CUDA_TF32=attention applies. Ends at end() or when an error unwinds the op.
  struct AttentionScope {
    AttentionScope(CudaBackend& b, const char* op) : be(b) {
      be.profile_.scope = op;
      be.in_attention_ = true;
    }
    ~AttentionScope() { end(); }
    void end() {
      be.profile_.scope = nullptr;
      be.in_attention_ = false;
    }
    CudaBackend& be;
  };
  void check_heads(int64_t T, int64_t Hq, int64_t Hkv, int64_t B, const char* op) const;
  double reduce(int kind, const float* a, const float* b, int64_t n, const char* op);
  void matmul(cudaDataType ab, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const void* A,
              int64_t lda, int64_t stride_a, const void* B, int64_t ldb, int64_t stride_b, float beta, float* C,
              int64_t ldc, int64_t stride_c, int64_t batch);
  void matmul_lt(cudaDataType ab, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const void* A,
                 int64_t lda, int64_t stride_a, const void* B, int64_t ldb, int64_t stride_b, float beta, float* C,
                 int64_t ldc, int64_t stride_c, int64_t batch);
  // A GEMM's key: data type, compute type, ta, tb, M, N, K, lda, ldb, ldc, the three strides, batch
  // and the three operands' alignments (cuda_backend.cpp, LtPlan).
  using LtKey = std::array<int64_t, 17>;
  const LtPlan& lt_plan(const LtKey& key);

  int device_;
  CudaStream compute_;
  cuda::CachingAllocator alloc_;
  cublasLtHandle_t lt_ = nullptr;
  std::map<LtKey, std::unique_ptr<LtPlan>> lt_plans_;  // one per GEMM shape seen (lt_plan)
  void* workspace_ = nullptr;
  double* reduce_scratch_ = nullptr;  // kReduceBlocks partials + the result
  double* reduce_host_ = nullptr;     // pinned
  // EXATRAIN_CUDA_TF32: "1" runs every fp32 GEMM on TF32 tensor cores, "attention" only attention's
  // batched ones (in_attention_: set while attention's GEMMs are enqueued); unset: none.
  bool tf32_ = false, tf32_attention_ = false, in_attention_ = false;
  bool flash_ = true;  // EXATRAIN_CUDA_FLASH: the fused attention kernel under mixed precision
  size_t smem_optin_ = 0;  // cudaDevAttrMaxSharedMemoryPerBlockOptin of the device, bytes
  // Per-op GPU time (EXATRAIN_CUDA_PROFILE=1; bench_gpu --profile): events recorded at each op's
  // end, the time between consecutive events charged to the op that ended (so a host gap is charged
  // to the op after it). Ops inside an op (attention's GEMMs) are charged to the outer one.
  struct Profile {
    bool on = false;
    const char* scope = nullptr;  // the outer op whose GEMMs are being enqueued
    cudaEvent_t last = nullptr;
    std::vector<std::pair<std::string, cudaEvent_t>> pending;
    std::map<std::string, std::pair<double, int64_t>> totals;  // op -> (ms, calls)
  } profile_;
  void mark(const char* op);
  void mark(std::string op);
  void profile_flush();

 public:
  void profile_reset();
  std::string profile_report();

 private:
  std::unique_ptr<Backend> cpu_;  // the host fallbacks' code
};

}  // namespace exatrain
