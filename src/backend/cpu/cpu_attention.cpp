// CPU backend: rotary embedding, causal grouped-query attention, embeddings, cross-entropy.
// Attention is written llm.c-style (one fused loop per query row) rather than as batched
// GEMMs: at the sequence lengths trained on the CPU (<= 1024) it is a small share of the
// FLOPs, and the fused loop avoids materialising scores twice.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backend/cpu/cpu_backend.hpp"
#include "backend/cpu/vec_math.hpp"

namespace exatrain {

void CpuBackend::rope(float* x, int64_t B, int64_t T, int64_t row_stride, int64_t n_heads,
                      int64_t D, float theta, bool inverse) {
  const int64_t half = D / 2;
  // cos/sin table [T, D/2], computed like Hugging Face: inv_freq in float, angle = t*inv_freq.
  std::vector<float> cos_t(size_t(T * half)), sin_t(size_t(T * half));
  for (int64_t i = 0; i < half; i++) {
    float inv_freq = 1.0f / std::pow(theta, float(2 * i) / float(D));
    for (int64_t t = 0; t < T; t++) {
      float angle = float(t) * inv_freq;
      cos_t[size_t(t * half + i)] = std::cos(angle);
      sin_t[size_t(t * half + i)] = inverse ? -std::sin(angle) : std::sin(angle);
    }
  }
#pragma omp parallel for collapse(2) schedule(static) if (B * T * n_heads * D >= min_work_)
  for (int64_t b = 0; b < B; b++) {
    for (int64_t t = 0; t < T; t++) {
      float* row = x + (b * T + t) * row_stride;
      const float* c = cos_t.data() + t * half;
      const float* s = sin_t.data() + t * half;
      for (int64_t h = 0; h < n_heads; h++) {
        float* x1 = row + h * D;
        float* x2 = x1 + half;
#pragma omp simd
        for (int64_t i = 0; i < half; i++) {
          float a = x1[i], bb = x2[i];
          x1[i] = a * c[i] - bb * s[i];
          x2[i] = bb * c[i] + a * s[i];
        }
      }
    }
  }
}

void CpuBackend::attention_forward(float* out, float* probs, const float* qkv, int64_t B,
                                   int64_t T, int64_t Hq, int64_t Hkv, int64_t D, std::optional<Half>) {
  const int64_t W = (Hq + 2 * Hkv) * D;  // qkv row width
  const int64_t group = Hq / Hkv;
  const float scale = 1.0f / std::sqrt(float(D));
#pragma omp parallel for collapse(3) schedule(static) if (B * Hq * T * T * D >= min_work_)
  for (int64_t b = 0; b < B; b++) {
    for (int64_t h = 0; h < Hq; h++) {
      for (int64_t t = 0; t < T; t++) {
        const int64_t kvh = h / group;
        const float* q = qkv + (b * T + t) * W + h * D;
        float* p = probs + ((b * Hq + h) * T + t) * T;  // [T]
        float maxv = -std::numeric_limits<float>::infinity();
        for (int64_t t2 = 0; t2 <= t; t2++) {
          const float* k = qkv + (b * T + t2) * W + (Hq + kvh) * D;
          float s = 0;
#pragma omp simd reduction(+ : s)
          for (int64_t i = 0; i < D; i++) s += q[i] * k[i];
          s *= scale;
          p[t2] = s;
          maxv = std::max(maxv, s);
        }
        float sum = 0;
#pragma omp simd reduction(+ : sum)
        for (int64_t t2 = 0; t2 <= t; t2++) {
          float e = vm::exp(p[t2] - maxv);
          p[t2] = e;
          sum += e;
        }
        const float inv = 1.0f / sum;
        for (int64_t t2 = 0; t2 <= t; t2++) p[t2] *= inv;
        for (int64_t t2 = t + 1; t2 < T; t2++) p[t2] = 0.0f;
        if (out == nullptr) continue;
        float* o = out + (b * T + t) * Hq * D + h * D;  // [D]
        for (int64_t i = 0; i < D; i++) o[i] = 0.0f;
        for (int64_t t2 = 0; t2 <= t; t2++) {
          const float* v = qkv + (b * T + t2) * W + (Hq + Hkv + kvh) * D;
          const float pv = p[t2];
#pragma omp simd
          for (int64_t i = 0; i < D; i++) o[i] += pv * v[i];
        }
      }
    }
  }
}

void CpuBackend::attention_backward(float* dqkv, const float* dout, const float* qkv,
                                    const float* probs, int64_t B, int64_t T, int64_t Hq,
                                    int64_t Hkv, int64_t D, std::optional<Half>) {
  const int64_t W = (Hq + 2 * Hkv) * D;
  const int64_t group = Hq / Hkv;
  const float scale = 1.0f / std::sqrt(float(D));
  zero(dqkv, sizeof(float) * size_t(B * T * W));
  // Parallel over (batch, kv head): one task owns the dk/dv of its kv head and the dq of the
  // query heads that share it, so no two threads write the same element.
#pragma omp parallel for collapse(2) schedule(static) if (B * Hq * T * T * D >= min_work_)
  for (int64_t b = 0; b < B; b++) {
    for (int64_t kvh = 0; kvh < Hkv; kvh++) {
      std::vector<float> dp(static_cast<size_t>(T));
      for (int64_t h = kvh * group; h < (kvh + 1) * group; h++) {
        for (int64_t t = 0; t < T; t++) {
          const float* q = qkv + (b * T + t) * W + h * D;
          float* dq = dqkv + (b * T + t) * W + h * D;
          const float* dy = dout + (b * T + t) * Hq * D + h * D;
          const float* p = probs + ((b * Hq + h) * T + t) * T;
          // dp = dy . v ; dv += p * dy
          float dot = 0;
          for (int64_t t2 = 0; t2 <= t; t2++) {
            const float* v = qkv + (b * T + t2) * W + (Hq + Hkv + kvh) * D;
            float* dv = dqkv + (b * T + t2) * W + (Hq + Hkv + kvh) * D;
            float s = 0;
            const float pv = p[t2];
#pragma omp simd reduction(+ : s)
            for (int64_t i = 0; i < D; i++) {
              s += dy[i] * v[i];
              dv[i] += pv * dy[i];
            }
            dp[size_t(t2)] = s;
            dot += pv * s;
          }
          // softmax backward, then through the scaled q.k product.
          for (int64_t t2 = 0; t2 <= t; t2++) {
            const float ds = p[t2] * (dp[size_t(t2)] - dot) * scale;
            const float* k = qkv + (b * T + t2) * W + (Hq + kvh) * D;
            float* dk = dqkv + (b * T + t2) * W + (Hq + kvh) * D;
#pragma omp simd
            for (int64_t i = 0; i < D; i++) {
              dq[i] += ds * k[i];
              dk[i] += ds * q[i];
            }
          }
        }
      }
    }
  }
}

// ---- embeddings --------------------------------------------------------------------------------

void CpuBackend::embedding_forward(float* out, const int32_t* tokens, const float* wte,
                                   int64_t vocab_start, int64_t V, int64_t N, int64_t C) {
#pragma omp parallel for schedule(static) if (N * C >= min_work_)
  for (int64_t n = 0; n < N; n++) {
    const int64_t tok = int64_t(tokens[n]) - vocab_start;
    float* y = out + n * C;
    if (tok >= 0 && tok < V) {
      const float* e = wte + tok * C;
      for (int64_t c = 0; c < C; c++) y[c] = e[c];
    } else {
      for (int64_t c = 0; c < C; c++) y[c] = 0.0f;
    }
  }
}

void CpuBackend::embedding_backward(float* dwte, const float* dout, const int32_t* tokens,
                                    int64_t vocab_start, int64_t V, int64_t N, int64_t C) {
  // Several rows may hit the same token: parallel over column blocks, rows in order.
  const int64_t block = 64;
  const int64_t blocks = (C + block - 1) / block;
#pragma omp parallel for schedule(static) if (N * C >= min_work_)
  for (int64_t bi = 0; bi < blocks; bi++) {
    int64_t c0 = bi * block, c1 = std::min(C, c0 + block);
    for (int64_t n = 0; n < N; n++) {
      const int64_t tok = int64_t(tokens[n]) - vocab_start;
      if (tok < 0 || tok >= V) continue;
      float* dw = dwte + tok * C;
      const float* dy = dout + n * C;
#pragma omp simd
      for (int64_t c = c0; c < c1; c++) dw[c] += dy[c];
    }
  }
}

void CpuBackend::positional_forward(float* out, const float* wpe, int64_t B, int64_t T,
                                    int64_t C) {
#pragma omp parallel for collapse(2) schedule(static) if (B * T * C >= min_work_)
  for (int64_t b = 0; b < B; b++) {
    for (int64_t t = 0; t < T; t++) {
      float* y = out + (b * T + t) * C;
      const float* p = wpe + t * C;
#pragma omp simd
      for (int64_t c = 0; c < C; c++) y[c] += p[c];
    }
  }
}

void CpuBackend::positional_backward(float* dwpe, const float* dout, int64_t B, int64_t T,
                                     int64_t C) {
#pragma omp parallel for schedule(static) if (B * T * C >= min_work_)
  for (int64_t t = 0; t < T; t++) {
    float* dp = dwpe + t * C;
    for (int64_t b = 0; b < B; b++) {
      const float* dy = dout + (b * T + t) * C;
#pragma omp simd
      for (int64_t c = 0; c < C; c++) dp[c] += dy[c];
    }
  }
}

// ---- cross-entropy -----------------------------------------------------------------------------

void CpuBackend::xent_max(float* rowmax, const float* logits, int64_t N, int64_t V, int64_t ld) {
#pragma omp parallel for schedule(static) if (N * V >= min_work_)
  for (int64_t n = 0; n < N; n++) {
    const float* l = logits + n * ld;
    float m = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : m)
    for (int64_t v = 0; v < V; v++) m = std::max(m, l[v]);
    rowmax[n] = m;
  }
}

