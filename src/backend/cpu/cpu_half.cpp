// CPU backend: 16-bit float conversions, the embedding lookups from 16-bit copies and the 16-bit
// GEMM with float32 accumulation (mixed precision, docs/precision.md).
//
// Two GEMM paths, chosen once when the backend is created (CpuBackend::CpuBackend):
//  * oneDNN's matmul primitive (bf16 x bf16 -> f32) when oneDNN reports that the CPU has
//    AVX512-BF16 (vdpbf16ps: pairs of bf16 products summed into float32 lanes) or AMX (tile
//    dot products of bf16 into float32). Why oneDNN: those are JIT-generated, blocked and packed
//    kernels per ISA (the library Intel maintains for PyTorch's own CPU bf16 matmuls); hand-written
//    AVX512-BF16/AMX GEMMs are not ours to maintain, and OpenBLAS 0.3.21 (Debian 12) has no
//    sbgemm that reports its path.
//  * elsewhere (and for fp16, which oneDNN 2.6 runs on CPUs only with AVX512-FP16, which it does
//    not report through get_effective_cpu_isa): convert op(A) and op(B) to float32 scratch and
//    call the float32 GEMM. A product of two 16-bit values is exact in float32 (8 + 8 or 11 + 11
//    significant bits), so this path differs from the first only in the order of the sums.
// Either way the inputs are 16-bit values and every product and sum is float32.
#include <omp.h>

#include <cstring>
#include <map>
#include <tuple>
#include <vector>
#include <dnnl.hpp>
#include <fmt/format.h>

#include "backend/cpu/cpu_backend.hpp"
#include "backend/half_convert.hpp"  // the conversions the CUDA kernels use too: the same bits
#include "core/check.hpp"

namespace exatrain {

namespace {

bool isa_has(dnnl::cpu_isa isa, dnnl::cpu_isa feature) {
  // cpu_isa values are bit masks: an ISA includes every feature bit of those it extends.
  return (unsigned(isa) & unsigned(feature)) == unsigned(feature);
}

}  // namespace

// oneDNN's matmul primitives by shape (creating one JIT-compiles a kernel; the model calls the
// same few shapes every step).
struct CpuBackend::HalfGemm {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  bool onednn_bf16 = false;
  std::string isa_name;
  using Key = std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, float, bool>;
  std::map<Key, dnnl::matmul> prims;
  std::vector<float> a32, b32;  // the conversion path's float32 copies of op(A), op(B)

  HalfGemm() {
    const dnnl::cpu_isa isa = dnnl::get_effective_cpu_isa();
    if (isa_has(isa, dnnl::cpu_isa::avx512_core_amx))
      onednn_bf16 = true, isa_name = "avx512_core_amx";
    else if (isa_has(isa, dnnl::cpu_isa::avx512_core_bf16))
      onednn_bf16 = true, isa_name = "avx512_core_bf16";
  }

  // C[M,N] (+)= alpha op(A) op(B) (accumulate: oneDNN's sum post-op, scale 1).
  void run(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A, int64_t lda,
           const uint16_t* B, int64_t ldb, bool accumulate, float* C, int64_t ldc) {
    using dt = dnnl::memory::data_type;
    using dims = dnnl::memory::dims;
    // op(A)[M,K]: stored [M,K] (strides lda, 1) or [K,M] (strides 1, lda); likewise B.
    const dnnl::memory::desc a({M, K}, dt::bf16, ta ? dims{1, lda} : dims{lda, 1});
    const dnnl::memory::desc b({K, N}, dt::bf16, tb ? dims{1, ldb} : dims{ldb, 1});
    const dnnl::memory::desc c({M, N}, dt::f32, dims{ldc, 1});
    const Key key{ta, tb, M, N, K, lda, ldb, ldc, alpha, accumulate};
    auto it = prims.find(key);
    if (it == prims.end()) {
      dnnl::primitive_attr attr;
      if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
      if (accumulate) {
        dnnl::post_ops po;
        po.append_sum(1.0f);
        attr.set_post_ops(po);
      }
      it = prims.emplace(key, dnnl::matmul(dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, c), attr, engine)))
               .first;
    }
    dnnl::memory am(a, engine, const_cast<uint16_t*>(A)), bm(b, engine, const_cast<uint16_t*>(B)), cm(c, engine, C);
    it->second.execute(stream, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
    stream.wait();
  }
};

