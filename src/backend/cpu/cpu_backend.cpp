// CPU backend: memory, GEMM (OpenBLAS), elementwise ops, reductions and the AdamW update.
#include "backend/cpu/cpu_backend.hpp"

#include <cblas.h>
#include <immintrin.h>
// GCC 12 false positive inside _mm512_sqrt_ps (its _mm512_undefined_ps operand).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <omp.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <vector>

#include "backend/half_convert.hpp"
#include "core/check.hpp"

namespace exatrain {

CpuBackend::CpuBackend(int threads, int64_t parallel_min_work) : min_work_(parallel_min_work) {
  threads_ = threads > 0 ? threads : omp_get_num_procs();
  // All parallelism is OpenMP with threads_ threads. OpenBLAS runs single-threaded inside our
  // OpenMP regions (gemm() splits the output matrix): with OpenBLAS's own pthread pool next to
  // the OpenMP team, each side's spin-waiting starved the other (a tiny model's step took
  // 200x longer on 2 cores), and one team keeps the thread count consistent by construction.
  omp_set_num_threads(threads_);
  openblas_set_num_threads(1);
}

std::unique_ptr<Backend> make_cpu_backend(int threads, int64_t parallel_min_work) {
  return std::make_unique<CpuBackend>(threads, parallel_min_work);
}

// ---- memory ------------------------------------------------------------------------------------

void* CpuBackend::alloc_bytes(size_t bytes) {
  size_t rounded = (bytes + 63) / 64 * 64;
  if (rounded == 0) rounded = 64;
  void* p = std::aligned_alloc(64, rounded);
  EXA_CHECK(p != nullptr, "cpu backend: cannot allocate {} bytes", bytes);
  std::memset(p, 0, rounded);  // also touches the pages, so RSS reflects the allocation
  return p;
}
void* CpuBackend::alloc_bytes_lazy(size_t bytes) {
  // A private anonymous mapping reads 0 and costs no memory until a page is written.
  const size_t len = bytes == 0 ? 1 : bytes;
  void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  EXA_SYSCHECK(p != MAP_FAILED, "cpu backend: mmap of {} bytes", bytes);
  mapped_[p] = len;
  return p;
}
void CpuBackend::free_bytes(void* p) {
  auto it = mapped_.find(p);
  if (it == mapped_.end()) {
    std::free(p);
    return;
  }
  EXA_SYSCHECK(munmap(p, it->second) == 0, "cpu backend: munmap of {} bytes", it->second);
  mapped_.erase(it);
}
void CpuBackend::upload(void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); }
void CpuBackend::download(void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); }
void CpuBackend::copy(void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); }

void CpuBackend::zero(void* p, size_t bytes) {
  // Parallel memset: the gradient arena of GPT-2 124M is 0.5 GB, zeroed every step.
  char* c = static_cast<char*>(p);
  const int64_t chunk = 1 << 20;
  const int64_t chunks = (int64_t(bytes) + chunk - 1) / chunk;
#pragma omp parallel for schedule(static) if (int64_t(bytes) / 4 >= min_work_)
  for (int64_t i = 0; i < chunks; i++) {
    int64_t begin = i * chunk;
    int64_t len = std::min<int64_t>(chunk, int64_t(bytes) - begin);
    std::memset(c + begin, 0, size_t(len));
  }
}

void CpuBackend::fill(float* x, float value, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n >= min_work_)
  for (int64_t i = 0; i < n; i++) x[i] = value;
}

void CpuBackend::release(float* x, int64_t n, float partial_fill, const float* free_begin,
                         const float* free_end) {
  EXA_CHECK(free_begin <= x && x + n <= free_end, "cpu backend: release of [{}, {}) outside the free range "
            "[{}, {})", static_cast<const void*>(x), static_cast<const void*>(x + n),
            static_cast<const void*>(free_begin), static_cast<const void*>(free_end));
  if (n <= 0) return;
  const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
  const uintptr_t b = uintptr_t(x), e = uintptr_t(x + n);
  // Whole pages inside [x, x+n); the first and last page touched also when they lie in the free range.
  uintptr_t lo = (b + page - 1) / page * page, hi = e / page * page;
  if (b / page * page >= uintptr_t(free_begin)) lo = b / page * page;
  if ((e + page - 1) / page * page <= uintptr_t(free_end)) hi = (e + page - 1) / page * page;
  if (hi <= lo) {
    fill(x, partial_fill, n);
    return;
  }
  // The parts of x outside [lo, hi) stay resident: they share a page with live data.
  if (b < lo) fill(x, partial_fill, int64_t((lo - b) / sizeof(float)));
  if (hi < e) fill(reinterpret_cast<float*>(hi), partial_fill, int64_t((e - hi) / sizeof(float)));
  EXA_SYSCHECK(madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED) == 0,
               "cpu backend: madvise(MADV_DONTNEED) of {} bytes", hi - lo);
}

