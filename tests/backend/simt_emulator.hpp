// A host emulation of the small CUDA dialect the fused attention kernels are written in
// (src/backend/cuda/flash_attention_kernels.cuh), so that their logic is tested on every machine,
// GPU or not (flash_attention_emulated_test.cpp). Every CUDA thread of a block is a std::thread;
// blocks run one after the other, each with its own dynamic shared memory, filled with 0xff bytes
// (NaN as float and as bf16/f16) so that reading what no thread wrote shows up as NaN.
//
// What it provides: __global__ / __device__ / __launch_bounds__, threadIdx / blockIdx / blockDim /
// gridDim (.x/.y/.z), __syncthreads, __syncwarp, EXA_DYNAMIC_SHARED, the 16-bit element types
// __nv_bfloat16 and __half (storage only), and nvcuda::wmma's fragment / fill_fragment /
// load_matrix_sync / store_matrix_sync / mma_sync for 16x16x16 tiles (16-bit inputs, float
// accumulator). A fragment here holds its whole 16x16 tile in every lane: the kernels never rely on
// which lane holds which element (that layout is unspecified in CUDA), only on the tile's values.
//
// What it checks (CUDA's documented preconditions): a wmma pointer 256-bit (32-byte) aligned, ldm a
// multiple of 8 elements for 16-bit types and of 4 for float; every lane of a warp reaching the same
// warp-wide operation (each wmma operation and __syncwarp is a barrier of the warp's lanes that
// also compares which operation each lane called: lanes meeting at different ones abort; two
// __syncwarp at different lines look alike; a lane that skips one leaves the others waiting,
// reported after 60 s, then abort); every thread of the block reaching each
// __syncthreads; nothing written past the block's dynamic shared memory (a guard after it).
// Races: stores are written by lane 0 only, after the warp's barrier, and loads read without a
// barrier before them, so a kernel that reads another lane's shared-memory writes without
// __syncwarp / __syncthreads in between races here as on a GPU; it shows only when the threads
// happen to interleave badly (likely with 32-128 threads on two cores, not certain), and a
// write-after-read hazard before a wmma store cannot show. compute-sanitizer's racecheck on a GPU
// is the deterministic check (bench/gpu/run.sh).
// Not emulated: warp shuffles, atomics, the memory model beyond barriers, timing, launch limits.
#pragma once
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <thread>
#include <type_traits>
#include <vector>

#include "backend/half_convert.hpp"

namespace simt {

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
};

// A reusable barrier for n threads; a thread that waits over 60 s reports `what` and aborts (a
// deadlock: some thread of the group never reached the same barrier).
class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  // `what` names the call site (a string literal); all threads of one episode must name the same.
  void wait(const char* what) {
    std::unique_lock<std::mutex> lock(m_);
    const uint64_t gen = gen_;
    if (waiting_ == 0) site_ = what;
    if (std::strcmp(site_, what) != 0) {
      std::fprintf(stderr, "simt emulator: threads of one group met at different calls: %s and %s\n", site_, what);
      std::abort();
    }
    if (++waiting_ == n_) {
      waiting_ = 0;
      gen_++;
      cv_.notify_all();
      return;
    }
    if (!cv_.wait_for(lock, std::chrono::seconds(60), [&] { return gen_ != gen; })) {
      std::fprintf(stderr, "simt emulator: deadlock at %s (%d of %d threads arrived)\n", what, waiting_, n_);
      std::abort();
    }
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  int n_, waiting_ = 0;
  uint64_t gen_ = 0;
  const char* site_ = "";
};

struct Block {
  dim3 idx, dim, grid;
  std::unique_ptr<Barrier> block_barrier;
  std::vector<std::unique_ptr<Barrier>> warp_barriers;
  unsigned char* shared = nullptr;
};

struct ThreadState {
  dim3 tid;
  Block* block = nullptr;
};
inline thread_local ThreadState tls;

inline unsigned lane() { return tls.tid.x % 32; }
inline void warp_wait(const char* what) { tls.block->warp_barriers[tls.tid.x / 32]->wait(what); }

// kernel<<<grid, block, shared_bytes>>>(args...) with one-dimensional blocks, run to completion.
template <class Kernel, class... Args>
void launch(dim3 grid, unsigned threads, size_t shared_bytes, Kernel kernel, Args... args) {
  for (unsigned z = 0; z < grid.z; z++)
    for (unsigned y = 0; y < grid.y; y++)
      for (unsigned x = 0; x < grid.x; x++) {
        Block blk;
        blk.idx = {x, y, z};
        blk.dim = {threads, 1, 1};
        blk.grid = grid;
        blk.block_barrier = std::make_unique<Barrier>(int(threads));
        for (unsigned w = 0; w < (threads + 31) / 32; w++)
          blk.warp_barriers.push_back(std::make_unique<Barrier>(int(std::min(32u, threads - 32 * w))));
        constexpr size_t kGuard = 256;  // after the block's bytes: must stay 0xa5
        std::unique_ptr<unsigned char[]> shared(new (std::align_val_t(128)) unsigned char[shared_bytes + kGuard]);
        std::memset(shared.get(), 0xff, shared_bytes);
        std::memset(shared.get() + shared_bytes, 0xa5, kGuard);
        blk.shared = shared.get();
        std::vector<std::thread> pool;
        for (unsigned t = 0; t < threads; t++)
          pool.emplace_back([&blk, t, kernel, args...] {
            tls.tid = {t, 0, 0};
            tls.block = &blk;
            kernel(args...);
          });
        for (auto& th : pool) th.join();
        for (size_t i = 0; i < kGuard; i++)
          if (shared[shared_bytes + i] != 0xa5) {
            std::fprintf(stderr, "simt emulator: block (%u, %u, %u) wrote byte %zu past its %zu of shared memory\n", x,
                         y, z, i, shared_bytes);
            std::abort();
          }
        ::operator delete[](shared.release(), std::align_val_t(128));
      }
}

}  // namespace simt

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(n)
#define threadIdx (::simt::tls.tid)
#define blockIdx (::simt::tls.block->idx)
#define blockDim (::simt::tls.block->dim)
#define gridDim (::simt::tls.block->grid)
#define EXA_DYNAMIC_SHARED(type, name) type* name = reinterpret_cast<type*>(::simt::tls.block->shared)

