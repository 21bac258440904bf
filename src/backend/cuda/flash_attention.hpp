// The fused attention of the CUDA backend under mixed precision (FlashAttention-2's algorithm, Dao
// 2023, arXiv:2307.08691): causal, grouped-query, 16-bit operands (bf16 or f16) on the tensor cores
// with float32 accumulation and softmax statistics; the T x T scores and probabilities never leave
// shared memory. Plain C++ (no CUDA types): the parameters and the shared-memory plan, read by the
// host side (cuda_backend.cpp, flash_attention.cu) and the kernels (flash_attention_kernels.cuh).
//
// What the forward keeps for the backward (Backend::attention_saved_floats, `saved`):
//   lse  [B, Hq, T] floats: per query row, log2 of sum_k 2^(s_k), s_k = q.k / sqrt(D) * log2(e)
//   o16  [B, T, Hq*D] 16-bit (packed two to a float): the output, for the backward's
//        delta = rowsum(dout * out), as FlashAttention-2's backward reads its (16-bit) output.
// Backward: three kernels' work in two launches: the dq kernel (one block per query tile: dq and,
// first, delta of its rows) and the dk/dv kernel (one block per key tile and kv head: the group's
// query heads in order), each recomputing the probabilities from lse. No atomics: dq, dk and dv are
// each written once by one block (deterministic, backend.hpp), at the price of computing the
// scores and dP twice (7 tile products instead of FlashAttention-2's 5).
#pragma once
#include <cstddef>
#include <cstdint>

