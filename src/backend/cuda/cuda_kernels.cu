// The CUDA backend's kernels: straightforward, correct CUDA first (issue 13): grid-stride loops for
// elementwise work, one block per row with warp-shuffle + shared-memory tree reductions for rows,
// one thread per output column summing rows in order for reductions across rows. No atomics
// (cuda_kernels.cuh: determinism). Compiled with --fmad=false (CMakeLists.txt): a*b+c rounds twice,
// as on the CPU backend (GCC in ISO mode does not contract), so the elementwise and optimizer
// kernels give the CPU's bits; exp/tanh are CUDA's expf/tanhf (the CPU's are its own polynomials).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "backend/cuda/cuda_kernels.cuh"
#include "backend/half_convert.hpp"

namespace exatrain::cuda {
namespace {

constexpr int kThreads = 256;

int blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return int(b < 1 ? 1 : (b > (1 << 20) ? (1 << 20) : b));  // grid-stride beyond
}

#define EXA_GRID_STRIDE(i, n) \
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); i += int64_t(gridDim.x) * blockDim.x)

template <class T>
__device__ T warp_sum(T v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// The sum over the block (blockDim.x a multiple of 32, at most 1024), returned to every thread.
// Fixed tree: the same bits for the same inputs and block size.
template <class T>
__device__ T block_sum(T v) {
  __shared__ T part[32];
  __syncthreads();  // part may still be read by a previous call
  v = warp_sum(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  if (lane == 0) part[warp] = v;
  __syncthreads();
  v = lane < nwarps ? part[lane] : T(0);
  return warp_sum(v);
}
__device__ float block_max(float v) {
  __shared__ float part[32];
  __syncthreads();
  v = warp_max(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  if (lane == 0) part[warp] = v;
  __syncthreads();
  v = lane < nwarps ? part[lane] : -INFINITY;
  return warp_max(v);
}

// ---- elementwise ----------------------------------------------------------------------------------
__global__ void k_fill(float* x, float value, int64_t n) { EXA_GRID_STRIDE(i, n) x[i] = value; }
__global__ void k_add_inplace(float* y, const float* x, int64_t n) { EXA_GRID_STRIDE(i, n) y[i] += x[i]; }
__global__ void k_add(float* out, const float* a, const float* b, int64_t n) {
  EXA_GRID_STRIDE(i, n) out[i] = a[i] + b[i];
}
__global__ void k_scale(float* x, float alpha, int64_t n) { EXA_GRID_STRIDE(i, n) x[i] *= alpha; }
__global__ void k_add_bias(float* out, const float* bias, int64_t N, int64_t O) {
  EXA_GRID_STRIDE(i, N * O) out[i] += bias[i % O];
}
// One thread per column, rows in order.
__global__ void k_bias_backward(float* dbias, const float* dout, int64_t N, int64_t O) {
  EXA_GRID_STRIDE(o, O) {
    float s = 0;
    for (int64_t n = 0; n < N; n++) s += dout[n * O + o];
    dbias[o] += s;
  }
}
__global__ void k_reduce_partials(int kind, const float* a, const float* b, int64_t n, double* partials) {
  double s = 0;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const double x = a[i];
    s += kind == 0 ? x * x : (kind == 1 ? x * double(b[i]) : fabs(x));
  }
  s = block_sum(s);
  if (threadIdx.x == 0) partials[blockIdx.x] = s;
}
__global__ void k_reduce_final(const double* partials, int count, double* result) {
  double s = 0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) s += partials[i];
  s = block_sum(s);
  if (threadIdx.x == 0) *result = s;
}
__global__ void k_f32_to_half(int half, uint16_t* dst, const float* src, int64_t n) {
  EXA_GRID_STRIDE(i, n) dst[i] = half == 0 ? half_convert::f32_to_bf16(src[i]) : half_convert::f32_to_f16(src[i]);
}
__global__ void k_half_to_f32(int half, float* dst, const uint16_t* src, int64_t n) {
  EXA_GRID_STRIDE(i, n) dst[i] = half == 0 ? half_convert::bf16_to_f32(src[i]) : half_convert::f16_to_f32(src[i]);
}

// ---- norms ------------------------------------------------------------------------------------------
__global__ void k_layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                                    const float* b, int64_t C, float eps) {
  const float* x = inp + int64_t(blockIdx.x) * C;
  float* y = out + int64_t(blockIdx.x) * C;
  float s = 0;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) s += x[c];
  const float m = block_sum(s) / float(C);
  float var = 0;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) var += (x[c] - m) * (x[c] - m);
  const float r = 1.0f / sqrtf(block_sum(var) / float(C) + eps);
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) y[c] = (x[c] - m) * r * w[c] + b[c];
  if (threadIdx.x == 0) mean[blockIdx.x] = m, rstd[blockIdx.x] = r;
}
__global__ void k_layernorm_backward_dx(float* dinp, const float* dout, const float* inp, const float* w,
                                        const float* mean, const float* rstd, int64_t C) {
  const int64_t row = blockIdx.x;
  const float *x = inp + row * C, *dy = dout + row * C;
  float* dx = dinp + row * C;
  const float m = mean[row], r = rstd[row];
  float sg = 0, sgx = 0;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float g = w[c] * dy[c];
    sg += g;
    sgx += g * (x[c] - m) * r;
  }
  sg = block_sum(sg) / float(C);
  sgx = block_sum(sgx) / float(C);
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float xhat = (x[c] - m) * r;
    dx[c] += (w[c] * dy[c] - sg - xhat * sgx) * r;
  }
}
__global__ void k_layernorm_backward_dw(float* dw, float* db, const float* dout, const float* inp,
                                        const float* mean, const float* rstd, int64_t N, int64_t C) {
  EXA_GRID_STRIDE(c, C) {
    float aw = 0, ab = 0;
    for (int64_t n = 0; n < N; n++) {
      const float dy = dout[n * C + c];
      aw += dy * (inp[n * C + c] - mean[n]) * rstd[n];
      ab += dy;
    }
    dw[c] += aw;
    db[c] += ab;
  }
}
__global__ void k_rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int64_t C, float eps) {
  const float* x = inp + int64_t(blockIdx.x) * C;
  float* y = out + int64_t(blockIdx.x) * C;
  float ss = 0;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) ss += x[c] * x[c];
  const float r = 1.0f / sqrtf(block_sum(ss) / float(C) + eps);
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) y[c] = x[c] * r * w[c];
  if (threadIdx.x == 0) rstd[blockIdx.x] = r;
}
__global__ void k_rmsnorm_backward_dx(float* dinp, const float* dout, const float* inp, const float* w,
                                      const float* rstd, int64_t C) {
  const int64_t row = blockIdx.x;
  const float *x = inp + row * C, *dy = dout + row * C;
  float* dx = dinp + row * C;
  const float r = rstd[row];
  float s = 0;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) s += w[c] * dy[c] * x[c];
  const float k = r * r * block_sum(s) / float(C);
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) dx[c] += r * (w[c] * dy[c] - x[c] * k);
}
__global__ void k_rmsnorm_backward_dw(float* dw, const float* dout, const float* inp, const float* rstd, int64_t N,
                                      int64_t C) {
  EXA_GRID_STRIDE(c, C) {
    float aw = 0;
    for (int64_t n = 0; n < N; n++) aw += dout[n * C + c] * inp[n * C + c] * rstd[n];
    dw[c] += aw;
  }
}