// ---- GEMM --------------------------------------------------------------------------------------

namespace {

// One single-threaded sgemm on the block [m0, m1) x [n0, n1) of C. Splitting C by rows or
// columns leaves every element's K-summation unchanged, so results are independent of the
// thread count.
void sgemm_block(bool ta, bool tb, int64_t m0, int64_t m1, int64_t n0, int64_t n1, int64_t K,
                 float alpha, const float* A, int64_t lda, const float* B, int64_t ldb,
                 float beta, float* C, int64_t ldc) {
  if (m1 <= m0 || n1 <= n0) return;
  const float* a = ta ? A + m0 : A + m0 * lda;  // row m0 of op(A)
  const float* b = tb ? B + n0 * ldb : B + n0;  // column n0 of op(B)
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              int(m1 - m0), int(n1 - n0), int(K), alpha, a, int(lda), b, int(ldb), beta,
              C + m0 * ldc + n0, int(ldc));
}

void parallel_sgemm(int threads, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                    const float* A, int64_t lda, const float* B, int64_t ldb, float beta,
                    float* C, int64_t ldc) {
  const double flops = 2.0 * double(M) * double(N) * double(K);
  if (threads <= 1 || flops < 4e6) {  // small: one call, no team start-up
    sgemm_block(ta, tb, 0, M, 0, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  // Split the larger output dimension into `threads` contiguous parts (multiples of 16).
  const bool split_n = N >= M;
  const int64_t extent = split_n ? N : M;
  const int64_t part = ((extent + threads - 1) / threads + 15) / 16 * 16;
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int t = 0; t < threads; t++) {
    const int64_t lo = std::min(extent, t * part), hi = std::min(extent, lo + part);
    if (split_n)
      sgemm_block(ta, tb, 0, M, lo, hi, K, alpha, A, lda, B, ldb, beta, C, ldc);
    else
      sgemm_block(ta, tb, lo, hi, 0, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  }
}

}  // namespace

void CpuBackend::gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                      const float* A, int64_t lda, const float* B, int64_t ldb, float beta,
                      float* C, int64_t ldc) {
  double t0 = omp_get_wtime();
  parallel_sgemm(threads_, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  gemm_seconds += omp_get_wtime() - t0;
  gemm_flops += 2.0 * double(M) * double(N) * double(K);
}

void CpuBackend::gemm_strided_batched(bool trans_a, bool trans_b, int64_t M, int64_t N,
                                      int64_t K, float alpha, const float* A, int64_t lda,
                                      int64_t stride_a, const float* B, int64_t ldb,
                                      int64_t stride_b, float beta, float* C, int64_t ldc,
                                      int64_t stride_c, int64_t batch) {
  double t0 = omp_get_wtime();
  // Independent matrices: one single-threaded sgemm per matrix, matrices spread over threads.
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < batch; i++)
    sgemm_block(trans_a, trans_b, 0, M, 0, N, K, alpha, A + i * stride_a, lda, B + i * stride_b,
                ldb, beta, C + i * stride_c, ldc);
  gemm_seconds += omp_get_wtime() - t0;
  gemm_flops += 2.0 * double(M) * double(N) * double(K) * double(batch);
}

// ---- 16-bit GEMM and conversions ---------------------------------------------------------------
// A reference: op(A) and op(B) converted to float32 (exact), then the float32 GEMM, whose products
// and sums are float32, as the contract asks. The oneDNN bf16 path replaces it (issue 13, CPU part).

namespace {

// A [rows, cols] 16-bit matrix with row stride ld into a dense float32 [rows, cols].
std::vector<float> widen(Half type, const uint16_t* X, int64_t rows, int64_t cols, int64_t ld) {
  std::vector<float> out(size_t(rows * cols));
  for (int64_t r = 0; r < rows; r++)
    for (int64_t c = 0; c < cols; c++)
      out[size_t(r * cols + c)] = type == Half::bf16 ? half_convert::bf16_to_f32(X[r * ld + c])
                                                     : half_convert::f16_to_f32(X[r * ld + c]);
  return out;
}

}  // namespace

