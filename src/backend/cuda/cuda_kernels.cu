// The CUDA backend's kernels: straightforward, correct CUDA first (issue 13): grid-stride loops for
// elementwise work, one block per row with warp-shuffle + shared-memory tree reductions for rows,
// two fixed levels (row chunks, then the chunks in order) for sums across rows, the softmax of
// attention over scores that cuBLASLt makes (cuda_backend.cpp). No atomics
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
// Rows over grid y, columns over x: no 64-bit division per element.
__global__ void k_add_bias(float* out, const float* bias, int64_t N, int64_t O) {
  for (int64_t r = blockIdx.y; r < N; r += gridDim.y)
    for (int64_t o = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; o < O; o += int64_t(gridDim.x) * blockDim.x)
      out[r * O + o] += bias[o];
}
// ---- sums across rows (bias, norm weights): two fixed levels, no atomics ---------------------------
// Level 1: block (kColTile columns x kColLanes row lanes) sums chunk k's kColChunk rows of its columns,
// lane l taking rows l, l + kColLanes, ... in order, then the lanes in order: partial[j][k][c].
// Level 2: a thread per column adds the chunks in order to out_j[c]. The chunking is fixed (not the
// GPU's SM count), so the bits are the same run to run. term(r, c, C, j) is the j-th summed
// quantity (j < NOUT) of row r, column c.
constexpr int kColTile = 32, kColLanes = 8;
template <int NOUT, class Term>
__global__ void k_colsum_partial(Term term, int64_t N, int64_t C, int64_t chunks, float* partial) {
  __shared__ float sh[NOUT][kColLanes][kColTile];
  const int64_t c = int64_t(blockIdx.x) * kColTile + threadIdx.x;
  for (int64_t k = blockIdx.y; k < chunks; k += gridDim.y) {
    const int64_t r1 = min(N, (k + 1) * kColChunk);
    float acc[NOUT] = {};
    if (c < C)
      for (int64_t r = k * kColChunk + threadIdx.y; r < r1; r += kColLanes)
        for (int j = 0; j < NOUT; j++) acc[j] += term(r, c, C, j);
    __syncthreads();  // sh may still be read for the previous chunk
    for (int j = 0; j < NOUT; j++) sh[j][threadIdx.y][threadIdx.x] = acc[j];
    __syncthreads();
    if (threadIdx.y == 0 && c < C)
      for (int j = 0; j < NOUT; j++) {
        float s = 0;
        for (int l = 0; l < kColLanes; l++) s += sh[j][l][threadIdx.x];
        partial[(j * chunks + k) * C + c] = s;
      }
  }
}
template <int NOUT>
__global__ void k_colsum_final(float* out0, float* out1, const float* partial, int64_t chunks, int64_t C) {
  EXA_GRID_STRIDE(c, C) {
    for (int j = 0; j < NOUT; j++) {
      float s = 0;
      for (int64_t k = 0; k < chunks; k++) s += partial[(j * chunks + k) * C + c];
      (j == 0 ? out0 : out1)[c] += s;
    }
  }
}
struct BiasTerm {
  const float* dout;
  __device__ float operator()(int64_t r, int64_t c, int64_t C, int) const { return dout[r * C + c]; }
};
struct LayerNormTerm {  // j = 0: dw's, j = 1: db's
  const float *dout, *inp, *mean, *rstd;
  __device__ float operator()(int64_t r, int64_t c, int64_t C, int j) const {
    const float dy = dout[r * C + c];
    return j == 0 ? dy * (inp[r * C + c] - mean[r]) * rstd[r] : dy;
  }
};
struct RmsNormTerm {
  const float *dout, *inp, *rstd;
  __device__ float operator()(int64_t r, int64_t c, int64_t C, int) const {
    return dout[r * C + c] * inp[r * C + c] * rstd[r];
  }
};
template <int NOUT, class Term>
void colsum(cudaStream_t s, Term term, float* out0, float* out1, int64_t N, int64_t C, float* scratch) {
  if (N <= 0 || C <= 0) return;
  const int64_t chunks = (N + kColChunk - 1) / kColChunk;
  const dim3 grid(unsigned((C + kColTile - 1) / kColTile), unsigned(chunks < 65535 ? chunks : 65535));
  k_colsum_partial<NOUT><<<grid, dim3(kColTile, kColLanes), 0, s>>>(term, N, C, chunks, scratch);
  k_colsum_final<NOUT><<<blocks_for(C), kThreads, 0, s>>>(out0, out1, scratch, chunks, C);
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
// Four at a time (n % 4 == 0, src 16- and dst 8-byte aligned): the same scalar conversion of each.
__global__ void k_f32_to_half4(int half, uint2* dst, const float4* src, int64_t n4) {
  EXA_GRID_STRIDE(i, n4) {
    const float4 v = src[i];
    auto cv = [half](float x) -> uint32_t {
      return half == 0 ? half_convert::f32_to_bf16(x) : half_convert::f32_to_f16(x);
    };
    dst[i] = make_uint2(cv(v.x) | (cv(v.y) << 16), cv(v.z) | (cv(v.w) << 16));
  }
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

// ---- attention: the softmax over GEMM-made scores (cuda_backend.cpp makes them with cuBLASLt) -------
// Row r of the scores [B*Hq*T, T] belongs to query t = r % T: keys t2 <= t are its causal window.
// In place: the scaled scores in, the probabilities out (0 above the diagonal).
__global__ void k_causal_softmax(float* scores, int64_t T) {
  const int64_t r = blockIdx.x, t = r % T;
  float* p = scores + r * T;
  float mx = -INFINITY;
  for (int64_t t2 = threadIdx.x; t2 <= t; t2 += blockDim.x) mx = fmaxf(mx, p[t2]);
  mx = block_max(mx);
  float sum = 0;
  for (int64_t t2 = threadIdx.x; t2 <= t; t2 += blockDim.x) {
    const float e = expf(p[t2] - mx);
    p[t2] = e;
    sum += e;
  }
  const float inv = 1.0f / block_sum(sum);
  for (int64_t t2 = threadIdx.x; t2 < T; t2 += blockDim.x) p[t2] = t2 <= t ? p[t2] * inv : 0.0f;
}
// In place: dp = dout . v in, ds = p (dp - sum_t2 p dp) scale out (0 above the diagonal).
__global__ void k_causal_softmax_backward(float* ds, const float* probs, int64_t T, float scale) {
  const int64_t r = blockIdx.x, t = r % T;
  const float* p = probs + r * T;
  float* d = ds + r * T;
  float dot = 0;
  for (int64_t t2 = threadIdx.x; t2 <= t; t2 += blockDim.x) dot += p[t2] * d[t2];
  dot = block_sum(dot);
  for (int64_t t2 = threadIdx.x; t2 < T; t2 += blockDim.x) d[t2] = t2 <= t ? p[t2] * (d[t2] - dot) * scale : 0.0f;
}

// ---- embeddings, cross-entropy -----------------------------------------------------------------------
__global__ void k_embedding_forward(float* out, const int32_t* tokens, const float* wte, int64_t vocab_start,
                                    int64_t V, int64_t N, int64_t C) {
  EXA_GRID_STRIDE(i, N * C) {
    const int64_t n = i / C, c = i % C, tok = int64_t(tokens[n]) - vocab_start;
    out[i] = (tok >= 0 && tok < V) ? wte[tok * C + c] : 0.0f;
  }
}
// The embedding gradient in three passes, no atomics, the CPU backend's order and bits:
//   next[n]: the next position after n with the same token (-1: none), each block scanning the
//            tokens after its positions in shared-memory tiles until all its positions found one;
//   has_prev[m] = 1 where m is some position's next (each position is at most one's: the links
//            form one chain per token, in position order);
//   a block per chain head (has_prev 0) adds the chain's rows in order to dwte's row, a thread per channel.
constexpr int kEmbTile = 1024;
__global__ void k_embedding_next(int32_t* next, const int32_t* tokens, int64_t N) {
  __shared__ int32_t tile[kEmbTile];
  const int64_t n = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int32_t token = n < N ? tokens[n] : 0;
  int64_t nx = n < N ? -1 : -2;  // -1: still looking; -2: no position here
  for (int64_t base = int64_t(blockIdx.x) * blockDim.x + 1; base < N; base += kEmbTile) {
    if (__syncthreads_and(nx != -1)) break;  // also: every thread is done with the previous tile
    const int64_t len = min(int64_t(kEmbTile), N - base);
    for (int64_t i = threadIdx.x; i < len; i += blockDim.x) tile[i] = tokens[base + i];
    __syncthreads();
    if (nx == -1)
      for (int64_t i = 0; i < len; i++)
        if (base + i > n && tile[i] == token) {
          nx = base + i;
          break;
        }
  }
  if (n < N) next[n] = int32_t(nx);
}
__global__ void k_zero_i32(int32_t* x, int64_t n) { EXA_GRID_STRIDE(i, n) x[i] = 0; }
__global__ void k_embedding_heads(int32_t* has_prev, const int32_t* next, int64_t N) {
  EXA_GRID_STRIDE(n, N) if (next[n] >= 0) has_prev[next[n]] = 1;
}
__global__ void k_embedding_backward(float* dwte, const float* dout, const int32_t* tokens, const int32_t* next,
                                     const int32_t* has_prev, int64_t vocab_start, int64_t V, int64_t N, int64_t C) {
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const int64_t tok = int64_t(tokens[n]) - vocab_start;
    if (has_prev[n] || tok < 0 || tok >= V) continue;  // the same for the whole block
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      float acc = dwte[tok * C + c];
      for (int64_t m = n; m >= 0; m = next[m]) acc += dout[m * C + c];
      dwte[tok * C + c] = acc;
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
__global__ void k_xent_max(float* rowmax, const float* logits, int64_t V, int64_t ld) {
  const float* l = logits + int64_t(blockIdx.x) * ld;
  float m = -INFINITY;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) m = fmaxf(m, l[v]);
  m = block_max(m);
  if (threadIdx.x == 0) rowmax[blockIdx.x] = m;
}
__global__ void k_xent_stats(float* sumexp, float* target_logit, const float* logits, const float* rowmax,
                             const int32_t* targets, int64_t vocab_start, int64_t V, int64_t ld) {
  const int64_t n = blockIdx.x;
  const float* l = logits + n * ld;
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
                                int64_t vocab_start, float scale, int64_t V, int64_t ld) {
  const int64_t n = blockIdx.x, t = int64_t(targets[n]) - vocab_start;
  float* l = logits + n * ld;
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
}  // namespace

// An `if` without braces: never the body of an if/else without braces of its own (a dangling else).
#define EXA_LAUNCH(kernel, n, s, ...) \
  if ((n) > 0) kernel<<<blocks_for(n), kThreads, 0, s>>>(__VA_ARGS__)

void fill(cudaStream_t s, float* x, float value, int64_t n) { EXA_LAUNCH(k_fill, n, s, x, value, n); }
void add_inplace(cudaStream_t s, float* y, const float* x, int64_t n) { EXA_LAUNCH(k_add_inplace, n, s, y, x, n); }
void add(cudaStream_t s, float* out, const float* a, const float* b, int64_t n) {
  EXA_LAUNCH(k_add, n, s, out, a, b, n);
}
void scale(cudaStream_t s, float* x, float alpha, int64_t n) { EXA_LAUNCH(k_scale, n, s, x, alpha, n); }
void add_bias(cudaStream_t s, float* out, const float* bias, int64_t N, int64_t O) {
  if (N <= 0 || O <= 0) return;
  const int64_t gx = (O + kThreads - 1) / kThreads;
  k_add_bias<<<dim3(unsigned(gx < 1024 ? gx : 1024), unsigned(N < 65535 ? N : 65535)), kThreads, 0, s>>>(out, bias, N, O);
}
int64_t colsum_scratch_floats(int64_t N, int64_t C, int nout) {
  return int64_t(nout) * ((N + kColChunk - 1) / kColChunk) * C;
}
void bias_backward(cudaStream_t s, float* dbias, const float* dout, int64_t N, int64_t O, float* scratch) {
  colsum<1>(s, BiasTerm{dout}, dbias, nullptr, N, O, scratch);
}
void reduce_double(cudaStream_t s, int kind, const float* a, const float* b, int64_t n, double* partials,
                   double* result) {
  k_reduce_partials<<<kReduceBlocks, kThreads, 0, s>>>(kind, a, b, n, partials);
  k_reduce_final<<<1, kThreads, 0, s>>>(partials, kReduceBlocks, result);
}
void f32_to_half(cudaStream_t s, int half, uint16_t* dst, const float* src, int64_t n) {
  if (n % 4 == 0 && uintptr_t(src) % 16 == 0 && uintptr_t(dst) % 8 == 0) {  // braces: EXA_LAUNCH is an if
    EXA_LAUNCH(k_f32_to_half4, n / 4, s, half, reinterpret_cast<uint2*>(dst), reinterpret_cast<const float4*>(src), n / 4);
  } else {
    EXA_LAUNCH(k_f32_to_half, n, s, half, dst, src, n);
  }
}
void half_to_f32(cudaStream_t s, int half, float* dst, const uint16_t* src, int64_t n) {
  EXA_LAUNCH(k_half_to_f32, n, s, half, dst, src, n);
}

void layernorm_forward(cudaStream_t s, float* out, float* mean, float* rstd, const float* inp, const float* w,
                       const float* b, int64_t N, int64_t C, float eps) {
  if (N > 0) k_layernorm_forward<<<unsigned(N), row_threads(C), 0, s>>>(out, mean, rstd, inp, w, b, C, eps);
}
void layernorm_backward(cudaStream_t s, float* dinp, float* dw, float* db, const float* dout, const float* inp,
                        const float* w, const float* mean, const float* rstd, int64_t N, int64_t C, float* scratch) {
  if (N <= 0) return;
  k_layernorm_backward_dx<<<unsigned(N), row_threads(C), 0, s>>>(dinp, dout, inp, w, mean, rstd, C);
  colsum<2>(s, LayerNormTerm{dout, inp, mean, rstd}, dw, db, N, C, scratch);
}
void rmsnorm_forward(cudaStream_t s, float* out, float* rstd, const float* inp, const float* w, int64_t N,
                     int64_t C, float eps) {
  if (N > 0) k_rmsnorm_forward<<<unsigned(N), row_threads(C), 0, s>>>(out, rstd, inp, w, C, eps);
}
void rmsnorm_backward(cudaStream_t s, float* dinp, float* dw, const float* dout, const float* inp, const float* w,
                      const float* rstd, int64_t N, int64_t C, float* scratch) {
  if (N <= 0) return;
  k_rmsnorm_backward_dx<<<unsigned(N), row_threads(C), 0, s>>>(dinp, dout, inp, w, rstd, C);
  colsum<1>(s, RmsNormTerm{dout, inp, rstd}, dw, nullptr, N, C, scratch);
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

// Softmax rows: a block of up to 256 threads (a multiple of 32) per row.
void causal_softmax(cudaStream_t s, float* scores, int64_t rows, int64_t T) {
  if (rows > 0) k_causal_softmax<<<unsigned(rows), row_threads(T < 256 ? T : 256), 0, s>>>(scores, T);
}
void causal_softmax_backward(cudaStream_t s, float* ds, const float* probs, int64_t rows, int64_t T, float scale) {
  if (rows > 0)
    k_causal_softmax_backward<<<unsigned(rows), row_threads(T < 256 ? T : 256), 0, s>>>(ds, probs, T, scale);
}

void embedding_forward(cudaStream_t s, float* out, const int32_t* tokens, const float* wte, int64_t vocab_start,
                       int64_t V, int64_t N, int64_t C) {
  EXA_LAUNCH(k_embedding_forward, N * C, s, out, tokens, wte, vocab_start, V, N, C);
}
void embedding_backward(cudaStream_t s, float* dwte, const float* dout, const int32_t* tokens,
                        int64_t vocab_start, int64_t V, int64_t N, int64_t C, int32_t* scratch) {
  if (N <= 0 || C <= 0) return;
  int32_t *next = scratch, *has_prev = scratch + N;
  k_embedding_next<<<unsigned((N + 255) / 256), 256, 0, s>>>(next, tokens, N);
  EXA_LAUNCH(k_zero_i32, N, s, has_prev, N);  // a kernel: its errors reach the caller's launch check
  EXA_LAUNCH(k_embedding_heads, N, s, has_prev, next, N);
  k_embedding_backward<<<unsigned(N < (1 << 20) ? N : (1 << 20)), 256, 0, s>>>(dwte, dout, tokens, next, has_prev,
                                                                            vocab_start, V, N, C);
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
void xent_max(cudaStream_t s, float* rowmax, const float* logits, int64_t N, int64_t V, int64_t ld) {
  if (N > 0) k_xent_max<<<unsigned(N), row_threads(V), 0, s>>>(rowmax, logits, V, ld);
}
void xent_stats(cudaStream_t s, float* sumexp, float* target_logit, const float* logits, const float* rowmax,
                const int32_t* targets, int64_t vocab_start, int64_t N, int64_t V, int64_t ld) {
  if (N > 0)
    k_xent_stats<<<unsigned(N), row_threads(V), 0, s>>>(sumexp, target_logit, logits, rowmax, targets, vocab_start, V,
                                                        ld);
}
void xent_backward(cudaStream_t s, float* logits, const float* rowmax, const float* sumexp, const int32_t* targets,
                   int64_t vocab_start, float scale, int64_t N, int64_t V, int64_t ld) {
  if (N > 0)
    k_xent_backward<<<unsigned(N), row_threads(V), 0, s>>>(logits, rowmax, sumexp, targets, vocab_start, scale, V,
                                                           ld);
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
