// The CUDA backend (docs/cuda.md): the Backend interface on one NVIDIA GPU. Built only with
// EXATRAIN_CUDA=ON (CMakeLists.txt, exatrain_cuda_part); this header needs no CUDA header, so
// rooms above (parallel/cuda's NcclGroup) include it with their host compiler.
//   GEMMs: cuBLASLt, float32 compute (CUBLAS_COMPUTE_32F: TF32 off by default, for equivalence
//     with the CPU backend; EXATRAIN_CUDA_TF32=1 turns it on), gemm_half with bf16/f16 inputs and
//     float32 accumulation and output.
//   kernels: cuda_kernels.cu (norms, activations, rope, attention saving its probabilities
//     [B,Hq,T,T] for the backward, embeddings, cross-entropy, elementwise optimizers, reductions).
//   host fallbacks: the LAPACK-based ops (sym_inverse_root, sym_eigenbasis, power_qr_refresh,
//     sym_eigh), LAMB, Adafactor and the gradient-compression ops (topk_abs ... count_below) copy
//     their operands to the host, run the CPU backend's code and copy the results back (correct,
//     synchronous, slow: they are not on GPT-2 + AdamW's path).
//   memory: a caching allocator over cudaMalloc (cuda_allocator.hpp); host staging is pinned
//     (cudaMallocHost); release() zeroes / fills instead of returning pages (no partial unmapping
//     of a cached block).
//   streams/events: cudaStream_t (non-blocking) / cudaEvent_t (timing off); every op runs on the
//     compute stream; download() and the host fallbacks synchronise it.
// Device pointers cannot be handed to a host MPI library: host_accessible() is false, so the
// runtime uses the NCCL group (parallel/cuda/nccl_group.hpp) with this backend.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "backend/backend.hpp"

namespace exatrain {

// The device this process uses: `device` >= 0 as given, else the node-local rank (Open MPI's
// OMPI_COMM_WORLD_LOCAL_RANK, Slurm's SLURM_LOCALID, MPICH's MPI_LOCALRANKID; 0 without one)
// modulo the visible devices: one rank per GPU under mpirun or srun. Fails, naming the reason,
// when no device is visible.
std::unique_ptr<Backend> make_cuda_backend(int device = -1);

// The cudaStream_t / cudaEvent_t (as void*) behind a Stream / Event of a CUDA backend; an error for
// any other backend's.
void* cuda_stream_handle(Stream& s);
void* cuda_event_handle(const Event& e);
// The CUDA device of a CUDA backend; -1 for another backend.
int cuda_device_of(const Backend& be);
// The caching allocator's stats in one line ("" for another backend).
std::string cuda_memory_stats(const Backend& be);
// Loads cuBLASLt (dlopen, every function the backend calls; done by the first make_cuda_backend):
// needs no GPU, so a machine without one can check the toolkit's library. An error naming the
// library and the missing symbol when it fails.
void cuda_load_libraries();
// gemm_half calls so far on a CUDA backend (-1 for another backend).
int64_t cuda_half_gemm_count(const Backend& be);
// The per-op GPU time of a CUDA backend made with EXATRAIN_CUDA_PROFILE=1 (cuda_backend_impl.hpp
// Profile): reset starts a new count (after the work enqueued so far); report is a table, one line
// per op, largest first ("" for another backend).
void cuda_profile_reset(Backend& be);
std::string cuda_profile_report(Backend& be);

}  // namespace exatrain
