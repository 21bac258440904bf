// The fused attention kernels (flash_attention.hpp has the algorithm, what is saved and why). Written
// in a small dialect of CUDA so that the same source runs on a GPU (flash_attention.cu, nvcc) and in
// the host emulator of the tests (tests/backend/simt_emulator.hpp, every thread a std::thread):
// threadIdx/blockIdx, __syncthreads/__syncwarp, dynamic shared memory through EXA_DYNAMIC_SHARED,
// and nvcuda::wmma's 16x16x16 fragments used only through load/store/mma/fill, never element by
// element (their lane layout is unspecified), so every row-wise step (masking, the online softmax,
// dS) goes through shared memory. No warp shuffles, no atomics. Include the dialect first.
//
// Block: kThreads threads = 4 warps; a warp owns 16 rows of the block's 64-row tile: query rows in
// the forward and dq kernels, key rows in the dk/dv kernel. Within a warp, lane l works on row
// l / 2, columns [32 (l % 2), 32 (l % 2) + 32) of a 64-column score tile (half the head's columns
// for a row of D), its partner lane l ^ 1 on the other half; the two combine through shared memory.
#pragma once
#include <cmath>
#include <cstdint>

#include "backend/cuda/flash_attention.hpp"
#include "backend/half_convert.hpp"

#ifndef EXA_DYNAMIC_SHARED
#error "include the CUDA dialect first: flash_attention.cu (nvcc) or tests/backend/simt_emulator.hpp (host)"
#endif