namespace exatrain::cuda::flash {

constexpr int kTile = 64;               // query rows and key rows per tile (Br = Bc)
constexpr int kWarps = 4;               // each warp owns 16 rows of the block's tile
constexpr int kThreads = 32 * kWarps;
constexpr int kWarpRows = kTile / kWarps;
static_assert(kWarpRows == 16, "a warp's rows are one wmma tile high");

// Head sizes with compiled kernels; others run the unfused path (cuda_backend.cpp).
constexpr bool supported_head_dim(int64_t D) { return D == 32 || D == 64 || D == 128; }

struct Params {
  const float* qkv = nullptr;   // [B, T, W], W = (Hq + 2 Hkv) D: Hq query, Hkv key, Hkv value heads
  float* out = nullptr;         // [B, T, Hq D]; nullptr: only lse and o16 (selective recomputation)
  float* lse = nullptr;         // [B, Hq, T]
  uint16_t* o16 = nullptr;      // [B, T, Hq D]
  const float* dout = nullptr;  // [B, T, Hq D]
  float* delta = nullptr;       // [B, Hq, T] scratch of the backward: rowsum(dout * out)
  float* dqkv = nullptr;        // [B, T, W], overwritten
  int B = 0, T = 0, Hq = 0, Hkv = 0;
  float scale = 0;  // 1 / sqrt(D)
};

// Floats of `saved` for [B, T] with Hq heads of D: lse, then o16 packed (rounded up to 32 floats so
// that o16 starts 128-byte aligned when lse does).
inline int64_t saved_floats(int64_t B, int64_t T, int64_t Hq, int64_t D) {
  const int64_t lse = (B * Hq * T + 31) / 32 * 32;
  return lse + (B * T * Hq * D + 1) / 2;
}
inline float* saved_lse(float* saved) { return saved; }
inline uint16_t* saved_o16(float* saved, int64_t B, int64_t T, int64_t Hq) {
  return reinterpret_cast<uint16_t*>(saved + (B * Hq * T + 31) / 32 * 32);
}

// ---- shared memory, in bytes; every region starts 128-byte aligned ------------------------------
// Row strides (elements) of the tiles in shared memory: a multiple of 8 (16-bit) or 4 (float), as
// wmma's loads require, and not a multiple of 32 banks, so that a warp's rows fall on different banks.
template <int D>
struct Strides {
  static constexpr int half_row = D + 8;       // q, k, v, dout tiles: [kTile][half_row] 16-bit
  static constexpr int score_row = kTile + 4;  // scores, dP: [16][score_row] float per warp
  static constexpr int prob_row = kTile + 8;   // probabilities, dS: [16][prob_row] 16-bit per warp
  static constexpr int out_row = D + 4;        // output accumulators: [16][out_row] float per warp
  // A warp's float work area: scores and dP, or (at the end) its 16 output rows.
  static constexpr int work_floats = (2 * kWarpRows * score_row > kWarpRows * out_row)
                                         ? 2 * kWarpRows * score_row
                                         : kWarpRows * out_row;
};

constexpr size_t align128(size_t n) { return (n + 127) / 128 * 128; }

// The sizes (bytes, 128-aligned) of the regions the kernels' plans below are made of.
template <int D>
struct Regions {
  using S = Strides<D>;
  static constexpr size_t tile = align128(sizeof(uint16_t) * kTile * S::half_row);         // a 16-bit tile
  static constexpr size_t scores = align128(sizeof(float) * kWarps * kWarpRows * S::score_row);  // all warps'
  static constexpr size_t probs = align128(sizeof(uint16_t) * kWarps * kWarpRows * S::prob_row);  // all warps'
  static constexpr size_t outs = align128(sizeof(float) * kWarps * kWarpRows * S::out_row);      // all warps'
  static constexpr size_t work = align128(sizeof(float) * kWarps * S::work_floats);              // all warps'
  static constexpr size_t warp_stats = align128(sizeof(float) * kWarps * 64);  // 64 floats a warp
};

// The regions of one kernel's shared memory: offsets in bytes from its base, and the total.
template <int D>
struct ForwardSmem {
  using R = Regions<D>;
  static constexpr size_t q = 0, k = q + R::tile, v = k + R::tile;
  static constexpr size_t scores = v + R::tile;  // [kWarps][16][score_row] float
  static constexpr size_t probs = scores + R::scores;
  static constexpr size_t acc = probs + R::probs;
  static constexpr size_t stats = acc + R::outs;
  static constexpr size_t bytes = stats + R::warp_stats;  // m, l, partials
};

template <int D>
struct DqSmem {  // q and dout tiles, reused for k and v once their fragments are loaded
  using R = Regions<D>;
  static constexpr size_t a = 0, b = a + R::tile;
  static constexpr size_t work = b + R::tile;  // [kWarps][work_floats] float
  static constexpr size_t ds = work + R::work;
  static constexpr size_t stats = ds + R::probs;
  static constexpr size_t bytes = stats + R::warp_stats;  // lse, delta, partials
};

template <int D>
struct DkvSmem {  // k and v tiles, reused for q and dout once their fragments are loaded
  using R = Regions<D>;
  static constexpr size_t a = 0, b = a + R::tile;
  static constexpr size_t work = b + R::tile;
  static constexpr size_t probs = work + R::work;
  static constexpr size_t ds = probs + R::probs;
  static constexpr size_t stats = ds + R::probs;
  static constexpr size_t bytes = stats + align128(sizeof(float) * 2 * kTile);  // lse, delta of the q tile
};

// The most shared memory any of the three kernels for head size D takes (0: no kernels for D). A
// device whose block can opt in to less (sm_86/89: 99 KiB, below D = 128's forward) runs the
// unfused path instead (CudaBackend::fused_attention).
template <int D>
constexpr size_t shared_bytes_of() {
  size_t b = ForwardSmem<D>::bytes;
  b = DqSmem<D>::bytes > b ? DqSmem<D>::bytes : b;
  return DkvSmem<D>::bytes > b ? DkvSmem<D>::bytes : b;
}
constexpr size_t shared_bytes(int64_t D) {
  return D == 32 ? shared_bytes_of<32>() : D == 64 ? shared_bytes_of<64>() : D == 128 ? shared_bytes_of<128>() : 0;
}

}  // namespace exatrain::cuda::flash
