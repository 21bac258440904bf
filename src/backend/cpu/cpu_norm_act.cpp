// CPU backend: LayerNorm, RMSNorm, GELU, SwiGLU. Row-wise work is parallel over rows; the
// reductions over rows for weight/bias gradients are parallel over column blocks with the rows
// summed in order, so results do not depend on the thread count.
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "backend/cpu/cpu_backend.hpp"
#include "backend/cpu/vec_math.hpp"

namespace exatrain {

namespace {
constexpr int64_t kColBlock = 64;
}

void CpuBackend::layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                                   const float* w, const float* b, int64_t N, int64_t C,
                                   float eps) {
#pragma omp parallel for schedule(static) if (N * C >= min_work_)
  for (int64_t n = 0; n < N; n++) {
    const float* x = inp + n * C;
    float* y = out + n * C;
    float s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t c = 0; c < C; c++) s += x[c];
    float m = s / float(C);
    float var = 0;
#pragma omp simd reduction(+ : var)
    for (int64_t c = 0; c < C; c++) var += (x[c] - m) * (x[c] - m);
    float r = 1.0f / std::sqrt(var / float(C) + eps);
#pragma omp simd
    for (int64_t c = 0; c < C; c++) y[c] = (x[c] - m) * r * w[c] + b[c];
    mean[n] = m;
    rstd[n] = r;
  }
}

void CpuBackend::layernorm_backward(float* dinp, float* dw, float* db, const float* dout,
                                    const float* inp, const float* w, const float* mean,
                                    const float* rstd, int64_t N, int64_t C) {
  // dinp: per row, dx = rstd * (w*dy - mean(w*dy) - xhat * mean(w*dy*xhat)).
#pragma omp parallel for schedule(static) if (N * C >= min_work_)
  for (int64_t n = 0; n < N; n++) {
    const float* x = inp + n * C;
    const float* dy = dout + n * C;
    float* dx = dinp + n * C;
    const float m = mean[n], r = rstd[n];
    float sum_g = 0, sum_gx = 0;
#pragma omp simd reduction(+ : sum_g, sum_gx)
    for (int64_t c = 0; c < C; c++) {
      float g = w[c] * dy[c];
      sum_g += g;
      sum_gx += g * (x[c] - m) * r;
    }
    sum_g /= float(C);
    sum_gx /= float(C);
#pragma omp simd
    for (int64_t c = 0; c < C; c++) {
      float xhat = (x[c] - m) * r;
      dx[c] += (w[c] * dy[c] - sum_g - xhat * sum_gx) * r;
    }
  }
  // dw, db: column blocks, rows in order.
  const int64_t blocks = (C + kColBlock - 1) / kColBlock;
#pragma omp parallel for schedule(static) if (N * C >= min_work_)
  for (int64_t bi = 0; bi < blocks; bi++) {
    int64_t c0 = bi * kColBlock, c1 = std::min(C, c0 + kColBlock);
    float aw[kColBlock] = {}, ab[kColBlock] = {};
    for (int64_t n = 0; n < N; n++) {
      const float* x = inp + n * C;
      const float* dy = dout + n * C;
      const float m = mean[n], r = rstd[n];
#pragma omp simd
      for (int64_t c = c0; c < c1; c++) {
        aw[c - c0] += dy[c] * (x[c] - m) * r;
        ab[c - c0] += dy[c];
      }
    }
    for (int64_t c = c0; c < c1; c++) {
      dw[c] += aw[c - c0];
      db[c] += ab[c - c0];
    }
  }
}

void CpuBackend::rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w,
                                 int64_t N, int64_t C, float eps) {
#pragma omp parallel for schedule(static) if (N * C >= min_work_)
  for (int64_t n = 0; n < N; n++) {
    const float* x = inp + n * C;
    float* y = out + n * C;
    float ss = 0;
#pragma omp simd reduction(+ : ss)
    for (int64_t c = 0; c < C; c++) ss += x[c] * x[c];
    float r = 1.0f / std::sqrt(ss / float(C) + eps);
#pragma omp simd
    for (int64_t c = 0; c < C; c++) y[c] = x[c] * r * w[c];
    rstd[n] = r;
  }
}

