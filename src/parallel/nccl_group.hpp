// Group over NCCL (parallel/comm.hpp) for a backend whose device memory a host MPI cannot be given
// (the CUDA backend, backend/cuda/cuda_backend.hpp). Built only with EXATRAIN_CUDA
// (src/parallel/cuda/nccl_group.cpp); ParallelRuntime makes one per mesh axis when the backend is
// "cuda" and keeps the "world" group on MPI (it carries host values only: losses, norms, timings).
//
//   communicator: one ncclComm_t per group, its ncclUniqueId made by the group's rank 0 and
//     broadcast over the group's MPI communicator (MPI_Bcast), then ncclCommInitRank; the device is
//     the backend's (one rank per GPU).
//   streams: each group has its own communication stream. Every collective first makes it wait for
//     the work submitted to the backend's compute stream so far (an event), so it reads finished
//     data; a blocking call then makes the compute stream wait for the collective (an event; the
//     host does not block), a non-blocking one returns a Request holding an event and leaves the
//     compute stream free until wait() (the data-parallel reduction overlaps the backward this
//     way); after(e) makes the communication stream wait for e as well.
//   accounting: the same ledger kinds and ring-convention bytes as MpiGroup (the planner's); the
//     seconds are the host's time in the calls (enqueueing; the GPU time is not measured).
//   host values: DType::f64 calls and gather() (host memory by the Group contract) go to an MPI
//     group over the same communicator.
//   point-to-point: NCCL matches sends and receives by order per peer, not by tag: the tags are
//     ignored (the runtime's pipeline sends to a peer in the order the peer receives).
//   unequal shards: reduce_scatter_v / all_gather_v as one NCCL group of ncclReduce / ncclBroadcast
//     calls, one per rank's shard.
// Not run in this repository's CI or by its author (no GPU): docs/cuda.md lists it as compiled only.
#pragma once
#include <memory>
#include <string>

#include <mpi.h>

#include "parallel/comm.hpp"

namespace exatrain::parallel {

class Watchdog;

// Whether this build has NCCL groups (EXATRAIN_CUDA).
bool nccl_built();
// A group over `comm` on the CUDA backend `be` (collective over comm); an error without NCCL.
std::unique_ptr<Group> make_nccl_group(MPI_Comm comm, std::string name, CommLedger* ledger, Watchdog* watchdog,
                                       Backend& be);

}  // namespace exatrain::parallel