inline void __syncthreads() { ::simt::tls.block->block_barrier->wait("__syncthreads"); }
inline void __syncwarp(unsigned = 0xffffffffu) { ::simt::warp_wait("__syncwarp"); }

// The 16-bit element types, storage only (the kernels convert with backend/half_convert.hpp).
struct __nv_bfloat16 {
  uint16_t bits;
};
struct __half {
  uint16_t bits;
};

namespace nvcuda::wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

inline float widen(__nv_bfloat16 h) { return exatrain::half_convert::bf16_to_f32(h.bits); }
inline float widen(__half h) { return exatrain::half_convert::f16_to_f32(h.bits); }
inline float widen(float f) { return f; }

// x[r * 16 + c]: row r, column c of the tile (m x k for matrix_a, k x n for matrix_b, m x n for the
// accumulator), in every lane.
template <class Use, int M, int N, int K, class T, class Layout = void>
struct fragment {
  static_assert(M == 16 && N == 16 && K == 16, "the emulator has 16x16x16 tiles only");
  static constexpr int num_elements = 256;
  float x[256];
};

template <class T>
void check_pointer(const T* p, unsigned ldm, const char* what) {
  const unsigned multiple = sizeof(T) == 2 ? 8 : 4;
  if (reinterpret_cast<uintptr_t>(p) % 32 != 0 || ldm % multiple != 0) {
    std::fprintf(stderr, "simt emulator: %s: pointer %p must be 32-byte aligned and ldm %u a multiple of %u\n",
                 what, static_cast<const void*>(p), ldm, multiple);
    std::abort();
  }
}

template <class Use, class T, class Layout>
void load_matrix_sync(fragment<Use, 16, 16, 16, T, Layout>& f, const T* p, unsigned ldm) {
  check_pointer(p, ldm, "load_matrix_sync");
  constexpr bool col = std::is_same_v<Layout, col_major>;
  for (int r = 0; r < 16; r++)
    for (int c = 0; c < 16; c++) f.x[r * 16 + c] = widen(col ? p[c * ldm + r] : p[r * ldm + c]);
  simt::warp_wait("wmma::load_matrix_sync");
}

inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float>& f, const float* p, unsigned ldm,
                             layout_t layout) {
  check_pointer(p, ldm, "load_matrix_sync (accumulator)");
  for (int r = 0; r < 16; r++)
    for (int c = 0; c < 16; c++) f.x[r * 16 + c] = layout == mem_col_major ? p[c * ldm + r] : p[r * ldm + c];
  simt::warp_wait("wmma::load_matrix_sync");
}

inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, float>& f, unsigned ldm,
                              layout_t layout) {
  check_pointer(p, ldm, "store_matrix_sync");
  simt::warp_wait("wmma::store_matrix_sync");
  if (simt::lane() != 0) return;
  for (int r = 0; r < 16; r++)
    for (int c = 0; c < 16; c++) (layout == mem_col_major ? p[c * ldm + r] : p[r * ldm + c]) = f.x[r * 16 + c];
}

template <class Use, class T, class Layout>
void fill_fragment(fragment<Use, 16, 16, 16, T, Layout>& f, float v) {
  for (float& e : f.x) e = v;
}

// d = a b + c, accumulated in float (the tensor cores' order of the products differs; the tests'
// tolerances cover it).
template <class T, class LA, class LB>
void mma_sync(fragment<accumulator, 16, 16, 16, float>& d, const fragment<matrix_a, 16, 16, 16, T, LA>& a,
              const fragment<matrix_b, 16, 16, 16, T, LB>& b, const fragment<accumulator, 16, 16, 16, float>& c) {
  float out[256];
  for (int m = 0; m < 16; m++)
    for (int n = 0; n < 16; n++) {
      float s = c.x[m * 16 + n];
      for (int k = 0; k < 16; k++) s += a.x[m * 16 + k] * b.x[k * 16 + n];
      out[m * 16 + n] = s;
    }
  std::memcpy(d.x, out, sizeof out);
  simt::warp_wait("wmma::mma_sync");
}

}  // namespace nvcuda::wmma