void CpuBackend::rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp,
                                  const float* w, const float* rstd, int64_t N, int64_t C) {
  // y = w * x * r, r = (mean(x^2)+eps)^-1/2  =>  dx = r * (w*dy - x * r^2 * mean(w*dy*x)).
#pragma omp parallel for schedule(static) if (N * C >= min_work_)
  for (int64_t n = 0; n < N; n++) {
    const float* x = inp + n * C;
    const float* dy = dout + n * C;
    float* dx = dinp + n * C;
    const float r = rstd[n];
    float s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t c = 0; c < C; c++) s += w[c] * dy[c] * x[c];
    const float k = r * r * s / float(C);
#pragma omp simd
    for (int64_t c = 0; c < C; c++) dx[c] += r * (w[c] * dy[c] - x[c] * k);
  }
  const int64_t blocks = (C + kColBlock - 1) / kColBlock;
#pragma omp parallel for schedule(static) if (N * C >= min_work_)
  for (int64_t bi = 0; bi < blocks; bi++) {
    int64_t c0 = bi * kColBlock, c1 = std::min(C, c0 + kColBlock);
    float aw[kColBlock] = {};
    for (int64_t n = 0; n < N; n++) {
      const float* x = inp + n * C;
      const float* dy = dout + n * C;
      const float r = rstd[n];
#pragma omp simd
      for (int64_t c = c0; c < c1; c++) aw[c - c0] += dy[c] * x[c] * r;
    }
    for (int64_t c = c0; c < c1; c++) dw[c] += aw[c - c0];
  }
}

// ---- activations -------------------------------------------------------------------------------
// tanh and sigmoid come from vec_math.hpp so that these loops vectorise (see there).

namespace {
constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2/pi)
}

// The elementwise loops run over 4096-element chunks: `parallel for simd` on the whole range
// did not vectorise with GCC 12 (the chunked inner `omp simd` loop does).
namespace {
constexpr int64_t kChunk = 4096;
}

void CpuBackend::gelu_forward(float* out, const float* inp, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= min_work_)
  for (int64_t c0 = 0; c0 < n; c0 += kChunk) {
    const int64_t c1 = std::min(n, c0 + kChunk);
#pragma omp simd
    for (int64_t i = c0; i < c1; i++) {
      float x = inp[i];
      float u = kGeluC * (x + 0.044715f * x * x * x);
      out[i] = 0.5f * x * (1.0f + vm::tanh(u));
    }
  }
}

void CpuBackend::gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= min_work_)
  for (int64_t c0 = 0; c0 < n; c0 += kChunk) {
    const int64_t c1 = std::min(n, c0 + kChunk);
#pragma omp simd
    for (int64_t i = c0; i < c1; i++) {
      float x = inp[i];
      float u = kGeluC * (x + 0.044715f * x * x * x);
      float t = vm::tanh(u);
      float sech2 = 1.0f - t * t;
      float du = kGeluC * (1.0f + 3.0f * 0.044715f * x * x);
      dinp[i] = dout[i] * (0.5f * (1.0f + t) + 0.5f * x * sech2 * du);
    }
  }
}

void CpuBackend::swiglu_forward(float* out, const float* inp, int64_t N, int64_t F) {
#pragma omp parallel for schedule(static) if (N * F >= min_work_)
  for (int64_t n = 0; n < N; n++) {
    const float* gate = inp + n * 2 * F;
    const float* up = gate + F;
    float* y = out + n * F;
#pragma omp simd
    for (int64_t f = 0; f < F; f++) {
      float g = gate[f];
      float sig = vm::sigmoid(g);
      y[f] = g * sig * up[f];
    }
  }
}

void CpuBackend::swiglu_backward(float* dinp, const float* inp, const float* dout, int64_t N,
                                 int64_t F) {
#pragma omp parallel for schedule(static) if (N * F >= min_work_)
  for (int64_t n = 0; n < N; n++) {
    const float* gate = inp + n * 2 * F;
    const float* up = gate + F;
    const float* dy = dout + n * F;
    float* dgate = dinp + n * 2 * F;
    float* dup = dgate + F;
#pragma omp simd
    for (int64_t f = 0; f < F; f++) {
      float g = gate[f];
      float sig = vm::sigmoid(g);
      float silu = g * sig;
      dup[f] = dy[f] * silu;
      dgate[f] = dy[f] * up[f] * sig * (1.0f + g * (1.0f - sig));
    }
  }
}

}  // namespace exatrain
