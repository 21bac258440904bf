// A pipeline table (parallel/schedule.hpp) run as the GPU runtime runs it: NCCL's point-to-point
// semantics on CUDA streams, simulated without a GPU, to tell the postings that deadlock from the
// ones that do not (the lent GPU machines have one GPU: no multi-GPU pipeline has run here).
//
// Owns: the simulation only (pure; no MPI, no CUDA). May use: schedule.hpp's tables and
// posting_batches.
//
// What is modelled (NcclGroup, parallel/cuda/nccl_group.cpp; the NCCL user guide, "Point-to-point
// communication" and "Group calls"):
//   - the host posts a rank's actions in table order and never blocks (NcclGroup's wait() makes the
//     compute stream wait for an event; the host goes on);
//   - forwards and backwards run in order on the rank's compute stream, each after the item holding
//     its receive has completed;
//   - sends and receives run on the group's one communication stream in the order they were posted,
//     one item at a time; an item is one ncclSend/ncclRecv (per_call) or a batch of them fused by
//     ncclGroupStart/ncclGroupEnd (batched: posting_batches), and starts after the compute work
//     posted before it (NcclGroup's after_compute);
//   - a send and its receive complete together, once the items holding both run: "point-to-point
//     calls within a group will be blocking until that group of calls completes, but calls within a
//     group can be seen as progressing independently" — except calls of a group to the same peer in
//     the same direction, which run in order; an item ends when all its calls have;
//   - NCCL pairs a peer's sends and receives by order, not by tag: for every pair of ranks the
//     messages must be received in the order they are sent.
// Separate streams or communicators for sends and receives would not do: NCCL does not promise
// that two operations progress concurrently (its maintainers: "make sure things will still work
// even if one blocks the other"); only the calls of one group do.
#pragma once
#include <string>

#include "parallel/schedule.hpp"

namespace exatrain::parallel {

enum class P2pPosting {
  per_call,  // each send and receive its own NCCL call (the executor's isend/irecv before batches)
  batched,   // each of posting_batches' runs as one NCCL group (Group::post_p2p on NcclGroup)
};
const char* to_string(P2pPosting);

// "" when every rank runs its row to the end; else the problem: messages received in another
// order than sent, or the deadlock, naming where each stuck rank's streams wait, e.g. "deadlock:
// rank 0 communication stream waits at RecvGrad(mb 0, chunk 0) from rank 1, compute stream waits
// at Backward(mb 0, chunk 0); rank 1 ...".
std::string stream_problem(const PipelineTable& table, P2pPosting posting);

// The same with per-unit compute times and free transfers: where it runs, its makespan and bubble
// fraction (idle over busy, as simulate_pipeline's), to see what a posting costs.
struct StreamRun {
  std::string problem;  // as stream_problem; the times are 0 when it is not ""
  double makespan = 0, bubble_fraction = 0;
};
StreamRun simulate_streams(const PipelineTable& table, P2pPosting posting, double t_fwd, double t_bwd);

}  // namespace exatrain::parallel