void CpuBackend::init_half() { half_ = std::make_shared<HalfGemm>(); }
CpuBackend::~CpuBackend() = default;

std::string CpuBackend::gemm_half_path(Half type) const {
  if (type == Half::bf16 && half_->onednn_bf16)
    return fmt::format("oneDNN {}.{} matmul bf16 x bf16 -> fp32 ({})", DNNL_VERSION_MAJOR, DNNL_VERSION_MINOR,
                       half_->isa_name);
  if (type == Half::bf16)
    return "bf16 -> fp32 conversion + OpenBLAS sgemm (oneDNN reports no AVX512-BF16 or AMX on this CPU)";
  return "fp16 -> fp32 conversion + OpenBLAS sgemm (oneDNN 2.6 reports no fp16 matmul ISA)";
}

int64_t CpuBackend::scratch_bytes() const {
  return int64_t(sizeof(float) * (half_->a32.capacity() + half_->b32.capacity()));
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

namespace {
inline float widen(Half type, uint16_t h) {
  return type == Half::bf16 ? half_convert::bf16_to_f32(h) : half_convert::f16_to_f32(h);
}
}  // namespace

void CpuBackend::embedding_forward_half(Half type, float* out, const int32_t* tokens, const uint16_t* wte,
                                        int64_t vocab_start, int64_t V, int64_t N, int64_t C) {
#pragma omp parallel for schedule(static) if (N * C >= min_work_)
  for (int64_t n = 0; n < N; n++) {
    const int64_t tok = int64_t(tokens[n]) - vocab_start;
    float* y = out + n * C;
    const uint16_t* e = wte + tok * C;
    const bool here = tok >= 0 && tok < V;
    for (int64_t c = 0; c < C; c++) y[c] = here ? widen(type, e[c]) : 0.0f;
  }
}

void CpuBackend::positional_forward_half(Half type, float* out, const uint16_t* wpe, int64_t B, int64_t T,
                                         int64_t C) {
#pragma omp parallel for collapse(2) schedule(static) if (B * T * C >= min_work_)
  for (int64_t b = 0; b < B; b++)
    for (int64_t t = 0; t < T; t++) {
      float* y = out + (b * T + t) * C;
      const uint16_t* p = wpe + t * C;
      for (int64_t c = 0; c < C; c++) y[c] += widen(type, p[c]);
    }
}

void CpuBackend::gemm_half(Half type, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                           const uint16_t* A, int64_t lda, const uint16_t* B, int64_t ldb, float beta, float* C,
                           int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  const double t0 = omp_get_wtime(), sec = gemm_seconds, flops = gemm_flops;
  if (type == Half::bf16 && half_->onednn_bf16 && K > 0) {
    // beta: a pre-scale of C and oneDNN's sum post-op, so one primitive serves every beta != 0;
    // beta = 0 writes C without reading it.
    if (beta != 0.0f && beta != 1.0f) {
#pragma omp parallel for schedule(static) if (M * N >= min_work_)
      for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) C[m * ldc + n] *= beta;
    }
    half_->run(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta != 0.0f, C, ldc);
  } else {
    // op(A) and op(B) as float32 copies with the strides they are stored with.
    const int64_t a_n = K <= 0 ? 0 : (ta ? K - 1 : M - 1) * lda + (ta ? M : K);
    const int64_t b_n = K <= 0 ? 0 : (tb ? N - 1 : K - 1) * ldb + (tb ? K : N);
    if (int64_t(half_->a32.size()) < a_n + 1) half_->a32.resize(size_t(a_n + 1));
    if (int64_t(half_->b32.size()) < b_n + 1) half_->b32.resize(size_t(b_n + 1));
    half_to_f32(type, half_->a32.data(), A, a_n);
    half_to_f32(type, half_->b32.data(), B, b_n);
    gemm(ta, tb, M, N, K, alpha, half_->a32.data(), lda, half_->b32.data(), ldb, beta, C, ldc);
  }
  gemm_seconds = sec + (omp_get_wtime() - t0);
  gemm_flops = flops + 2.0 * double(M) * double(N) * double(K);
}

}  // namespace exatrain
