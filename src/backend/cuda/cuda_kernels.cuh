// The CUDA backend's kernels (cuda_kernels.cu), as host-callable launchers: every launcher enqueues
// its kernels on `s` and returns (asynchronous); the caller (cuda_backend.cpp) checks
// cudaGetLastError. Pointers are device memory unless said otherwise. Shapes and contracts are those
// of the ops of the same name in backend/backend.hpp; the CUDA-specific choices are said here.
//
// Determinism (backend.hpp's promise of identical bits for identical inputs): no kernel uses
// atomics. Row reductions are one block per row with a fixed tree (warp shuffles, then shared
// memory); reductions across rows (bias and norm weight gradients) sum fixed chunks of kColChunk
// rows, then the chunks in order; the embedding gradient gives each vocabulary row to the block of
// its first position, which adds the positions in order; whole-buffer sums are two passes over a
// fixed grid (kReduceBlocks blocks, independent of the GPU). The results are not the CPU backend's
// bits (another summation order), but the same bits run to run on one GPU model.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/cuda/flash_attention.hpp"

namespace exatrain::cuda {

// Grid of the whole-buffer reductions (sum_squares, dot, sum_abs): partials[kReduceBlocks] doubles.
constexpr int kReduceBlocks = 256;
// Rows per partial sum of the sums across rows (bias_backward, the norms' weight gradients), and the
// floats of scratch (device memory) they need for N rows, C columns and nout sums.
constexpr int64_t kColChunk = 256;
int64_t colsum_scratch_floats(int64_t N, int64_t C, int nout);

// ---- elementwise --------------------------------------------------------------------------------
void fill(cudaStream_t s, float* x, float value, int64_t n);
void add_inplace(cudaStream_t s, float* y, const float* x, int64_t n);
void add(cudaStream_t s, float* out, const float* a, const float* b, int64_t n);
void scale(cudaStream_t s, float* x, float alpha, int64_t n);
void add_bias(cudaStream_t s, float* out, const float* bias, int64_t N, int64_t O);
void bias_backward(cudaStream_t s, float* dbias, const float* dout, int64_t N, int64_t O, float* scratch);
// kind: 0 = sum of squares, 1 = dot(a, b), 2 = sum of |a|. Writes the double result to *result
// (device memory) after a second single-block pass over the partials.
void reduce_double(cudaStream_t s, int kind, const float* a, const float* b, int64_t n, double* partials,
                   double* result);
// half: 0 = bf16, 1 = f16 (backend/half_convert.hpp's conversions, the CPU's bits).
void f32_to_half(cudaStream_t s, int half, uint16_t* dst, const float* src, int64_t n);
void half_to_f32(cudaStream_t s, int half, float* dst, const uint16_t* src, int64_t n);

// ---- norms, activations, rope ------------------------------------------------------------------
void layernorm_forward(cudaStream_t s, float* out, float* mean, float* rstd, const float* inp, const float* w,
                       const float* b, int64_t N, int64_t C, float eps);
void layernorm_backward(cudaStream_t s, float* dinp, float* dw, float* db, const float* dout, const float* inp,
                        const float* w, const float* mean, const float* rstd, int64_t N, int64_t C, float* scratch);
void rmsnorm_forward(cudaStream_t s, float* out, float* rstd, const float* inp, const float* w, int64_t N,
                     int64_t C, float eps);
void rmsnorm_backward(cudaStream_t s, float* dinp, float* dw, const float* dout, const float* inp,
                      const float* w, const float* rstd, int64_t N, int64_t C, float* scratch);
void gelu_forward(cudaStream_t s, float* out, const float* inp, int64_t n);
void gelu_backward(cudaStream_t s, float* dinp, const float* inp, const float* dout, int64_t n);
void swiglu_forward(cudaStream_t s, float* out, const float* inp, int64_t N, int64_t F);
void swiglu_backward(cudaStream_t s, float* dinp, const float* inp, const float* dout, int64_t N, int64_t F);
void rope(cudaStream_t s, float* x, int64_t B, int64_t T, int64_t row_stride, int64_t n_heads, int64_t D,
          float theta, bool inverse);

// ---- attention (its saved state: the probabilities [B,Hq,T,T], materialised) ---------------------
// The GEMMs are cuBLASLt's (cuda_backend.cpp); these are the softmax between them, over `rows` rows
// of T scores, row r being query t = r % T (causal: keys t2 <= t). In place: scaled scores in,
// probabilities out; backward: dp = dout . v in, ds = p (dp - sum p dp) scale out.
void causal_softmax(cudaStream_t s, float* scores, int64_t rows, int64_t T);
void causal_softmax_backward(cudaStream_t s, float* ds, const float* probs, int64_t rows, int64_t T, float scale);

// ---- fused attention, 16-bit operands (flash_attention.hpp; flash_attention.cu) ------------------
// D one of flash::supported_head_dim, the device's shared memory at least flash::shared_bytes(D).
// flash_forward writes p.lse, p.o16 and p.out (when not null); flash_backward writes p.delta, then
// p.dqkv whole, reading p.lse and p.o16. Unlike the launchers above they return the error (of the
// shared-memory attribute or the launch) for the caller to check.
cudaError_t flash_forward(cudaStream_t s, int half, int64_t D, const flash::Params& p);
cudaError_t flash_backward(cudaStream_t s, int half, int64_t D, const flash::Params& p);

// ---- embeddings, cross-entropy -----------------------------------------------------------------
void embedding_forward(cudaStream_t s, float* out, const int32_t* tokens, const float* wte, int64_t vocab_start,
                       int64_t V, int64_t N, int64_t C);
// scratch: 2 N int32 (device memory): the chains of equal tokens (cuda_kernels.cu).
void embedding_backward(cudaStream_t s, float* dwte, const float* dout, const int32_t* tokens,
                        int64_t vocab_start, int64_t V, int64_t N, int64_t C, int32_t* scratch);
void positional_forward(cudaStream_t s, float* out, const float* wpe, int64_t B, int64_t T, int64_t C);
// half: 0 = bf16, 1 = fp16 (as half_to_f32).
void embedding_forward_half(cudaStream_t s, int half, float* out, const int32_t* tokens, const uint16_t* wte,
                            int64_t vocab_start, int64_t V, int64_t N, int64_t C);
void positional_forward_half(cudaStream_t s, int half, float* out, const uint16_t* wpe, int64_t B, int64_t T,
                             int64_t C);
void positional_backward(cudaStream_t s, float* dwpe, const float* dout, int64_t B, int64_t T, int64_t C);
void xent_max(cudaStream_t s, float* rowmax, const float* logits, int64_t N, int64_t V, int64_t ld);
void xent_stats(cudaStream_t s, float* sumexp, float* target_logit, const float* logits, const float* rowmax,
                const int32_t* targets, int64_t vocab_start, int64_t N, int64_t V, int64_t ld);
void xent_backward(cudaStream_t s, float* logits, const float* rowmax, const float* sumexp, const int32_t* targets,
                   int64_t vocab_start, float scale, int64_t N, int64_t V, int64_t ld);

// ---- optimizer (elementwise over the arenas) ----------------------------------------------------
void adamw_update(cudaStream_t s, float* param, const float* grad, float* m, float* v, int64_t n, float beta1,
                  float beta2, float eps, float decay, float step_size, float bc2_sqrt, float grad_scale);
void momentum_update(cudaStream_t s, float* out, float* buf, const float* grad, int64_t n, float momentum,
                     bool nesterov, float grad_scale);
void sgd_update(cudaStream_t s, float* param, const float* grad, float* buf, int64_t n, float lr, float momentum,
                bool nesterov, float weight_decay, float grad_scale);
void lion_update(cudaStream_t s, float* param, const float* grad, float* m, int64_t n, float lr, float beta1,
                 float beta2, float weight_decay, float grad_scale);
void adam_direction(cudaStream_t s, float* out, const float* grad, float* m, float* v, int64_t n, float beta1,
                    float beta2, float eps, float bc1, float bc2_sqrt, float grad_scale);
void eigen_damped_divide(cudaStream_t s, float* V, const float* dg, const float* da, int64_t rows, int64_t cols,
                         float damping);
// out[i, j] = a[row_order[i], col_order[j]] (device index arrays; null: identity).
void permute_matrix(cudaStream_t s, float* out, const float* a, int64_t rows, int64_t cols,
                    const int64_t* row_order, const int64_t* col_order);

}  // namespace exatrain::cuda