void CpuBackend::xent_stats(float* sumexp, float* target_logit, const float* logits,
                            const float* rowmax, const int32_t* targets, int64_t vocab_start,
                            int64_t N, int64_t V, int64_t ld) {
#pragma omp parallel for schedule(static) if (N * V >= min_work_)
  for (int64_t n = 0; n < N; n++) {
    const float* l = logits + n * ld;
    const float m = rowmax[n];
    double s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t v = 0; v < V; v++) s += double(vm::exp(l[v] - m));
    sumexp[n] = float(s);
    const int64_t t = int64_t(targets[n]) - vocab_start;
    target_logit[n] = (t >= 0 && t < V) ? l[t] : 0.0f;
  }
}

void CpuBackend::xent_backward(float* logits, const float* rowmax, const float* sumexp,
                               const int32_t* targets, int64_t vocab_start, float scale,
                               int64_t N, int64_t V, int64_t ld) {
#pragma omp parallel for schedule(static) if (N * V >= min_work_)
  for (int64_t n = 0; n < N; n++) {
    float* l = logits + n * ld;
    const float m = rowmax[n];
    const float inv = scale / sumexp[n];
#pragma omp simd
    for (int64_t v = 0; v < V; v++) l[v] = vm::exp(l[v] - m) * inv;
    const int64_t t = int64_t(targets[n]) - vocab_start;
    if (t >= 0 && t < V) l[t] -= scale;
  }
}

}  // namespace exatrain
