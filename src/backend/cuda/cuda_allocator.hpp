// The CUDA backend's caching allocator: device memory from cudaMalloc in size classes, freed blocks
// kept on a free list per class and handed out again (cudaMalloc and cudaFree synchronise the
// device and cost 10s to 100s of microseconds each; a training step frees and allocates its
// activations every step). As PyTorch's CUDACachingAllocator in spirit, much simpler: no block
// splitting, no per-stream pools.
//   size classes: 512-byte multiples below 1 MiB, 2 MiB multiples above (so a class wastes < 2 MiB).
//   out of memory: the cached free blocks are returned to the driver (cudaFree) and cudaMalloc is
//   tried once more before the allocation fails with an error naming the size and the stats.
// Stream safety: a block freed while kernels on the compute stream still use it may be handed to
// the next allocation at once, which is safe because every op runs on the compute stream in
// submission order. A block read by another stream (NCCL's) must be freed only after that stream's
// work on it is ordered before the compute stream's (Backend::wait), as the runtime does.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace exatrain::cuda {

struct AllocatorStats {
  size_t in_use = 0, cached = 0, peak_in_use = 0;  // bytes (size-class rounded)
  int64_t cuda_mallocs = 0, cache_hits = 0, cuda_frees = 0;
};

class CachingAllocator {
 public:
  CachingAllocator() = default;
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  static size_t size_class(size_t bytes);
  void* allocate(size_t bytes);  // not zeroed; never null for bytes > 0 (fails instead)
  void release(void* p);         // null: no-op; a pointer not from allocate(): an error
  size_t size_of(const void* p) const;  // the class size of a live block, 0 when not one
  void empty_cache();                    // cudaFree every cached block
  void abandon();                        // forget every block unfreed (at exit, the runtime unloaded)
  const AllocatorStats& stats() const { return stats_; }
  std::string describe() const;  // the stats in one line, for error messages

 private:
  std::map<size_t, std::vector<void*>> free_;  // class size -> cached blocks
  std::unordered_map<const void*, size_t> live_;
  AllocatorStats stats_;
};

// A block from the cache for the length of one op, given back when it goes out of scope (also when
// an error unwinds the op). Giving it back once the op's work is enqueued is safe: a later use of
// the block runs after that work on the same stream (above). Empty when default-made.
class Scratch {
 public:
  Scratch() = default;
  Scratch(CachingAllocator& a, size_t bytes) : alloc_(&a), p_(a.allocate(bytes)) {}
  Scratch(Scratch&& o) noexcept : alloc_(o.alloc_), p_(o.p_) { o.alloc_ = nullptr, o.p_ = nullptr; }
  Scratch& operator=(Scratch&& o) noexcept {
    std::swap(alloc_, o.alloc_);
    std::swap(p_, o.p_);
    return *this;
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch() {
    if (alloc_ != nullptr) alloc_->release(p_);
  }
  template <class T = void>
  T* get() const { return static_cast<T*>(p_); }

 private:
  CachingAllocator* alloc_ = nullptr;
  void* p_ = nullptr;
};

}  // namespace exatrain::cuda
