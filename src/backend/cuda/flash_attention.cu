// Launchers of the fused attention kernels (flash_attention_kernels.cuh, written in the dialect
// defined here for nvcc; the tests run the same source in a host emulator). One instantiation per
// 16-bit format and head size of flash::supported_head_dim; each kernel's dynamic shared memory
// (flash_attention.hpp's plans: above the 48 KiB default at every D) is allowed at each launch.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>

#define EXA_DYNAMIC_SHARED(type, name)                     \
  extern __shared__ __align__(128) unsigned char exa_smem_[]; \
  type* name = reinterpret_cast<type*>(exa_smem_)

#include "backend/cuda/cuda_kernels.cuh"
#include "backend/cuda/flash_attention_kernels.cuh"

namespace exatrain::cuda {
namespace {

// kernel<<<grid, kThreads, bytes, s>>>(p), after raising the kernel's shared-memory limit to `bytes`
// (every call: a host-side attribute of that kernel, cheap; once per kernel would need one flag per
// kernel, and all 18 have the same type). Returns the attribute's error, or the launch's.
cudaError_t launch(void (*kernel)(flash::Params), dim3 grid, size_t bytes, cudaStream_t s, const flash::Params& p) {
  const cudaError_t allowed = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
  if (allowed != cudaSuccess) return allowed;
  kernel<<<grid, flash::kThreads, bytes, s>>>(p);
  return cudaGetLastError();
}

template <int kHalf, int D>
cudaError_t forward(cudaStream_t s, const flash::Params& p) {
  const dim3 grid((p.T + flash::kTile - 1) / flash::kTile, p.Hq, p.B);
  return launch(flash::forward_kernel<kHalf, D>, grid, flash::ForwardSmem<D>::bytes, s, p);
}

template <int kHalf, int D>
cudaError_t backward(cudaStream_t s, const flash::Params& p) {
  const unsigned tiles = (p.T + flash::kTile - 1) / flash::kTile;
  const cudaError_t dq = launch(flash::dq_kernel<kHalf, D>, dim3(tiles, p.Hq, p.B), flash::DqSmem<D>::bytes, s, p);
  if (dq != cudaSuccess) return dq;  // the dk/dv kernel reads the delta the dq kernel writes
  return launch(flash::dkv_kernel<kHalf, D>, dim3(tiles, p.Hkv, p.B), flash::DkvSmem<D>::bytes, s, p);
}

template <int kHalf>
cudaError_t run(cudaStream_t s, int64_t D, bool is_backward, const flash::Params& p) {
  switch (D) {
    case 32: return is_backward ? backward<kHalf, 32>(s, p) : forward<kHalf, 32>(s, p);
    case 64: return is_backward ? backward<kHalf, 64>(s, p) : forward<kHalf, 64>(s, p);
    case 128: return is_backward ? backward<kHalf, 128>(s, p) : forward<kHalf, 128>(s, p);
    default: return cudaErrorInvalidValue;  // the caller checks flash::supported_head_dim
  }
}

}  // namespace

cudaError_t flash_forward(cudaStream_t s, int half, int64_t D, const flash::Params& p) {
  if (int64_t(p.B) * p.T * p.Hq <= 0) return cudaSuccess;
  return half == 0 ? run<0>(s, D, false, p) : run<1>(s, D, false, p);
}

cudaError_t flash_backward(cudaStream_t s, int half, int64_t D, const flash::Params& p) {
  if (int64_t(p.B) * p.T * p.Hq <= 0) return cudaSuccess;
  return half == 0 ? run<0>(s, D, true, p) : run<1>(s, D, true, p);
}

}  // namespace exatrain::cuda
