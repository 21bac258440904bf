// The guarded CPU backend: a CpuBackend behind an access check. Every op states the byte extent
// of each pointer it is given, computed from its shape arguments (below: the op's contract in
// backend.hpp, as a span per pointer), opens those ranges for its duration (guarded::OpScope)
// and forwards to the CPU backend. Memory, windows and the fault handler: guarded_memory.hpp.
// Streams, events and host staging memory are the base class's host-synchronous defaults.
#include "backend/cpu/guarded_backend.hpp"

#include <algorithm>

#include "backend/cpu/cpu_backend.hpp"
#include "backend/cpu/guarded_memory.hpp"
#include "core/check.hpp"

namespace exatrain {
namespace {

using guarded::OpScope;
using guarded::Range;

// n elements of T at p (n <= 0: nothing).
template <class T>
Range span(const T* p, int64_t n) {
  return {p, n > 0 ? sizeof(T) * size_t(n) : 0};
}

// A row-major [rows, cols] matrix with row stride ld: (rows-1)*ld + cols elements.
template <class T>
Range matrix(const T* p, int64_t rows, int64_t cols, int64_t ld) {
  return span(p, rows > 0 && cols > 0 ? (rows - 1) * ld + cols : 0);
}

// `batch` copies of `one` at element strides `stride` (which may be 0 or negative).
Range batched(Range one, int64_t batch, int64_t stride) {
  if (batch <= 0 || one.bytes == 0) return {one.p, 0};
  const int64_t last = (batch - 1) * stride * int64_t(sizeof(float));
  const int64_t lo = std::min<int64_t>(0, last), hi = std::max<int64_t>(0, last) + int64_t(one.bytes);
  return {reinterpret_cast<const void*>(uintptr_t(one.p) + uintptr_t(lo)), size_t(hi - lo)};
}

class GuardedCpuBackend final : public Backend {
 public:
  GuardedCpuBackend(int threads, int64_t parallel_min_work) : cpu_(threads, parallel_min_work) {
    guarded::install_fault_handler();
  }
  ~GuardedCpuBackend() override { guarded::unmap_all(this); }
  const char* name() const override { return "cpu-guarded"; }

  // ---- memory ------------------------------------------------------------------------------
  void* alloc_bytes(size_t bytes) override { return guarded::map(bytes, true, this); }
  void* alloc_bytes_lazy(size_t bytes) override { return guarded::map(bytes, false, this); }
  void free_bytes(void* p) override { guarded::unmap(p); }
  void label(const void* p, const std::string& what) override { guarded::label(p, what); }
  int64_t begin_host_access(const void* p, size_t bytes) override {
    return guarded::begin_host_access(p, bytes);
  }
  void end_host_access(int64_t token) override { guarded::end_host_access(token); }
  // upload / download declare only the device side: a device pointer passed as the host side
  // faults inside the op.
  void upload(void* dst, const void* src, size_t bytes) override {
    OpScope s("upload", {{dst, bytes}});
    cpu_.upload(dst, src, bytes);
  }
  void download(void* dst, const void* src, size_t bytes) override {
    OpScope s("download", {{src, bytes}});
    cpu_.download(dst, src, bytes);
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    OpScope s("copy", {{dst, bytes}, {src, bytes}});
    cpu_.copy(dst, src, bytes);
  }
  void zero(void* p, size_t bytes) override {
    OpScope s("zero", {{p, bytes}});
    cpu_.zero(p, bytes);
  }
  void fill(float* x, float value, int64_t n) override {
    OpScope s("fill", {span(x, n)});
    cpu_.fill(x, value, n);
  }
  // The CPU release fills the parts of [x, x+n) it keeps and madvises whole pages, which needs
  // no access: [x, x+n) is the whole extent it touches.
  void release(float* x, int64_t n, float partial_fill, const float* free_begin,
               const float* free_end) override {
    OpScope s("release", {span(x, n)});
    cpu_.release(x, n, partial_fill, free_begin, free_end);
  }