void CpuBackend::gemm_half(Half type, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                           float alpha, const uint16_t* A, int64_t lda, const uint16_t* B, int64_t ldb,
                           float beta, float* C, int64_t ldc) {
  const int64_t ra = trans_a ? K : M, ca = trans_a ? M : K, rb = trans_b ? N : K, cb = trans_b ? K : N;
  const std::vector<float> a = widen(type, A, ra, ca, lda), b = widen(type, B, rb, cb, ldb);
  gemm(trans_a, trans_b, M, N, K, alpha, a.data(), std::max<int64_t>(ca, 1), b.data(), std::max<int64_t>(cb, 1),
       beta, C, ldc);
}

void CpuBackend::f32_to_half(Half type, uint16_t* dst, const float* src, int64_t n) {
  if (type == Half::bf16) return f32_to_bf16(dst, src, n);
#pragma omp parallel for schedule(static) if (n >= min_work_)
  for (int64_t i = 0; i < n; i++) dst[i] = half_convert::f32_to_f16(src[i]);
}

void CpuBackend::half_to_f32(Half type, float* dst, const uint16_t* src, int64_t n) {
  if (type == Half::bf16) return bf16_to_f32(dst, src, n);
#pragma omp parallel for schedule(static) if (n >= min_work_)
  for (int64_t i = 0; i < n; i++) dst[i] = half_convert::f16_to_f32(src[i]);
}

// ---- elementwise -------------------------------------------------------------------------------

void CpuBackend::add_inplace(float* y, const float* x, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n >= min_work_)
  for (int64_t i = 0; i < n; i++) y[i] += x[i];
}

void CpuBackend::add(float* out, const float* a, const float* b, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n >= min_work_)
  for (int64_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

void CpuBackend::scale(float* x, float alpha, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n >= min_work_)
  for (int64_t i = 0; i < n; i++) x[i] *= alpha;
}

void CpuBackend::add_bias(float* out, const float* bias, int64_t N, int64_t O) {
#pragma omp parallel for schedule(static) if (N * O >= min_work_)
  for (int64_t n = 0; n < N; n++) {
    float* row = out + n * O;
#pragma omp simd
    for (int64_t o = 0; o < O; o++) row[o] += bias[o];
  }
}

void CpuBackend::bias_backward(float* dbias, const float* dout, int64_t N, int64_t O) {
  // Parallel over column blocks, rows summed in order: deterministic for any thread count.
  const int64_t block = 64;
  const int64_t blocks = (O + block - 1) / block;
#pragma omp parallel for schedule(static) if (N * O >= min_work_)
  for (int64_t bi = 0; bi < blocks; bi++) {
    int64_t o0 = bi * block, o1 = std::min(O, o0 + block);
    float acc[block] = {};
    for (int64_t n = 0; n < N; n++) {
      const float* row = dout + n * O;
#pragma omp simd
      for (int64_t o = o0; o < o1; o++) acc[o - o0] += row[o];
    }
    for (int64_t o = o0; o < o1; o++) dbias[o] += acc[o - o0];
  }
}

namespace {

// sum_i a[i] b[i] in double over fixed-size chunks summed in index order: the result does not
// depend on the thread count.
double chunked_dot(const float* a, const float* b, int64_t n, int64_t min_work) {
  const int64_t chunk = 1 << 14;
  const int64_t chunks = (n + chunk - 1) / chunk;
  std::vector<double> partial(size_t(std::max<int64_t>(chunks, 1)), 0.0);
#pragma omp parallel for schedule(static) if (n >= min_work)
  for (int64_t c = 0; c < chunks; c++) {
    int64_t i0 = c * chunk, i1 = std::min(n, i0 + chunk);
    double s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t i = i0; i < i1; i++) s += double(a[i]) * double(b[i]);
    partial[size_t(c)] = s;
  }
  double total = 0;
  for (double p : partial) total += p;
  return total;
}

}  // namespace

double CpuBackend::sum_squares(const float* x, int64_t n) { return chunked_dot(x, x, n, min_work_); }
double CpuBackend::dot(const float* a, const float* b, int64_t n) { return chunked_dot(a, b, n, min_work_); }

void CpuBackend::f32_to_bf16(uint16_t* dst, const float* src, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= min_work_)
  for (int64_t i = 0; i < n; i++) {
    uint32_t u;
    std::memcpy(&u, &src[i], 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep it a (quiet) NaN
      dst[i] = uint16_t((u >> 16) | 0x40u);
      continue;
    }
    u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
    dst[i] = uint16_t(u >> 16);
  }
}