// ---- activations, rope ------------------------------------------------------------------------------
constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2/pi)
__global__ void k_gelu_forward(float* out, const float* inp, int64_t n) {
  EXA_GRID_STRIDE(i, n) {
    const float x = inp[i], u = kGeluC * (x + 0.044715f * x * x * x);
    out[i] = 0.5f * x * (1.0f + tanhf(u));
  }
}
__global__ void k_gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n) {
  EXA_GRID_STRIDE(i, n) {
    const float x = inp[i], u = kGeluC * (x + 0.044715f * x * x * x), t = tanhf(u);
    const float du = kGeluC * (1.0f + 3.0f * 0.044715f * x * x);
    dinp[i] = dout[i] * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du);
  }
}
__device__ float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }
__global__ void k_swiglu_forward(float* out, const float* inp, int64_t N, int64_t F) {
  EXA_GRID_STRIDE(i, N * F) {
    const int64_t n = i / F, f = i % F;
    const float g = inp[n * 2 * F + f], up = inp[n * 2 * F + F + f];
    out[i] = g * sigmoidf(g) * up;
  }
}
__global__ void k_swiglu_backward(float* dinp, const float* inp, const float* dout, int64_t N, int64_t F) {
  EXA_GRID_STRIDE(i, N * F) {
    const int64_t n = i / F, f = i % F;
    const float g = inp[n * 2 * F + f], up = inp[n * 2 * F + F + f], dy = dout[i], sig = sigmoidf(g);
    dinp[n * 2 * F + F + f] = dy * (g * sig);
    dinp[n * 2 * F + f] = dy * up * sig * (1.0f + g * (1.0f - sig));
  }
}
// One thread per (b, t, head, i < D/2); the angle as the CPU backend (and Hugging Face) computes it.
__global__ void k_rope(float* x, int64_t B, int64_t T, int64_t row_stride, int64_t n_heads, int64_t D, float theta,
                       bool inverse) {
  const int64_t half = D / 2;
  EXA_GRID_STRIDE(j, B * T * n_heads * half) {
    const int64_t i = j % half, h = (j / half) % n_heads, bt = j / (half * n_heads), t = bt % T;
    const float inv_freq = 1.0f / powf(theta, float(2 * i) / float(D));
    const float angle = float(t) * inv_freq, c = cosf(angle), s = inverse ? -sinf(angle) : sinf(angle);
    float* x1 = x + bt * row_stride + h * D + i;
    const float a = x1[0], b = x1[half];
    x1[0] = a * c - b * s;
    x1[half] = b * c + a * s;
  }
}

