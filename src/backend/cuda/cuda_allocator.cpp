#include "backend/cuda/cuda_allocator.hpp"

#include <cuda_runtime.h>
#include <fmt/format.h>

#include "core/check.hpp"

namespace exatrain::cuda {

CachingAllocator::~CachingAllocator() {
  empty_cache();
  for (auto& [p, bytes] : live_) cudaFree(const_cast<void*>(p));  // leaked by the caller: returned anyway
}

void CachingAllocator::abandon() {
  free_.clear();
  live_.clear();
}

size_t CachingAllocator::size_class(size_t bytes) {
  constexpr size_t kSmall = 512, kLarge = size_t(2) << 20, kSmallLimit = size_t(1) << 20;
  if (bytes == 0) bytes = 1;
  if (bytes < kSmallLimit) return (bytes + kSmall - 1) / kSmall * kSmall;
  return (bytes + kLarge - 1) / kLarge * kLarge;
}

void* CachingAllocator::allocate(size_t bytes) {
  const size_t cls = size_class(bytes);
  void* p = nullptr;
  auto it = free_.find(cls);
  if (it != free_.end() && !it->second.empty()) {
    p = it->second.back();
    it->second.pop_back();
    stats_.cached -= cls;
    stats_.cache_hits++;
  } else {
    cudaError_t err = cudaMalloc(&p, cls);
    if (err == cudaErrorMemoryAllocation) {  // give the cache back to the driver and try once more
      (void)cudaGetLastError();
      empty_cache();
      err = cudaMalloc(&p, cls);
      if (err == cudaErrorMemoryAllocation) (void)cudaGetLastError();  // else the next op's launch check reports it
    }
    EXA_CHECK(err == cudaSuccess, "cuda backend: cudaMalloc of {} bytes (class {}) failed: {} ({})", bytes, cls,
              cudaGetErrorString(err), describe());
    stats_.cuda_mallocs++;
  }
  live_[p] = cls;
  stats_.in_use += cls;
  stats_.peak_in_use = std::max(stats_.peak_in_use, stats_.in_use);
  return p;
}

void CachingAllocator::release(void* p) {
  if (p == nullptr) return;
  auto it = live_.find(p);
  EXA_CHECK(it != live_.end(), "cuda backend: free of {} which is not a live allocation of this backend", p);
  const size_t cls = it->second;
  live_.erase(it);
  free_[cls].push_back(p);
  stats_.in_use -= cls;
  stats_.cached += cls;
}

size_t CachingAllocator::size_of(const void* p) const {
  auto it = live_.find(p);
  return it == live_.end() ? 0 : it->second;
}

void CachingAllocator::empty_cache() {
  for (auto& [cls, blocks] : free_) {
    for (void* p : blocks) {
      cudaFree(p);
      stats_.cuda_frees++;
      stats_.cached -= cls;
    }
    blocks.clear();
  }
}

std::string CachingAllocator::describe() const {
  return fmt::format("{} bytes in use, {} cached, peak {}, {} cudaMalloc calls, {} cache hits", stats_.in_use,
                     stats_.cached, stats_.peak_in_use, stats_.cuda_mallocs, stats_.cache_hits);
}

}  // namespace exatrain::cuda