namespace exatrain::cuda::flash {

// kHalf: 0 = bf16, 1 = f16 (cuda_kernels.cuh's numbering).
template <int kHalf>
struct Elem;
template <>
struct Elem<0> {
  using type = __nv_bfloat16;
};
template <>
struct Elem<1> {
  using type = __half;
};

template <int kHalf>
__device__ __forceinline__ uint16_t to_half(float v) {
  return kHalf == 0 ? half_convert::f32_to_bf16(v) : half_convert::f32_to_f16(v);
}
template <int kHalf>
__device__ __forceinline__ float from_half(uint16_t h) {
  return kHalf == 0 ? half_convert::bf16_to_f32(h) : half_convert::f16_to_f32(h);
}
template <int kHalf>
__device__ __forceinline__ const typename Elem<kHalf>::type* as_elem(const uint16_t* p) {
  return reinterpret_cast<const typename Elem<kHalf>::type*>(p);
}

template <int kHalf>
using FragA = nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 16, typename Elem<kHalf>::type,
                                     nvcuda::wmma::row_major>;
template <int kHalf>
using FragBRow = nvcuda::wmma::fragment<nvcuda::wmma::matrix_b, 16, 16, 16, typename Elem<kHalf>::type,
                                        nvcuda::wmma::row_major>;
template <int kHalf>
using FragBCol = nvcuda::wmma::fragment<nvcuda::wmma::matrix_b, 16, 16, 16, typename Elem<kHalf>::type,
                                        nvcuda::wmma::col_major>;
using FragC = nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float>;

// dst[kTile][half_row] (16-bit) = rows [0, rows) of src (row r at src + r * stride, D floats),
// rounded; rows [rows, kTile) zero. All threads of the block.
template <int kHalf, int D>
__device__ void load_tile(uint16_t* dst, const float* src, int64_t stride, int rows) {
  for (int i = int(threadIdx.x); i < kTile * D; i += kThreads) {
    const int r = i / D, c = i % D;
    dst[r * Strides<D>::half_row + c] = to_half<kHalf>(r < rows ? src[int64_t(r) * stride + c] : 0.0f);
  }
}

// The warp's 16 rows of `tile` (16-bit, half_row apart) as D/16 matrix_a fragments.
template <int kHalf, int D>
__device__ void load_rows(FragA<kHalf>* f, const uint16_t* tile, int warp) {
  for (int kk = 0; kk < D / 16; kk++)
    nvcuda::wmma::load_matrix_sync(f[kk], as_elem<kHalf>(tile + warp * 16 * Strides<D>::half_row + kk * 16),
                                   Strides<D>::half_row);
}

// out[16][score_row] (float) = a[16][D] (fragments) @ tile[kTile][D]^T: the warp's 16 rows against the
// tile's 64 rows (scores q k^T, or dP = dout v^T, or their transposes in the dk/dv kernel).
template <int kHalf, int D>
__device__ void rows_times_tile_t(float* out, const FragA<kHalf>* a, const uint16_t* tile) {
  for (int n = 0; n < kTile / 16; n++) {
    FragC acc;
    nvcuda::wmma::fill_fragment(acc, 0.0f);
    for (int kk = 0; kk < D / 16; kk++) {
      FragBCol<kHalf> b;  // b(k, j) = tile[16 n + j][16 kk + k]
      nvcuda::wmma::load_matrix_sync(b, as_elem<kHalf>(tile + n * 16 * Strides<D>::half_row + kk * 16),
                                     Strides<D>::half_row);
      nvcuda::wmma::mma_sync(acc, a[kk], b, acc);
    }
    nvcuda::wmma::store_matrix_sync(out + n * 16, acc, Strides<D>::score_row, nvcuda::wmma::mem_row_major);
  }
}

// acc[D/16] += p[16][kTile] (16-bit, prob_row apart) @ tile[kTile][D]: the warp's probabilities or dS
// times the tile's v, dout, q or k.
template <int kHalf, int D>
__device__ void probs_times_tile(FragC* acc, const uint16_t* p, const uint16_t* tile) {
  for (int kk = 0; kk < kTile / 16; kk++) {
    FragA<kHalf> a;
    nvcuda::wmma::load_matrix_sync(a, as_elem<kHalf>(p + kk * 16), Strides<D>::prob_row);
    for (int n = 0; n < D / 16; n++) {
      FragBRow<kHalf> b;
      nvcuda::wmma::load_matrix_sync(b, as_elem<kHalf>(tile + kk * 16 * Strides<D>::half_row + n * 16),
                                     Strides<D>::half_row);
      nvcuda::wmma::mma_sync(acc[n], a, b, acc[n]);
    }
  }
}

// Writes the warp's 16 rows of D accumulators to global memory through `work` (the warp's float
// area): dst row r at dst + r * stride, only rows r < rows. All lanes of the warp.
template <int D>
__device__ void write_rows(float* dst, int64_t stride, int rows, const FragC* acc, float* work, int lane) {
  __syncwarp();  // every lane is done reading what `work` held
  for (int n = 0; n < D / 16; n++)
    nvcuda::wmma::store_matrix_sync(work + n * 16, acc[n], Strides<D>::out_row, nvcuda::wmma::mem_row_major);
  __syncwarp();
  for (int i = lane; i < 16 * D; i += 32) {
    const int r = i / D, c = i % D;
    if (r < rows) dst[int64_t(r) * stride + c] = work[r * Strides<D>::out_row + c];
  }
}

// ---- forward: one block per (query tile, query head, batch) --------------------------------------
// One step of the online softmax for the warp's 16 rows over one key tile (FlashAttention-2's
// Algorithm 1, lines 8-10): s (scaled by log2 e, masked in place) -> the new running max m, the
// probabilities 2^(s - m) rounded into p, the running sum l and the accumulators' rescaling.
template <int kHalf, int D>
__device__ void online_softmax_step(float* s, uint16_t* p, float* acc, float* stats, int t, int k0, int T,
                                    float scale_log2, int lane) {
  using S = Strides<D>;
  float* m = stats;           // [16] running max (log2 domain)
  float* l = stats + 16;      // [16] running sum
  float* part = stats + 32;   // [32] one partial per lane
  const int r = lane >> 1, c0 = 32 * (lane & 1);
  float mx = -INFINITY;
  for (int c = c0; c < c0 + 32; c++) {
    const int key = k0 + c;
    const float v = (key <= t && key < T) ? s[r * S::score_row + c] * scale_log2 : -INFINITY;
    s[r * S::score_row + c] = v;
    mx = fmaxf(mx, v);
  }
  part[lane] = mx;
  __syncwarp();
  const float m_old = m[r];
  const float m_new = fmaxf(m_old, fmaxf(part[2 * r], part[2 * r + 1]));  // finite: key k0 <= t, k0 < T
  float sum = 0.0f;
  for (int c = c0; c < c0 + 32; c++) {
    const float e = exp2f(s[r * S::score_row + c] - m_new);  // 2^-inf = 0 where masked
    p[r * S::prob_row + c] = to_half<kHalf>(e);
    sum += e;
  }
  __syncwarp();  // both lanes of each row have read part and m
  part[lane] = sum;
  __syncwarp();
  const float alpha = exp2f(m_old - m_new);  // 0 on the first tile (m_old = -inf)
  if ((lane & 1) == 0) {
    l[r] = alpha * l[r] + part[2 * r] + part[2 * r + 1];
    m[r] = m_new;
  }
  for (int c = (lane & 1) * (D / 2); c < (lane & 1) * (D / 2) + D / 2; c++) acc[r * S::out_row + c] *= alpha;
  __syncwarp();
}

template <int kHalf, int D>
__global__ void __launch_bounds__(kThreads) forward_kernel(Params p) {
  using S = Strides<D>;
  using M = ForwardSmem<D>;
  EXA_DYNAMIC_SHARED(unsigned char, smem);
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  uint16_t* sq = reinterpret_cast<uint16_t*>(smem + M::q);
  uint16_t* sk = reinterpret_cast<uint16_t*>(smem + M::k);
  uint16_t* sv = reinterpret_cast<uint16_t*>(smem + M::v);
  float* ss = reinterpret_cast<float*>(smem + M::scores) + warp * 16 * S::score_row;
  uint16_t* sp = reinterpret_cast<uint16_t*>(smem + M::probs) + warp * 16 * S::prob_row;
  float* so = reinterpret_cast<float*>(smem + M::acc) + warp * 16 * S::out_row;
  float* stats = reinterpret_cast<float*>(smem + M::stats) + warp * 64;

  const int n_tiles = (p.T + kTile - 1) / kTile;
  const int qt = n_tiles - 1 - int(blockIdx.x);  // the longest rows first
  const int h = int(blockIdx.y), b = int(blockIdx.z), kvh = h / (p.Hq / p.Hkv);
  const int64_t W = int64_t(p.Hq + 2 * p.Hkv) * D, HD = int64_t(p.Hq) * D;
  const int q0 = qt * kTile;
  const float* base = p.qkv + int64_t(b) * p.T * W;
  load_tile<kHalf, D>(sq, base + int64_t(q0) * W + int64_t(h) * D, W, p.T - q0 < kTile ? p.T - q0 : kTile);
  for (int i = lane; i < 16 * D; i += 32) so[(i / D) * S::out_row + i % D] = 0.0f;
  if (lane < 16) {
    stats[lane] = -INFINITY;
    stats[16 + lane] = 0.0f;
  }
  __syncthreads();
  FragA<kHalf> qf[D / 16];
  load_rows<kHalf, D>(qf, sq, warp);
  const int t = q0 + warp * 16 + (lane >> 1);  // this lane's query row
  const float scale_log2 = p.scale * 1.4426950408889634f;
  for (int kt = 0; kt <= qt; kt++) {
    const int k0 = kt * kTile, rows = p.T - k0 < kTile ? p.T - k0 : kTile;
    __syncthreads();  // every warp is done with the previous k and v
    load_tile<kHalf, D>(sk, base + int64_t(k0) * W + int64_t(p.Hq + kvh) * D, W, rows);
    load_tile<kHalf, D>(sv, base + int64_t(k0) * W + int64_t(p.Hq + p.Hkv + kvh) * D, W, rows);
    __syncthreads();
    rows_times_tile_t<kHalf, D>(ss, qf, sk);  // s = q k^T [16][64]
    __syncwarp();
    online_softmax_step<kHalf, D>(ss, sp, so, stats, t, k0, p.T, scale_log2, lane);
    for (int n = 0; n < D / 16; n++) {  // o = o * alpha + p v, the accumulators through shared memory
      FragC acc;
      nvcuda::wmma::load_matrix_sync(acc, so + n * 16, S::out_row, nvcuda::wmma::mem_row_major);
      for (int kk = 0; kk < kTile / 16; kk++) {
        FragA<kHalf> a;
        FragBRow<kHalf> v;
        nvcuda::wmma::load_matrix_sync(a, as_elem<kHalf>(sp + kk * 16), S::prob_row);
        nvcuda::wmma::load_matrix_sync(v, as_elem<kHalf>(sv + kk * 16 * S::half_row + n * 16), S::half_row);
        nvcuda::wmma::mma_sync(acc, a, v, acc);
      }
      nvcuda::wmma::store_matrix_sync(so + n * 16, acc, S::out_row, nvcuda::wmma::mem_row_major);
    }
    __syncwarp();
  }
  // out = o / l; lse = m + log2 l; the 16-bit copy for the backward's delta.
  const int rows = p.T - (q0 + warp * 16);
  for (int i = lane; i < 16 * D; i += 32) {
    const int r = i / D, c = i % D;
    if (r >= rows) continue;
    const float v = so[r * S::out_row + c] / stats[16 + r];
    const int64_t at = (int64_t(b) * p.T + q0 + warp * 16 + r) * HD + int64_t(h) * D + c;
    p.o16[at] = to_half<kHalf>(v);
    if (p.out != nullptr) p.out[at] = v;
  }
  if (lane < 16 && lane < rows)
    p.lse[(int64_t(b) * p.Hq + h) * p.T + q0 + warp * 16 + lane] = stats[lane] + log2f(stats[16 + lane]);
}

// ---- backward ------------------------------------------------------------------------------------
// The warp's 16 x 64 tile of dS = P o (dP - delta) / sqrt(D), P = 2^(s log2 e - lse), masked where
// the key is after the query or either lies beyond T; rounded into ds (and P into p when p is not
// null). `s` and `dp` are the warp's float tiles [16][score_row]. Row r / column c is query
// q_of(r, c), key k_of(r, c); lse and delta are read per query. All lanes.
template <int kHalf, int D, class QueryOf, class KeyOf, class LseOf, class DeltaOf>
__device__ void probs_and_ds(uint16_t* pp, uint16_t* ds, const float* s, const float* dp, int T, float scale,
                             QueryOf q_of, KeyOf k_of, LseOf lse_of, DeltaOf delta_of, int lane) {
  using S = Strides<D>;
  const float scale_log2 = scale * 1.4426950408889634f;
  const int r = lane >> 1, c0 = 32 * (lane & 1);
  for (int c = c0; c < c0 + 32; c++) {
    const int q = q_of(r, c), key = k_of(r, c);
    const bool ok = key <= q && q < T && key < T;
    const float pr = ok ? exp2f(s[r * S::score_row + c] * scale_log2 - lse_of(r, c)) : 0.0f;
    const float d = pr * (dp[r * S::score_row + c] - delta_of(r, c)) * scale;
    if (pp != nullptr) pp[r * S::prob_row + c] = to_half<kHalf>(pr);
    ds[r * S::prob_row + c] = to_half<kHalf>(d);
  }
}

// dq: one block per (query tile, query head, batch). Also writes delta of its rows, which the dk/dv
// kernel (launched after it) reads.
template <int kHalf, int D>
__global__ void __launch_bounds__(kThreads) dq_kernel(Params p) {
  using S = Strides<D>;
  using M = DqSmem<D>;
  EXA_DYNAMIC_SHARED(unsigned char, smem);
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  uint16_t* sa = reinterpret_cast<uint16_t*>(smem + M::a);  // q, then k
  uint16_t* sb = reinterpret_cast<uint16_t*>(smem + M::b);  // dout, then v
  float* work = reinterpret_cast<float*>(smem + M::work) + warp * S::work_floats;
  float* ss = work;
  float* sdp = work + 16 * S::score_row;
  uint16_t* sds = reinterpret_cast<uint16_t*>(smem + M::ds) + warp * 16 * S::prob_row;
  float* stats = reinterpret_cast<float*>(smem + M::stats) + warp * 64;  // lse[16], delta[16], part[32]

  const int n_tiles = (p.T + kTile - 1) / kTile;
  const int qt = n_tiles - 1 - int(blockIdx.x);
  const int h = int(blockIdx.y), b = int(blockIdx.z), kvh = h / (p.Hq / p.Hkv);
  const int64_t W = int64_t(p.Hq + 2 * p.Hkv) * D, HD = int64_t(p.Hq) * D;
  const int q0 = qt * kTile, qrows = p.T - q0 < kTile ? p.T - q0 : kTile;
  const float* base = p.qkv + int64_t(b) * p.T * W;
  load_tile<kHalf, D>(sa, base + int64_t(q0) * W + int64_t(h) * D, W, qrows);
  load_tile<kHalf, D>(sb, p.dout + (int64_t(b) * p.T + q0) * HD + int64_t(h) * D, HD, qrows);
  // delta = rowsum(dout * out) of the warp's rows: each lane half a row, the pair through `part`.
  const int r = lane >> 1, t = q0 + warp * 16 + r;
  float part_sum = 0.0f;
  if (t < p.T) {
    const int64_t at = (int64_t(b) * p.T + t) * HD + int64_t(h) * D;
    for (int c = (lane & 1) * (D / 2); c < (lane & 1) * (D / 2) + D / 2; c++)
      part_sum += p.dout[at + c] * from_half<kHalf>(p.o16[at + c]);
  }
  stats[32 + lane] = part_sum;
  __syncwarp();
  if ((lane & 1) == 0) {
    const float delta = stats[32 + 2 * r] + stats[32 + 2 * r + 1];
    const int64_t row = (int64_t(b) * p.Hq + h) * p.T + t;
    stats[r] = t < p.T ? p.lse[row] : 0.0f;
    stats[16 + r] = delta;
    if (t < p.T) p.delta[row] = delta;
  }
  __syncthreads();
  FragA<kHalf> qf[D / 16], dof[D / 16];
  load_rows<kHalf, D>(qf, sa, warp);
  load_rows<kHalf, D>(dof, sb, warp);
  FragC dq[D / 16];
  for (int n = 0; n < D / 16; n++) nvcuda::wmma::fill_fragment(dq[n], 0.0f);
  const int tw = q0 + warp * 16;
  for (int kt = 0; kt <= qt; kt++) {
    const int k0 = kt * kTile, rows = p.T - k0 < kTile ? p.T - k0 : kTile;
    __syncthreads();  // every warp has its fragments of q and dout / is done with the previous k, v
    load_tile<kHalf, D>(sa, base + int64_t(k0) * W + int64_t(p.Hq + kvh) * D, W, rows);
    load_tile<kHalf, D>(sb, base + int64_t(k0) * W + int64_t(p.Hq + p.Hkv + kvh) * D, W, rows);
    __syncthreads();
    rows_times_tile_t<kHalf, D>(ss, qf, sa);    // s = q k^T
    rows_times_tile_t<kHalf, D>(sdp, dof, sb);  // dP = dout v^T
    __syncwarp();
    probs_and_ds<kHalf, D>(
        nullptr, sds, ss, sdp, p.T, p.scale, [&](int rr, int) { return tw + rr; },
        [&](int, int c) { return k0 + c; }, [&](int rr, int) { return stats[rr]; },
        [&](int rr, int) { return stats[16 + rr]; }, lane);
    __syncwarp();
    probs_times_tile<kHalf, D>(dq, sds, sa);  // dq += dS k
  }
  write_rows<D>(p.dqkv + (int64_t(b) * p.T + tw) * W + int64_t(h) * D, W, p.T - tw, dq, work, lane);
}

// dk, dv: one block per (key tile, kv head, batch), over the group's query heads and the query tiles
// at or after the key tile.
template <int kHalf, int D>
__global__ void __launch_bounds__(kThreads) dkv_kernel(Params p) {
  using S = Strides<D>;
  using M = DkvSmem<D>;
  EXA_DYNAMIC_SHARED(unsigned char, smem);
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  uint16_t* sa = reinterpret_cast<uint16_t*>(smem + M::a);  // k, then q
  uint16_t* sb = reinterpret_cast<uint16_t*>(smem + M::b);  // v, then dout
  float* work = reinterpret_cast<float*>(smem + M::work) + warp * S::work_floats;
  float* ss = work;                       // s^T = k q^T   [16 keys][64 queries]
  float* sdp = work + 16 * S::score_row;  // dP^T = v dout^T
  uint16_t* sp = reinterpret_cast<uint16_t*>(smem + M::probs) + warp * 16 * S::prob_row;
  uint16_t* sds = reinterpret_cast<uint16_t*>(smem + M::ds) + warp * 16 * S::prob_row;
  float* slse = reinterpret_cast<float*>(smem + M::stats);  // [kTile] of the q tile
  float* sdelta = slse + kTile;

  const int n_tiles = (p.T + kTile - 1) / kTile;
  const int kt = int(blockIdx.x);  // tile 0 has the most query tiles: first
  const int kvh = int(blockIdx.y), b = int(blockIdx.z), G = p.Hq / p.Hkv;
  const int64_t W = int64_t(p.Hq + 2 * p.Hkv) * D, HD = int64_t(p.Hq) * D;
  const int k0 = kt * kTile, krows = p.T - k0 < kTile ? p.T - k0 : kTile;
  const float* base = p.qkv + int64_t(b) * p.T * W;
  load_tile<kHalf, D>(sa, base + int64_t(k0) * W + int64_t(p.Hq + kvh) * D, W, krows);
  load_tile<kHalf, D>(sb, base + int64_t(k0) * W + int64_t(p.Hq + p.Hkv + kvh) * D, W, krows);
  __syncthreads();
  FragA<kHalf> kf[D / 16], vf[D / 16];
  load_rows<kHalf, D>(kf, sa, warp);
  load_rows<kHalf, D>(vf, sb, warp);
  FragC dk[D / 16], dv[D / 16];
  for (int n = 0; n < D / 16; n++) {
    nvcuda::wmma::fill_fragment(dk[n], 0.0f);
    nvcuda::wmma::fill_fragment(dv[n], 0.0f);
  }
  const int kw = k0 + warp * 16;
  for (int g = 0; g < G; g++) {
    const int h = kvh * G + g;
    for (int qt = kt; qt < n_tiles; qt++) {
      const int q0 = qt * kTile, qrows = p.T - q0 < kTile ? p.T - q0 : kTile;
      __syncthreads();  // every warp has its fragments of k and v / is done with the previous q, dout
      load_tile<kHalf, D>(sa, base + int64_t(q0) * W + int64_t(h) * D, W, qrows);
      load_tile<kHalf, D>(sb, p.dout + (int64_t(b) * p.T + q0) * HD + int64_t(h) * D, HD, qrows);
      for (int i = int(threadIdx.x); i < kTile; i += kThreads) {
        const int64_t row = (int64_t(b) * p.Hq + h) * p.T + q0 + i;
        slse[i] = i < qrows ? p.lse[row] : 0.0f;
        sdelta[i] = i < qrows ? p.delta[row] : 0.0f;
      }
      __syncthreads();
      rows_times_tile_t<kHalf, D>(ss, kf, sa);   // s^T = k q^T
      rows_times_tile_t<kHalf, D>(sdp, vf, sb);  // dP^T = v dout^T
      __syncwarp();
      probs_and_ds<kHalf, D>(
          sp, sds, ss, sdp, p.T, p.scale, [&](int, int c) { return q0 + c; },
          [&](int rr, int) { return kw + rr; }, [&](int, int c) { return slse[c]; },
          [&](int, int c) { return sdelta[c]; }, lane);
      __syncwarp();
      probs_times_tile<kHalf, D>(dv, sp, sb);   // dv += P^T dout
      probs_times_tile<kHalf, D>(dk, sds, sa);  // dk += dS^T q
    }
  }
  const int64_t row0 = (int64_t(b) * p.T + kw) * W;
  write_rows<D>(p.dqkv + row0 + int64_t(p.Hq + kvh) * D, W, p.T - kw, dk, work, lane);
  write_rows<D>(p.dqkv + row0 + int64_t(p.Hq + p.Hkv + kvh) * D, W, p.T - kw, dv, work, lane);
}

}  // namespace exatrain::cuda::flash