// ---- attention --------------------------------------------------------------------------------------
// One block per (query row t, head h, batch b): scores q.k/sqrt(D) for keys t2 <= t (a thread per key),
// the softmax over them (block max and sum), probs above the diagonal 0, then out = probs @ v (a
// thread per channel, keys in order).
__global__ void k_attention_forward(float* out, float* probs, const float* qkv, int64_t T, int64_t Hq, int64_t Hkv,
                                    int64_t D) {
  const int64_t t = blockIdx.x, h = blockIdx.y, b = blockIdx.z, W = (Hq + 2 * Hkv) * D, kvh = h / (Hq / Hkv);
  const float scale = 1.0f / sqrtf(float(D));
  const float* q = qkv + (b * T + t) * W + h * D;
  float* p = probs + ((b * Hq + h) * T + t) * T;
  float mx = -INFINITY;
  for (int64_t t2 = threadIdx.x; t2 <= t; t2 += blockDim.x) {
    const float* k = qkv + (b * T + t2) * W + (Hq + kvh) * D;
    float s = 0;
    for (int64_t i = 0; i < D; i++) s += q[i] * k[i];
    s *= scale;
    p[t2] = s;
    mx = fmaxf(mx, s);
  }
  mx = block_max(mx);
  float sum = 0;
  for (int64_t t2 = threadIdx.x; t2 <= t; t2 += blockDim.x) {
    const float e = expf(p[t2] - mx);
    p[t2] = e;
    sum += e;
  }
  const float inv = 1.0f / block_sum(sum);
  for (int64_t t2 = threadIdx.x; t2 < T; t2 += blockDim.x) p[t2] = t2 <= t ? p[t2] * inv : 0.0f;
  if (out == nullptr) return;
  __syncthreads();  // p (global) written by the block above is read by every thread below
  float* o = out + (b * T + t) * Hq * D + h * D;
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
    float acc = 0;
    for (int64_t t2 = 0; t2 <= t; t2++) acc += p[t2] * qkv[(b * T + t2) * W + (Hq + Hkv + kvh) * D + i];
    o[i] = acc;
  }
}
// Per query row: dp = dout . v, ds = p (dp - sum p dp) / sqrt(D) into dscores, dq = ds @ k (overwrites).
__global__ void k_attention_backward_q(float* dqkv, float* dscores, const float* dout, const float* qkv,
                                       const float* probs, int64_t T, int64_t Hq, int64_t Hkv, int64_t D) {
  const int64_t t = blockIdx.x, h = blockIdx.y, b = blockIdx.z, W = (Hq + 2 * Hkv) * D, kvh = h / (Hq / Hkv);
  const float scale = 1.0f / sqrtf(float(D));
  const float* dy = dout + (b * T + t) * Hq * D + h * D;
  const float* p = probs + ((b * Hq + h) * T + t) * T;
  float* ds = dscores + ((b * Hq + h) * T + t) * T;
  float dot = 0;
  for (int64_t t2 = threadIdx.x; t2 <= t; t2 += blockDim.x) {
    const float* v = qkv + (b * T + t2) * W + (Hq + Hkv + kvh) * D;
    float s = 0;
    for (int64_t i = 0; i < D; i++) s += dy[i] * v[i];
    ds[t2] = s;
    dot += p[t2] * s;
  }
  dot = block_sum(dot);
  for (int64_t t2 = threadIdx.x; t2 <= t; t2 += blockDim.x) ds[t2] = p[t2] * (ds[t2] - dot) * scale;
  __syncthreads();
  float* dq = dqkv + (b * T + t) * W + h * D;
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
    float acc = 0;
    for (int64_t t2 = 0; t2 <= t; t2++) acc += ds[t2] * qkv[(b * T + t2) * W + (Hq + kvh) * D + i];
    dq[i] = acc;
  }
}
// Per key row j of kv head kvh: dk = sum over the group's query heads and rows t >= j of ds q,
// dv = likewise of p dout (overwrite). A thread per channel; heads, then rows, in order.
__global__ void k_attention_backward_kv(float* dqkv, const float* dscores, const float* dout, const float* qkv,
                                        const float* probs, int64_t T, int64_t Hq, int64_t Hkv, int64_t D) {
  const int64_t j = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z, W = (Hq + 2 * Hkv) * D, group = Hq / Hkv;
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
    float dk = 0, dv = 0;
    for (int64_t h = kvh * group; h < (kvh + 1) * group; h++)
      for (int64_t t = j; t < T; t++) {
        const int64_t sc = ((b * Hq + h) * T + t) * T + j;
        dk += dscores[sc] * qkv[(b * T + t) * W + h * D + i];
        dv += probs[sc] * dout[(b * T + t) * Hq * D + h * D + i];
      }
    dqkv[(b * T + j) * W + (Hq + kvh) * D + i] = dk;
    dqkv[(b * T + j) * W + (Hq + Hkv + kvh) * D + i] = dv;
  }
}

