// CPU implementation of the Backend interface: OpenBLAS sgemm for matrix products, OpenMP
// loops (static schedules, no atomics, fixed reduction orders) for everything else.
// Split over six files: cpu_backend.cpp (memory, GEMM, elementwise, AdamW), cpu_half.cpp (16-bit
// conversions, the embedding lookups from 16-bit copies and the 16-bit GEMM: oneDNN or conversion
// + sgemm),
// cpu_norm_act.cpp (norms, activations), cpu_attention.cpp (rope, attention, embeddings,
// cross-entropy), cpu_optimizer_ops.cpp (SGD, Lion, LAMB, Adafactor), cpu_compress_ops.cpp (gradient
// compression: top-k, sampling, gather/scatter, blocks, signs, Gram-Schmidt).
#pragma once
#include <map>

#include "backend/backend.hpp"

namespace exatrain {

class CpuBackend final : public Backend {
 public:
  // Kernels on fewer than parallel_min_work elements run on the calling thread: starting the
  // OpenMP team costs more than the work, and on a busy machine every team start risks
  // waiting for a descheduled thread. Results do not depend on it (no kernel's result depends
  // on the split); tests pass 0 to exercise the parallel paths on small shapes.
  CpuBackend(int threads, int64_t parallel_min_work);
  ~CpuBackend() override;
  const char* name() const override { return "cpu"; }
  int threads() const { return threads_; }

  void* alloc_bytes(size_t bytes) override;
  void* alloc_bytes_lazy(size_t bytes) override;
  void free_bytes(void* p) override;
  void upload(void* dst, const void* src, size_t bytes) override;
  void download(void* dst, const void* src, size_t bytes) override;
  void copy(void* dst, const void* src, size_t bytes) override;
  void zero(void* p, size_t bytes) override;
  void fill(float* x, float value, int64_t n) override;
  void release(float* x, int64_t n, float partial_fill, const float* free_begin,
               const float* free_end) override;

  void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
            const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
            int64_t ldc) override;
  void gemm_strided_batched(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                            float alpha, const float* A, int64_t lda, int64_t stride_a,
                            const float* B, int64_t ldb, int64_t stride_b, float beta, float* C,
                            int64_t ldc, int64_t stride_c, int64_t batch) override;
  // cpu_half.cpp (oneDNN bf16 matmul or conversion + sgemm, chosen in the constructor):
  void gemm_half(Half type, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                 const uint16_t* A, int64_t lda, const uint16_t* B, int64_t ldb, float beta, float* C,
                 int64_t ldc) override;
  void f32_to_half(Half type, uint16_t* dst, const float* src, int64_t n) override;
  void half_to_f32(Half type, float* dst, const uint16_t* src, int64_t n) override;
  std::string gemm_half_path(Half type) const override;
  int64_t scratch_bytes() const override;