  // ---- GEMM --------------------------------------------------------------------------------
  // op(A)[M,K] is stored [M,K] (or [K,M] when trans_a) with row stride lda; likewise B, C.
  void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
            int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) override {
    const double sec = cpu_.gemm_seconds, flops = cpu_.gemm_flops;
    {
      OpScope s("gemm", {matrix(A, ta ? K : M, ta ? M : K, lda),
                         matrix(B, tb ? N : K, tb ? K : N, ldb), matrix(C, M, N, ldc)});
      cpu_.gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    }
    gemm_seconds += cpu_.gemm_seconds - sec;
    gemm_flops += cpu_.gemm_flops - flops;
  }
  void gemm_strided_batched(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                            const float* A, int64_t lda, int64_t stride_a, const float* B,
                            int64_t ldb, int64_t stride_b, float beta, float* C, int64_t ldc,
                            int64_t stride_c, int64_t batch) override {
    const double sec = cpu_.gemm_seconds, flops = cpu_.gemm_flops;
    {
      OpScope s("gemm_strided_batched",
                {batched(matrix(A, ta ? K : M, ta ? M : K, lda), batch, stride_a),
                 batched(matrix(B, tb ? N : K, tb ? K : N, ldb), batch, stride_b),
                 batched(matrix(C, M, N, ldc), batch, stride_c)});
      cpu_.gemm_strided_batched(ta, tb, M, N, K, alpha, A, lda, stride_a, B, ldb, stride_b, beta,
                                C, ldc, stride_c, batch);
    }
    gemm_seconds += cpu_.gemm_seconds - sec;
    gemm_flops += cpu_.gemm_flops - flops;
  }