// ---- embeddings, cross-entropy -----------------------------------------------------------------------
__global__ void k_embedding_forward(float* out, const int32_t* tokens, const float* wte, int64_t vocab_start,
                                    int64_t V, int64_t N, int64_t C) {
  EXA_GRID_STRIDE(i, N * C) {
    const int64_t n = i / C, c = i % C, tok = int64_t(tokens[n]) - vocab_start;
    out[i] = (tok >= 0 && tok < V) ? wte[tok * C + c] : 0.0f;
  }
}
// One thread per channel c owns column c of dwte and adds the rows in token order: no atomics.
__global__ void k_embedding_backward(float* dwte, const float* dout, const int32_t* tokens, int64_t vocab_start,
                                     int64_t V, int64_t N, int64_t C) {
  EXA_GRID_STRIDE(c, C) {
    for (int64_t n = 0; n < N; n++) {
      const int64_t tok = int64_t(tokens[n]) - vocab_start;
      if (tok >= 0 && tok < V) dwte[tok * C + c] += dout[n * C + c];
    }
  }
}
__global__ void k_positional_forward(float* out, const float* wpe, int64_t B, int64_t T, int64_t C) {
  EXA_GRID_STRIDE(i, B * T * C) out[i] += wpe[i % (T * C)];
}
__device__ inline float widen(int half, uint16_t h) {
  return half == 0 ? half_convert::bf16_to_f32(h) : half_convert::f16_to_f32(h);
}
__global__ void k_embedding_forward_half(int half, float* out, const int32_t* tokens, const uint16_t* wte,
                                         int64_t vocab_start, int64_t V, int64_t N, int64_t C) {
  EXA_GRID_STRIDE(i, N * C) {
    const int64_t n = i / C, c = i % C, tok = int64_t(tokens[n]) - vocab_start;
    out[i] = (tok >= 0 && tok < V) ? widen(half, wte[tok * C + c]) : 0.0f;
  }
}
__global__ void k_positional_forward_half(int half, float* out, const uint16_t* wpe, int64_t B, int64_t T,
                                          int64_t C) {
  EXA_GRID_STRIDE(i, B * T * C) out[i] += widen(half, wpe[i % (T * C)]);
}
__global__ void k_positional_backward(float* dwpe, const float* dout, int64_t B, int64_t T, int64_t C) {
  EXA_GRID_STRIDE(i, T * C) {
    float s = 0;
    for (int64_t b = 0; b < B; b++) s += dout[b * T * C + i];
    dwpe[i] += s;
  }
}
__global__ void k_xent_max(float* rowmax, const float* logits, int64_t V) {
  const float* l = logits + int64_t(blockIdx.x) * V;
  float m = -INFINITY;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) m = fmaxf(m, l[v]);
  m = block_max(m);
  if (threadIdx.x == 0) rowmax[blockIdx.x] = m;
}
__global__ void k_xent_stats(float* sumexp, float* target_logit, const float* logits, const float* rowmax,
                             const int32_t* targets, int64_t vocab_start, int64_t V) {
  const int64_t n = blockIdx.x;
  const float* l = logits + n * V;
  const float m = rowmax[n];
  double s = 0;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) s += double(expf(l[v] - m));
  s = block_sum(s);
  if (threadIdx.x == 0) {
    sumexp[n] = float(s);
    const int64_t t = int64_t(targets[n]) - vocab_start;
    target_logit[n] = (t >= 0 && t < V) ? l[t] : 0.0f;
  }
}
__global__ void k_xent_backward(float* logits, const float* rowmax, const float* sumexp, const int32_t* targets,
                                int64_t vocab_start, float scale, int64_t V) {
  const int64_t n = blockIdx.x, t = int64_t(targets[n]) - vocab_start;
  float* l = logits + n * V;
  const float m = rowmax[n], inv = scale / sumexp[n];
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
    float x = expf(l[v] - m) * inv;
    if (v == t) x -= scale;
    l[v] = x;
  }
}