  void add_inplace(float* y, const float* x, int64_t n) override;
  void add(float* out, const float* a, const float* b, int64_t n) override;
  void scale(float* x, float alpha, int64_t n) override;
  void add_bias(float* out, const float* bias, int64_t N, int64_t O) override;
  void bias_backward(float* dbias, const float* dout, int64_t N, int64_t O) override;
  double sum_squares(const float* x, int64_t n) override;
  double dot(const float* a, const float* b, int64_t n) override;
  void f32_to_bf16(uint16_t* dst, const float* src, int64_t n) override;
  void bf16_to_f32(float* dst, const uint16_t* src, int64_t n) override;

  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                         const float* b, int64_t N, int64_t C, float eps) override;
  void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                          const float* w, const float* mean, const float* rstd, int64_t N,
                          int64_t C) override;
  void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int64_t N,
                       int64_t C, float eps) override;
  void rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp,
                        const float* w, const float* rstd, int64_t N, int64_t C) override;

  void gelu_forward(float* out, const float* inp, int64_t n) override;
  void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n) override;
  void swiglu_forward(float* out, const float* inp, int64_t N, int64_t F) override;
  void swiglu_backward(float* dinp, const float* inp, const float* dout, int64_t N,
                       int64_t F) override;

  void rope(float* x, int64_t B, int64_t T, int64_t row_stride, int64_t n_heads, int64_t D,
            float theta, bool inverse) override;
  // saved: the probabilities [B, Hq, T, T] (cpu_attention.cpp). Keeping only each row's softmax
  // statistics and recomputing the probabilities in the backward, as a flash kernel does, was
  // measured (commit 3b6c4cc's message): 27 % less accounted memory and 15 % longer steps for a
  // 6 x 384 model at 1024 tokens on two cores, the trade `recompute = "selective"` already offers
  // (23 % and 10 %).
  // `operands` is not used: float32 products either way (the model's 16-bit q, k, v arrive rounded).
  int64_t attention_saved_floats(int64_t B, int64_t T, int64_t Hq, int64_t, std::optional<Half>) const override {
    return B * Hq * T * T;
  }
  void attention_forward(float* out, float* probs, const float* qkv, int64_t B, int64_t T,
                         int64_t Hq, int64_t Hkv, int64_t D, std::optional<Half>) override;
  void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* probs,
                          int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t D,
                          std::optional<Half>) override;

  void embedding_forward(float* out, const int32_t* tokens, const float* wte,
                         int64_t vocab_start, int64_t V, int64_t N, int64_t C) override;
  void embedding_backward(float* dwte, const float* dout, const int32_t* tokens,
                          int64_t vocab_start, int64_t V, int64_t N, int64_t C) override;
  void positional_forward(float* out, const float* wpe, int64_t B, int64_t T, int64_t C) override;
  void positional_backward(float* dwpe, const float* dout, int64_t B, int64_t T,
                           int64_t C) override;
  // cpu_half.cpp
  void embedding_forward_half(Half type, float* out, const int32_t* tokens, const uint16_t* wte,
                              int64_t vocab_start, int64_t V, int64_t N, int64_t C) override;
  void positional_forward_half(Half type, float* out, const uint16_t* wpe, int64_t B, int64_t T,
                               int64_t C) override;

  void xent_max(float* rowmax, const float* logits, int64_t N, int64_t V, int64_t ld) override;
  void xent_stats(float* sumexp, float* target_logit, const float* logits, const float* rowmax,
                  const int32_t* targets, int64_t vocab_start, int64_t N, int64_t V, int64_t ld) override;
  void xent_backward(float* logits, const float* rowmax, const float* sumexp,
                     const int32_t* targets, int64_t vocab_start, float scale, int64_t N,
                     int64_t V, int64_t ld) override;

  void adamw_update(float* param, const float* grad, float* m, float* v, int64_t n, float lr,
                    float beta1, float beta2, float eps, float weight_decay,
                    float bias_correction1, float bias_correction2, float grad_scale) override;
  void momentum_update(float* out, float* buf, const float* grad, int64_t n, float momentum, bool nesterov,
                       float grad_scale) override;
  // cpu_optimizer_ops.cpp:
  void sgd_update(float* param, const float* grad, float* buf, int64_t n, float lr, float momentum, bool nesterov,
                  float weight_decay, float grad_scale) override;
  void lion_update(float* param, const float* grad, float* m, int64_t n, float lr, float beta1, float beta2,
                   float weight_decay, float grad_scale) override;
  void lamb_update(float* param, const float* grad, float* m, float* v, float* scratch, int64_t n,
                   const LambStep& s) override;
  void adafactor_update(float* param, const float* grad, float* row, float* col, float* v, float* m, float* scratch,
                        int64_t rows, int64_t cols, const AdafactorStep& s) override;
  void adam_direction(float* out, const float* grad, float* m, float* v, int64_t n, float beta1, float beta2,
                      float eps, float bc1, float bc2, float grad_scale) override;
  bool sym_inverse_root(float* out, const float* A, int64_t n, double eps, int p) override;
  bool sym_eigenbasis(float* Q, const float* A, int64_t n) override;
  bool power_qr_refresh(float* Q, const float* A, int64_t n, int64_t* order) override;
  void permute_matrix(float* a, int64_t rows, int64_t cols, const int64_t* row_order, const int64_t* col_order) override;
  bool sym_eigh(float* Q, float* d, const float* A, int64_t n) override;
  void eigen_damped_divide(float* V, const float* dg, const float* da, int64_t rows, int64_t cols, float damping) override;

  // cpu_compress_ops.cpp:
  void topk_abs(int32_t* idx, float* val, const float* x, int64_t n, int64_t k, int64_t base) override;
  void sample_abs(float* out, const float* x, int64_t n, int64_t s, uint64_t seed) override;
  int64_t select_abs_at_least(int32_t* idx, float* val, const float* x, int64_t n, float threshold,
                              int64_t cap, int64_t base) override;
  void gather(float* out, const float* x, int64_t n, const int32_t* idx, int64_t k) override;
  void scatter_add(float* x, int64_t n, const int32_t* idx, const float* val, int64_t k, int64_t base) override;
  void scatter_fill(float* x, int64_t n, const int32_t* idx, int64_t k, float value) override;
  void block_sum_squares(float* out, const float* x, int64_t n, int64_t block) override;
  void gather_blocks(float* out, const float* x, int64_t n, const int32_t* blocks, int64_t kb, int64_t block) override;
  void scatter_add_blocks(float* x, int64_t n, const int32_t* blocks, const float* val, int64_t kb,
                          int64_t block) override;
  void fill_blocks(float* x, int64_t n, const int32_t* blocks, int64_t kb, int64_t block, float value) override;
  double sum_abs(const float* x, int64_t n) override;
  void sign_pack(int32_t* bits, const float* x, int64_t n) override;
  void sign_unpack_add(float* x, const int32_t* bits, int64_t n, float scale) override;
  void orthonormalize_columns(float* P, int64_t rows, int64_t cols) override;
  int64_t count_common(const int32_t* a, int64_t ka, const int32_t* b, int64_t kb) override;
  void count_below(int64_t* below, const int32_t* idx, int64_t k, const int64_t* bounds, int64_t nb) override;

 private:
  struct HalfGemm;  // cpu_half.cpp: oneDNN's engine, stream and primitives; conversion scratch
  void init_half();
  std::shared_ptr<HalfGemm> half_;  // shared_ptr: HalfGemm is complete in cpu_half.cpp only
  int threads_;
  int64_t min_work_;
  std::map<void*, size_t> mapped_;  // alloc_bytes_lazy's mappings (munmap'ed by free_bytes)
};

}  // namespace exatrain