  void gemm_half(Half type, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A,
                 int64_t lda, const uint16_t* B, int64_t ldb, float beta, float* C, int64_t ldc) override {
    const double sec = cpu_.gemm_seconds, flops = cpu_.gemm_flops;
    {
      OpScope s("gemm_half", {matrix(A, ta ? K : M, ta ? M : K, lda), matrix(B, tb ? N : K, tb ? K : N, ldb),
                              matrix(C, M, N, ldc)});
      cpu_.gemm_half(type, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    }
    gemm_seconds += cpu_.gemm_seconds - sec;
    gemm_flops += cpu_.gemm_flops - flops;
  }
  void f32_to_half(Half type, uint16_t* dst, const float* src, int64_t n) override {
    OpScope s("f32_to_half", {span(dst, n), span(src, n)});
    cpu_.f32_to_half(type, dst, src, n);
  }
  void half_to_f32(Half type, float* dst, const uint16_t* src, int64_t n) override {
    OpScope s("half_to_f32", {span(dst, n), span(src, n)});
    cpu_.half_to_f32(type, dst, src, n);
  }
  std::string gemm_half_path(Half type) const override { return cpu_.gemm_half_path(type); }
  int64_t scratch_bytes() const override { return cpu_.scratch_bytes(); }

  // ---- elementwise and reductions -------------------------------------------------------------
  void add_inplace(float* y, const float* x, int64_t n) override {
    OpScope s("add_inplace", {span(y, n), span(x, n)});
    cpu_.add_inplace(y, x, n);
  }
  void add(float* out, const float* a, const float* b, int64_t n) override {
    OpScope s("add", {span(out, n), span(a, n), span(b, n)});
    cpu_.add(out, a, b, n);
  }
  void scale(float* x, float alpha, int64_t n) override {
    OpScope s("scale", {span(x, n)});
    cpu_.scale(x, alpha, n);
  }
  void add_bias(float* out, const float* bias, int64_t N, int64_t O) override {
    OpScope s("add_bias", {span(out, N * O), span(bias, O)});
    cpu_.add_bias(out, bias, N, O);
  }
  void bias_backward(float* dbias, const float* dout, int64_t N, int64_t O) override {
    OpScope s("bias_backward", {span(dbias, O), span(dout, N * O)});
    cpu_.bias_backward(dbias, dout, N, O);
  }
  double dot(const float* a, const float* b, int64_t n) override {
    OpScope s("dot", {span(a, n), span(b, n)});
    return cpu_.dot(a, b, n);
  }
  double sum_squares(const float* x, int64_t n) override {
    OpScope s("sum_squares", {span(x, n)});
    return cpu_.sum_squares(x, n);
  }
  void f32_to_bf16(uint16_t* dst, const float* src, int64_t n) override {
    OpScope s("f32_to_bf16", {span(dst, n), span(src, n)});
    cpu_.f32_to_bf16(dst, src, n);
  }
  void bf16_to_f32(float* dst, const uint16_t* src, int64_t n) override {
    OpScope s("bf16_to_f32", {span(dst, n), span(src, n)});
    cpu_.bf16_to_f32(dst, src, n);
  }

  // ---- norms ---------------------------------------------------------------------------------
  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                         const float* b, int64_t N, int64_t C, float eps) override {
    OpScope s("layernorm_forward", {span(out, N * C), span(mean, N), span(rstd, N),
                                    span(inp, N * C), span(w, C), span(b, C)});
    cpu_.layernorm_forward(out, mean, rstd, inp, w, b, N, C, eps);
  }
  void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                          const float* w, const float* mean, const float* rstd, int64_t N,
                          int64_t C) override {
    OpScope s("layernorm_backward", {span(dinp, N * C), span(dw, C), span(db, C),
                                     span(dout, N * C), span(inp, N * C), span(w, C),
                                     span(mean, N), span(rstd, N)});
    cpu_.layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
  }
  void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int64_t N,
                       int64_t C, float eps) override {
    OpScope s("rmsnorm_forward", {span(out, N * C), span(rstd, N), span(inp, N * C), span(w, C)});
    cpu_.rmsnorm_forward(out, rstd, inp, w, N, C, eps);
  }
  void rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp,
                        const float* w, const float* rstd, int64_t N, int64_t C) override {
    OpScope s("rmsnorm_backward", {span(dinp, N * C), span(dw, C), span(dout, N * C),
                                   span(inp, N * C), span(w, C), span(rstd, N)});
    cpu_.rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, C);
  }

  // ---- activations -----------------------------------------------------------------------------
  void gelu_forward(float* out, const float* inp, int64_t n) override {
    OpScope s("gelu_forward", {span(out, n), span(inp, n)});
    cpu_.gelu_forward(out, inp, n);
  }
  void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n) override {
    OpScope s("gelu_backward", {span(dinp, n), span(inp, n), span(dout, n)});
    cpu_.gelu_backward(dinp, inp, dout, n);
  }
  void swiglu_forward(float* out, const float* inp, int64_t N, int64_t F) override {
    OpScope s("swiglu_forward", {span(out, N * F), span(inp, N * 2 * F)});
    cpu_.swiglu_forward(out, inp, N, F);
  }
  void swiglu_backward(float* dinp, const float* inp, const float* dout, int64_t N,
                       int64_t F) override {
    OpScope s("swiglu_backward", {span(dinp, N * 2 * F), span(inp, N * 2 * F), span(dout, N * F)});
    cpu_.swiglu_backward(dinp, inp, dout, N, F);
  }

  // ---- rope, attention -------------------------------------------------------------------------
  // x: B*T rows of row_stride floats, of which the first n_heads*D are rotated.
  void rope(float* x, int64_t B, int64_t T, int64_t row_stride, int64_t n_heads, int64_t D,
            float theta, bool inverse) override {
    OpScope s("rope", {matrix(x, B * T, n_heads * D, row_stride)});
    cpu_.rope(x, B, T, row_stride, n_heads, D, theta, inverse);
  }
  int64_t attention_saved_floats(int64_t B, int64_t T, int64_t Hq, int64_t D,
                                 std::optional<Half> operands) const override {
    return cpu_.attention_saved_floats(B, T, Hq, D, operands);
  }
  void attention_forward(float* out, float* saved, const float* qkv, int64_t B, int64_t T,
                         int64_t Hq, int64_t Hkv, int64_t D, std::optional<Half> operands) override {
    OpScope s("attention_forward", {span(out, B * T * Hq * D),
                                    span(saved, attention_saved_floats(B, T, Hq, D, operands)),
                                    span(qkv, B * T * (Hq + 2 * Hkv) * D)});
    cpu_.attention_forward(out, saved, qkv, B, T, Hq, Hkv, D, operands);
  }
  void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* saved,
                          int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t D,
                          std::optional<Half> operands) override {
    const int64_t W = (Hq + 2 * Hkv) * D;
    OpScope s("attention_backward", {span(dqkv, B * T * W), span(dout, B * T * Hq * D),
                                     span(qkv, B * T * W), span(saved, attention_saved_floats(B, T, Hq, D, operands))});
    cpu_.attention_backward(dqkv, dout, qkv, saved, B, T, Hq, Hkv, D, operands);
  }

  // ---- embeddings ------------------------------------------------------------------------------
  // wte holds the V rows of this vocabulary slice: [V, C].
  void embedding_forward(float* out, const int32_t* tokens, const float* wte,
                         int64_t vocab_start, int64_t V, int64_t N, int64_t C) override {
    OpScope s("embedding_forward", {span(out, N * C), span(tokens, N), span(wte, V * C)});
    cpu_.embedding_forward(out, tokens, wte, vocab_start, V, N, C);
  }
  void embedding_backward(float* dwte, const float* dout, const int32_t* tokens,
                          int64_t vocab_start, int64_t V, int64_t N, int64_t C) override {
    OpScope s("embedding_backward", {span(dwte, V * C), span(dout, N * C), span(tokens, N)});
    cpu_.embedding_backward(dwte, dout, tokens, vocab_start, V, N, C);
  }
  void positional_forward(float* out, const float* wpe, int64_t B, int64_t T, int64_t C) override {
    OpScope s("positional_forward", {span(out, B * T * C), span(wpe, T * C)});
    cpu_.positional_forward(out, wpe, B, T, C);
  }
  void positional_backward(float* dwpe, const float* dout, int64_t B, int64_t T,
                           int64_t C) override {
    OpScope s("positional_backward", {span(dwpe, T * C), span(dout, B * T * C)});
    cpu_.positional_backward(dwpe, dout, B, T, C);
  }
  void embedding_forward_half(Half type, float* out, const int32_t* tokens, const uint16_t* wte,
                              int64_t vocab_start, int64_t V, int64_t N, int64_t C) override {
    OpScope s("embedding_forward_half", {span(out, N * C), span(tokens, N), span(wte, V * C)});
    cpu_.embedding_forward_half(type, out, tokens, wte, vocab_start, V, N, C);
  }
  void positional_forward_half(Half type, float* out, const uint16_t* wpe, int64_t B, int64_t T,
                               int64_t C) override {
    OpScope s("positional_forward_half", {span(out, B * T * C), span(wpe, T * C)});
    cpu_.positional_forward_half(type, out, wpe, B, T, C);
  }

  // ---- cross-entropy ---------------------------------------------------------------------------
  void xent_max(float* rowmax, const float* logits, int64_t N, int64_t V, int64_t ld) override {
    EXA_CHECK(ld >= V, "guarded backend: xent_max: row stride {} below the {} columns", ld, V);
    OpScope s("xent_max", {span(rowmax, N), matrix(logits, N, V, ld)});
    cpu_.xent_max(rowmax, logits, N, V, ld);
  }
  void xent_stats(float* sumexp, float* target_logit, const float* logits, const float* rowmax,
                  const int32_t* targets, int64_t vocab_start, int64_t N, int64_t V, int64_t ld) override {
    EXA_CHECK(ld >= V, "guarded backend: xent_stats: row stride {} below the {} columns", ld, V);
    OpScope s("xent_stats", {span(sumexp, N), span(target_logit, N), matrix(logits, N, V, ld),
                             span(rowmax, N), span(targets, N)});
    cpu_.xent_stats(sumexp, target_logit, logits, rowmax, targets, vocab_start, N, V, ld);
  }
  void xent_backward(float* logits, const float* rowmax, const float* sumexp,
                     const int32_t* targets, int64_t vocab_start, float scale, int64_t N,
                     int64_t V, int64_t ld) override {
    EXA_CHECK(ld >= V, "guarded backend: xent_backward: row stride {} below the {} columns", ld, V);
    OpScope s("xent_backward", {matrix(logits, N, V, ld), span(rowmax, N), span(sumexp, N),
                                span(targets, N)});
    cpu_.xent_backward(logits, rowmax, sumexp, targets, vocab_start, scale, N, V, ld);
  }

  // ---- optimizer -------------------------------------------------------------------------------
  void adamw_update(float* param, const float* grad, float* m, float* v, int64_t n, float lr,
                    float beta1, float beta2, float eps, float weight_decay, float bc1, float bc2,
                    float grad_scale) override {
    OpScope s("adamw_update", {span(param, n), span(grad, n), span(m, n), span(v, n)});
    cpu_.adamw_update(param, grad, m, v, n, lr, beta1, beta2, eps, weight_decay, bc1, bc2,
                      grad_scale);
  }
  void momentum_update(float* out, float* buf, const float* grad, int64_t n, float momentum, bool nesterov,
                       float grad_scale) override {
    OpScope s("momentum_update", {span(out, n), span(buf, n), span(grad, n)});
    cpu_.momentum_update(out, buf, grad, n, momentum, nesterov, grad_scale);
  }
  void sgd_update(float* param, const float* grad, float* buf, int64_t n, float lr, float momentum, bool nesterov,
                  float weight_decay, float grad_scale) override {
    OpScope s("sgd_update", {span(param, n), span(grad, n), span(buf, n)});
    cpu_.sgd_update(param, grad, buf, n, lr, momentum, nesterov, weight_decay, grad_scale);
  }
  void lion_update(float* param, const float* grad, float* m, int64_t n, float lr, float beta1, float beta2,
                   float weight_decay, float grad_scale) override {
    OpScope s("lion_update", {span(param, n), span(grad, n), span(m, n)});
    cpu_.lion_update(param, grad, m, n, lr, beta1, beta2, weight_decay, grad_scale);
  }
  void lamb_update(float* param, const float* grad, float* m, float* v, float* scratch, int64_t n,
                   const LambStep& st) override {
    OpScope s("lamb_update", {span(param, n), span(grad, n), span(m, n), span(v, n), span(scratch, n)});
    cpu_.lamb_update(param, grad, m, v, scratch, n, st);
  }
  void adafactor_update(float* param, const float* grad, float* row, float* col, float* v, float* m, float* scratch,
                        int64_t rows, int64_t cols, const AdafactorStep& st) override {
    const int64_t n = rows * cols;
    OpScope s("adafactor_update", {span(param, n), span(grad, n), span(scratch, n), span(v, v ? n : 0),
                                   span(row, row ? rows : 0), span(col, col ? cols : 0), span(m, m ? n : 0)});
    cpu_.adafactor_update(param, grad, row, col, v, m, scratch, rows, cols, st);
  }
  void adam_direction(float* out, const float* grad, float* m, float* v, int64_t n, float beta1, float beta2,
                      float eps, float bc1, float bc2, float grad_scale) override {
    OpScope s("adam_direction", {span(out, n), span(grad, n), span(m, n), span(v, n)});
    cpu_.adam_direction(out, grad, m, v, n, beta1, beta2, eps, bc1, bc2, grad_scale);
  }
  bool sym_inverse_root(float* out, const float* A, int64_t n, double eps, int p) override {
    OpScope s("sym_inverse_root", {span(out, n * n), span(A, n * n)});
    return cpu_.sym_inverse_root(out, A, n, eps, p);
  }
  bool sym_eigenbasis(float* Q, const float* A, int64_t n) override {
    OpScope s("sym_eigenbasis", {span(Q, n * n), span(A, n * n)});
    return cpu_.sym_eigenbasis(Q, A, n);
  }
  bool sym_eigh(float* Q, float* d, const float* A, int64_t n) override {
    OpScope s("sym_eigh", {span(Q, n * n), span(d, n), span(A, n * n)});
    return cpu_.sym_eigh(Q, d, A, n);
  }
  void eigen_damped_divide(float* V, const float* dg, const float* da, int64_t rows, int64_t cols,
                           float damping) override {
    OpScope s("eigen_damped_divide", {span(V, rows * cols), span(dg, rows), span(da, cols)});
    cpu_.eigen_damped_divide(V, dg, da, rows, cols, damping);
  }
  bool power_qr_refresh(float* Q, const float* A, int64_t n, int64_t* order) override {
    OpScope s("power_qr_refresh", {span(Q, n * n), span(A, n * n)});
    return cpu_.power_qr_refresh(Q, A, n, order);
  }
  void permute_matrix(float* a, int64_t rows, int64_t cols, const int64_t* row_order, const int64_t* col_order) override {
    OpScope s("permute_matrix", {span(a, rows * cols)});
    cpu_.permute_matrix(a, rows, cols, row_order, col_order);
  }

  // ---- gradient compression -----------------------------------------------------------------
  void topk_abs(int32_t* idx, float* val, const float* x, int64_t n, int64_t k, int64_t base) override {
    OpScope s("topk_abs", {span(idx, k), span(val, k), span(x, n)});
    cpu_.topk_abs(idx, val, x, n, k, base);
  }
  void sample_abs(float* out, const float* x, int64_t n, int64_t samples, uint64_t seed) override {
    OpScope s("sample_abs", {span(out, samples), span(x, n)});
    cpu_.sample_abs(out, x, n, samples, seed);
  }
  int64_t select_abs_at_least(int32_t* idx, float* val, const float* x, int64_t n, float threshold,
                              int64_t cap, int64_t base) override {
    OpScope s("select_abs_at_least", {span(idx, cap), span(val, cap), span(x, n)});
    return cpu_.select_abs_at_least(idx, val, x, n, threshold, cap, base);
  }
  void gather(float* out, const float* x, int64_t n, const int32_t* idx, int64_t k) override {
    OpScope s("gather", {span(out, k), span(x, n), span(idx, k)});
    cpu_.gather(out, x, n, idx, k);
  }
  void scatter_add(float* x, int64_t n, const int32_t* idx, const float* val, int64_t k, int64_t base) override {
    OpScope s("scatter_add", {span(x, n), span(idx, k), span(val, k)});
    cpu_.scatter_add(x, n, idx, val, k, base);
  }
  void scatter_fill(float* x, int64_t n, const int32_t* idx, int64_t k, float value) override {
    OpScope s("scatter_fill", {span(x, n), span(idx, k)});
    cpu_.scatter_fill(x, n, idx, k, value);
  }
  void block_sum_squares(float* out, const float* x, int64_t n, int64_t block) override {
    OpScope s("block_sum_squares", {span(out, block > 0 ? (n + block - 1) / block : 0), span(x, n)});
    cpu_.block_sum_squares(out, x, n, block);
  }
  void gather_blocks(float* out, const float* x, int64_t n, const int32_t* blocks, int64_t kb, int64_t block) override {
    OpScope s("gather_blocks", {span(out, kb * block), span(x, n), span(blocks, kb)});
    cpu_.gather_blocks(out, x, n, blocks, kb, block);
  }
  void scatter_add_blocks(float* x, int64_t n, const int32_t* blocks, const float* val, int64_t kb,
                          int64_t block) override {
    OpScope s("scatter_add_blocks", {span(x, n), span(blocks, kb), span(val, kb * block)});
    cpu_.scatter_add_blocks(x, n, blocks, val, kb, block);
  }
  void fill_blocks(float* x, int64_t n, const int32_t* blocks, int64_t kb, int64_t block, float value) override {
    OpScope s("fill_blocks", {span(x, n), span(blocks, kb)});
    cpu_.fill_blocks(x, n, blocks, kb, block, value);
  }
  double sum_abs(const float* x, int64_t n) override {
    OpScope s("sum_abs", {span(x, n)});
    return cpu_.sum_abs(x, n);
  }
  void sign_pack(int32_t* bits, const float* x, int64_t n) override {
    OpScope s("sign_pack", {span(bits, (n + 31) / 32), span(x, n)});
    cpu_.sign_pack(bits, x, n);
  }
  void sign_unpack_add(float* x, const int32_t* bits, int64_t n, float scale) override {
    OpScope s("sign_unpack_add", {span(x, n), span(bits, (n + 31) / 32)});
    cpu_.sign_unpack_add(x, bits, n, scale);
  }
  void orthonormalize_columns(float* P, int64_t rows, int64_t cols) override {
    OpScope s("orthonormalize_columns", {span(P, rows * cols)});
    cpu_.orthonormalize_columns(P, rows, cols);
  }
  int64_t count_common(const int32_t* a, int64_t ka, const int32_t* b, int64_t kb) override {
    OpScope s("count_common", {span(a, ka), span(b, kb)});
    return cpu_.count_common(a, ka, b, kb);
  }
  // below and bounds are host arrays.
  void count_below(int64_t* below, const int32_t* idx, int64_t k, const int64_t* bounds, int64_t nb) override {
    OpScope s("count_below", {span(idx, k)});
    cpu_.count_below(below, idx, k, bounds, nb);
  }

 private:
  CpuBackend cpu_;
};

}  // namespace

std::unique_ptr<Backend> make_guarded_cpu_backend(int threads, int64_t parallel_min_work) {
  return std::make_unique<GuardedCpuBackend>(threads, parallel_min_work);
}

}  // namespace exatrain