// ---- optimizer (the CPU backend's expressions and operation order) ----------------------------------
__global__ void k_adamw(float* param, const float* grad, float* m, float* v, int64_t n, float beta1, float beta2,
                        float eps, float decay, float step_size, float bc2_sqrt, float grad_scale) {
  EXA_GRID_STRIDE(i, n) {
    const float g = grad[i] * grad_scale;
    const float mi = beta1 * m[i] + (1.0f - beta1) * g;
    const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    const float denom = sqrtf(vi) / bc2_sqrt + eps;
    param[i] = param[i] * decay - step_size * mi / denom;
  }
}
__global__ void k_momentum(float* out, float* buf, const float* grad, int64_t n, float momentum, bool nesterov,
                           float grad_scale) {
  EXA_GRID_STRIDE(i, n) {
    const float g = grad[i] * grad_scale, b = momentum * buf[i] + g;
    buf[i] = b;
    out[i] = nesterov ? g + momentum * b : b;
  }
}
__global__ void k_sgd(float* param, const float* grad, float* buf, int64_t n, float lr, float momentum,
                      bool nesterov, float weight_decay, float grad_scale) {
  EXA_GRID_STRIDE(i, n) {
    const float g = grad[i] * grad_scale + weight_decay * param[i], b = momentum * buf[i] + g;
    buf[i] = b;
    param[i] -= lr * (nesterov ? g + momentum * b : b);
  }
}
__global__ void k_lion(float* param, const float* grad, float* m, int64_t n, float lr, float beta1, float beta2,
                       float decay, float grad_scale) {
  EXA_GRID_STRIDE(i, n) {
    const float g = grad[i] * grad_scale, c = beta1 * m[i] + (1.0f - beta1) * g;
    const float sign = c > 0 ? 1.0f : (c < 0 ? -1.0f : 0.0f);
    param[i] = param[i] * decay - lr * sign;
    m[i] = beta2 * m[i] + (1.0f - beta2) * g;
  }
}
__global__ void k_adam_direction(float* out, const float* grad, float* m, float* v, int64_t n, float beta1,
                                 float beta2, float eps, float bc1, float bc2_sqrt, float grad_scale) {
  EXA_GRID_STRIDE(i, n) {
    const float g = grad[i] * grad_scale;
    m[i] = beta1 * m[i] + (1.0f - beta1) * g;
    v[i] = beta2 * v[i] + (1.0f - beta2) * g * g;
    out[i] = (m[i] / bc1) / (sqrtf(v[i]) / bc2_sqrt + eps);
  }
}
__global__ void k_eigen_damped_divide(float* V, const float* dg, const float* da, int64_t rows, int64_t cols,
                                      float damping) {
  EXA_GRID_STRIDE(i, rows * cols) V[i] /= dg[i / cols] * da[i % cols] + damping;
}
__global__ void k_permute(float* out, const float* a, int64_t rows, int64_t cols, const int64_t* ro,
                          const int64_t* co) {
  EXA_GRID_STRIDE(x, rows * cols) {
    const int64_t i = x / cols, j = x % cols;
    out[x] = a[(ro ? ro[i] : i) * cols + (co ? co[j] : j)];
  }
}