void CpuBackend::bf16_to_f32(float* dst, const uint16_t* src, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n >= min_work_)
  for (int64_t i = 0; i < n; i++) {
    const uint32_t u = uint32_t(src[i]) << 16;
    std::memcpy(&dst[i], &u, 4);
  }
}

// ---- AdamW -------------------------------------------------------------------------------------

namespace {

// One contiguous chunk of the AdamW update. GCC 12 does not vectorise std::sqrt without
// -fno-math-errno (not in the project flags, and the optimize attribute does not reach it), so
// the AVX-512 path is written with intrinsics; _mm512_sqrt_ps is correctly rounded like sqrtf,
// and the operation order equals the scalar loop, so both paths give identical bits.
void adamw_chunk(float* param, const float* grad, float* m, float* v, int64_t n, float beta1,
                 float beta2, float eps, float decay, float step_size, float bc2_sqrt,
                 float grad_scale) {
  int64_t i = 0;
#ifdef __AVX512F__
  const __m512 b1 = _mm512_set1_ps(beta1), b2 = _mm512_set1_ps(beta2);
  const __m512 ob1 = _mm512_set1_ps(1.0f - beta1), ob2 = _mm512_set1_ps(1.0f - beta2);
  const __m512 gs = _mm512_set1_ps(grad_scale), dc = _mm512_set1_ps(decay);
  const __m512 ss = _mm512_set1_ps(step_size), bc = _mm512_set1_ps(bc2_sqrt);
  const __m512 ep = _mm512_set1_ps(eps);
  for (; i + 16 <= n; i += 16) {
    __m512 g = _mm512_mul_ps(_mm512_loadu_ps(grad + i), gs);
    // no FMA contraction: keep the scalar loop's rounding (mul, mul, add)
    __m512 mi = _mm512_add_ps(_mm512_mul_ps(b1, _mm512_loadu_ps(m + i)), _mm512_mul_ps(ob1, g));
    __m512 vi = _mm512_add_ps(_mm512_mul_ps(b2, _mm512_loadu_ps(v + i)),
                              _mm512_mul_ps(_mm512_mul_ps(ob2, g), g));
    _mm512_storeu_ps(m + i, mi);
    _mm512_storeu_ps(v + i, vi);
    __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(vi), bc), ep);
    __m512 p = _mm512_sub_ps(_mm512_mul_ps(_mm512_loadu_ps(param + i), dc),
                             _mm512_div_ps(_mm512_mul_ps(ss, mi), denom));
    _mm512_storeu_ps(param + i, p);
  }
#endif
  for (; i < n; i++) {
    float g = grad[i] * grad_scale;
    float mi = beta1 * m[i] + (1.0f - beta1) * g;
    float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    float denom = std::sqrt(vi) / bc2_sqrt + eps;
    param[i] = param[i] * decay - step_size * mi / denom;
  }
}

}  // namespace

void CpuBackend::adamw_update(float* param, const float* grad, float* m, float* v, int64_t n,
                              float lr, float beta1, float beta2, float eps, float weight_decay,
                              float bias_correction1, float bias_correction2, float grad_scale) {
  // Same operation order as torch.optim.AdamW (single-tensor path) so that 10-step loss
  // curves agree with PyTorch to float rounding.
  const float decay = 1.0f - lr * weight_decay;
  const float step_size = lr / bias_correction1;
  const float bc2_sqrt = std::sqrt(bias_correction2);
  const int64_t chunk = 16384;
#pragma omp parallel for schedule(static) if (n >= min_work_)
  for (int64_t c0 = 0; c0 < n; c0 += chunk) {
    const int64_t len = std::min(chunk, n - c0);
    adamw_chunk(param + c0, grad + c0, m + c0, v + c0, len, beta1, beta2, eps, decay, step_size,
                bc2_sqrt, grad_scale);
  }
}

void CpuBackend::momentum_update(float* out, float* buf, const float* grad, int64_t n, float momentum,
                                 bool nesterov, float grad_scale) {
  // Elementwise: the same bits for any thread count.
#pragma omp parallel for schedule(static) if (n >= min_work_)
  for (int64_t i = 0; i < n; i++) {
    const float g = grad[i] * grad_scale;
    const float b = momentum * buf[i] + g;
    buf[i] = b;
    out[i] = nesterov ? g + momentum * b : b;
  }
}

}  // namespace exatrain