// Threads of a one-block-per-row kernel: enough for the row, a multiple of 32, at most 1024.
int row_threads(int64_t width) {
  const int64_t t = (width + 31) / 32 * 32;
  return int(t < 32 ? 32 : (t > 1024 ? 1024 : t));
}
// A grid of (T, heads, B) blocks: y and z are limited to 65535.
dim3 attention_grid(int64_t T, int64_t heads, int64_t B) { return dim3(unsigned(T), unsigned(heads), unsigned(B)); }

}  // namespace

#define EXA_LAUNCH(kernel, n, s, ...) \
  if ((n) > 0) kernel<<<blocks_for(n), kThreads, 0, s>>>(__VA_ARGS__)

void fill(cudaStream_t s, float* x, float value, int64_t n) { EXA_LAUNCH(k_fill, n, s, x, value, n); }
void add_inplace(cudaStream_t s, float* y, const float* x, int64_t n) { EXA_LAUNCH(k_add_inplace, n, s, y, x, n); }
void add(cudaStream_t s, float* out, const float* a, const float* b, int64_t n) {
  EXA_LAUNCH(k_add, n, s, out, a, b, n);
}
void scale(cudaStream_t s, float* x, float alpha, int64_t n) { EXA_LAUNCH(k_scale, n, s, x, alpha, n); }
void add_bias(cudaStream_t s, float* out, const float* bias, int64_t N, int64_t O) {
  EXA_LAUNCH(k_add_bias, N * O, s, out, bias, N, O);
}
void bias_backward(cudaStream_t s, float* dbias, const float* dout, int64_t N, int64_t O) {
  EXA_LAUNCH(k_bias_backward, O, s, dbias, dout, N, O);
}
void reduce_double(cudaStream_t s, int kind, const float* a, const float* b, int64_t n, double* partials,
                   double* result) {
  k_reduce_partials<<<kReduceBlocks, kThreads, 0, s>>>(kind, a, b, n, partials);
  k_reduce_final<<<1, kThreads, 0, s>>>(partials, kReduceBlocks, result);
}
void f32_to_half(cudaStream_t s, int half, uint16_t* dst, const float* src, int64_t n) {
  EXA_LAUNCH(k_f32_to_half, n, s, half, dst, src, n);
}
void half_to_f32(cudaStream_t s, int half, float* dst, const uint16_t* src, int64_t n) {
  EXA_LAUNCH(k_half_to_f32, n, s, half, dst, src, n);
}

void layernorm_forward(cudaStream_t s, float* out, float* mean, float* rstd, const float* inp, const float* w,
                       const float* b, int64_t N, int64_t C, float eps) {
  if (N > 0) k_layernorm_forward<<<unsigned(N), row_threads(C), 0, s>>>(out, mean, rstd, inp, w, b, C, eps);
}
void layernorm_backward(cudaStream_t s, float* dinp, float* dw, float* db, const float* dout, const float* inp,
                        const float* w, const float* mean, const float* rstd, int64_t N, int64_t C) {
  if (N <= 0) return;
  k_layernorm_backward_dx<<<unsigned(N), row_threads(C), 0, s>>>(dinp, dout, inp, w, mean, rstd, C);
  EXA_LAUNCH(k_layernorm_backward_dw, C, s, dw, db, dout, inp, mean, rstd, N, C);
}
void rmsnorm_forward(cudaStream_t s, float* out, float* rstd, const float* inp, const float* w, int64_t N,
                     int64_t C, float eps) {
  if (N > 0) k_rmsnorm_forward<<<unsigned(N), row_threads(C), 0, s>>>(out, rstd, inp, w, C, eps);
}
void rmsnorm_backward(cudaStream_t s, float* dinp, float* dw, const float* dout, const float* inp, const float* w,
                      const float* rstd, int64_t N, int64_t C) {
  if (N <= 0) return;
  k_rmsnorm_backward_dx<<<unsigned(N), row_threads(C), 0, s>>>(dinp, dout, inp, w, rstd, C);
  EXA_LAUNCH(k_rmsnorm_backward_dw, C, s, dw, dout, inp, rstd, N, C);
}
void gelu_forward(cudaStream_t s, float* out, const float* inp, int64_t n) { EXA_LAUNCH(k_gelu_forward, n, s, out, inp, n); }
void gelu_backward(cudaStream_t s, float* dinp, const float* inp, const float* dout, int64_t n) {
  EXA_LAUNCH(k_gelu_backward, n, s, dinp, inp, dout, n);
}
void swiglu_forward(cudaStream_t s, float* out, const float* inp, int64_t N, int64_t F) {
  EXA_LAUNCH(k_swiglu_forward, N * F, s, out, inp, N, F);
}
void swiglu_backward(cudaStream_t s, float* dinp, const float* inp, const float* dout, int64_t N, int64_t F) {
  EXA_LAUNCH(k_swiglu_backward, N * F, s, dinp, inp, dout, N, F);
}
void rope(cudaStream_t s, float* x, int64_t B, int64_t T, int64_t row_stride, int64_t n_heads, int64_t D,
          float theta, bool inverse) {
  EXA_LAUNCH(k_rope, B * T * n_heads * (D / 2), s, x, B, T, row_stride, n_heads, D, theta, inverse);
}

void attention_forward(cudaStream_t s, float* out, float* probs, const float* qkv, int64_t B, int64_t T,
                       int64_t Hq, int64_t Hkv, int64_t D) {
  if (B * T * Hq > 0) k_attention_forward<<<attention_grid(T, Hq, B), 128, 0, s>>>(out, probs, qkv, T, Hq, Hkv, D);
}
void attention_backward(cudaStream_t s, float* dqkv, float* dscores, const float* dout, const float* qkv,
                        const float* probs, int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t D) {
  if (B * T * Hq <= 0) return;
  k_attention_backward_q<<<attention_grid(T, Hq, B), 128, 0, s>>>(dqkv, dscores, dout, qkv, probs, T, Hq, Hkv, D);
  k_attention_backward_kv<<<attention_grid(T, Hkv, B), row_threads(D), 0, s>>>(dqkv, dscores, dout, qkv, probs, T,
                                                                               Hq, Hkv, D);
}

void embedding_forward(cudaStream_t s, float* out, const int32_t* tokens, const float* wte, int64_t vocab_start,
                       int64_t V, int64_t N, int64_t C) {
  EXA_LAUNCH(k_embedding_forward, N * C, s, out, tokens, wte, vocab_start, V, N, C);
}
void embedding_backward(cudaStream_t s, float* dwte, const float* dout, const int32_t* tokens,
                        int64_t vocab_start, int64_t V, int64_t N, int64_t C) {
  EXA_LAUNCH(k_embedding_backward, C, s, dwte, dout, tokens, vocab_start, V, N, C);
}
void positional_forward(cudaStream_t s, float* out, const float* wpe, int64_t B, int64_t T, int64_t C) {
  EXA_LAUNCH(k_positional_forward, B * T * C, s, out, wpe, B, T, C);
}
void embedding_forward_half(cudaStream_t s, int half, float* out, const int32_t* tokens, const uint16_t* wte,
                            int64_t vocab_start, int64_t V, int64_t N, int64_t C) {
  EXA_LAUNCH(k_embedding_forward_half, N * C, s, half, out, tokens, wte, vocab_start, V, N, C);
}
void positional_forward_half(cudaStream_t s, int half, float* out, const uint16_t* wpe, int64_t B, int64_t T,
                             int64_t C) {
  EXA_LAUNCH(k_positional_forward_half, B * T * C, s, half, out, wpe, B, T, C);
}
void positional_backward(cudaStream_t s, float* dwpe, const float* dout, int64_t B, int64_t T, int64_t C) {
  EXA_LAUNCH(k_positional_backward, T * C, s, dwpe, dout, B, T, C);
}
void xent_max(cudaStream_t s, float* rowmax, const float* logits, int64_t N, int64_t V) {
  if (N > 0) k_xent_max<<<unsigned(N), row_threads(V), 0, s>>>(rowmax, logits, V);
}
void xent_stats(cudaStream_t s, float* sumexp, float* target_logit, const float* logits, const float* rowmax,
                const int32_t* targets, int64_t vocab_start, int64_t N, int64_t V) {
  if (N > 0)
    k_xent_stats<<<unsigned(N), row_threads(V), 0, s>>>(sumexp, target_logit, logits, rowmax, targets, vocab_start, V);
}
void xent_backward(cudaStream_t s, float* logits, const float* rowmax, const float* sumexp, const int32_t* targets,
                   int64_t vocab_start, float scale, int64_t N, int64_t V) {
  if (N > 0)
    k_xent_backward<<<unsigned(N), row_threads(V), 0, s>>>(logits, rowmax, sumexp, targets, vocab_start, scale, V);
}

void adamw_update(cudaStream_t s, float* param, const float* grad, float* m, float* v, int64_t n, float beta1,
                  float beta2, float eps, float decay, float step_size, float bc2_sqrt, float grad_scale) {
  EXA_LAUNCH(k_adamw, n, s, param, grad, m, v, n, beta1, beta2, eps, decay, step_size, bc2_sqrt, grad_scale);
}
void momentum_update(cudaStream_t s, float* out, float* buf, const float* grad, int64_t n, float momentum,
                     bool nesterov, float grad_scale) {
  EXA_LAUNCH(k_momentum, n, s, out, buf, grad, n, momentum, nesterov, grad_scale);
}
void sgd_update(cudaStream_t s, float* param, const float* grad, float* buf, int64_t n, float lr, float momentum,
                bool nesterov, float weight_decay, float grad_scale) {
  EXA_LAUNCH(k_sgd, n, s, param, grad, buf, n, lr, momentum, nesterov, weight_decay, grad_scale);
}
void lion_update(cudaStream_t s, float* param, const float* grad, float* m, int64_t n, float lr, float beta1,
                 float beta2, float weight_decay, float grad_scale) {
  EXA_LAUNCH(k_lion, n, s, param, grad, m, n, lr, beta1, beta2, 1.0f - lr * weight_decay, grad_scale);
}
void adam_direction(cudaStream_t s, float* out, const float* grad, float* m, float* v, int64_t n, float beta1,
                    float beta2, float eps, float bc1, float bc2_sqrt, float grad_scale) {
  EXA_LAUNCH(k_adam_direction, n, s, out, grad, m, v, n, beta1, beta2, eps, bc1, bc2_sqrt, grad_scale);
}
void eigen_damped_divide(cudaStream_t s, float* V, const float* dg, const float* da, int64_t rows, int64_t cols,
                         float damping) {
  EXA_LAUNCH(k_eigen_damped_divide, rows * cols, s, V, dg, da, rows, cols, damping);
}
void permute_matrix(cudaStream_t s, float* out, const float* a, int64_t rows, int64_t cols,
                    const int64_t* row_order, const int64_t* col_order) {
  EXA_LAUNCH(k_permute, rows * cols, s, out, a, rows, cols, row_order, col_order);
}

}  // namespace exatrain::cuda
