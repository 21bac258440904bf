// Communication: exact bytes each rank sends per step per collective kind (the contract the
// parallel runtime asserts against), and the alpha-beta time of each collective per level of the
// machine (inside a node, across nodes).
//
// BYTES CONVENTION (ring algorithms; what `bytes_sent_per_step` returns):
//  * A collective over p ranks works on a buffer of E elements split into p chunks, chunk c
//    holding floor(E/p) + (c < E % p ? 1 : 0) elements; a rank's index in its group is its
//    tp/cp/dp/pp coordinate (dp groups: index = dp_rank * cp + cp_rank, see below).
//  * ring reduce-scatter: at step j = 0..p-2 rank r sends chunk (r - j - 1) mod p and ends owning
//    chunk r, so it sends every chunk except chunk r:          E - chunk(r) elements.
//  * ring all-gather: at step j rank r sends chunk (r - j) mod p, i.e. every chunk except
//    chunk (r + 1) mod p:                                       E - chunk((r+1) mod p).
//  * ring all-reduce = reduce-scatter + all-gather:  2E - chunk(r) - chunk((r+1) mod p)
//    (= 2 (p-1)/p E when p divides E). p = 1 sends nothing.
//  * point-to-point sends count the whole message.
//  * bytes = elements x element size: 4 for fp32 runs, 2 for fp16/bf16/fp8 (Megatron's 16-bit
//    traffic, and this runtime's under mixed precision, docs/precision.md), except: the tp regions'
//    messages with [train] tp_comm_dtype = "fp32" and the pipeline's with pipeline_dtype = "fp32"
//    (Plan::tp_element_bytes, pipeline_element_bytes) are 4; the cross entropy's statistics and
//    sequence parallelism's weight-gradient all-reduce are fp32 at every precision (4; 2 with
//    Plan::grads_16bit for the latter); the dp gradient reductions follow the gradients' reduce dtype, not the
//    precision: 4 (fp32 gradients, at every precision), 2 with [train] grad_reduce_dtype = "bf16"
//    (Plan::grad_reduce_bf16) or a framework's 16-bit gradients (Plan::grads_16bit).
// WHAT IS COUNTED per step (m = micro-batches, t = micro_batch * seq_len / cp tokens, h hidden,
// L_r = layers on the rank's pipeline stage; recompute = full adds its forward's collectives again,
// with Plan::recompute_early_stop all but each layer's last, the MLP's reduce-scatter / all-reduce;
// recompute = op, planned only, adds the 2 sequence-parallel all-gathers its recompute re-runs, or
// without sequence parallelism the attention's all-reduce):
//  * tp (tp > 1), per layer per micro-batch, buffers of E = t*h elements:
//      no sequence parallelism: 2 all-reduces forward + 2 backward;
//      sequence parallelism:   2 all-gathers + 2 reduce-scatters forward, the same backward;
//    per micro-batch on the first stage the vocabulary-parallel embedding's forward all-reduce
//    (reduce-scatter with sp, plus the all-gather of its gradient backward) of t*h; on the last stage the LM head input gradient's all-reduce
//    (reduce-scatter with sp, plus an all-gather forward) of t*h and the vocabulary-parallel
//    cross entropy's 3 fp32 all-reduces of t elements (max, sum of exp, target logit);
//    with sequence parallelism, once per step, an all-reduce of the gradients that are partial
//    sums over tp (norm weights/biases and, with model.bias, the o_proj/fc2 biases of the rank's layers, ln_f on
//    the last stage; the runtime does one per parameter: equal when tp divides hidden).
//  * cp (cp > 1), per layer per micro-batch, ring attention: forward cp-1 point-to-point sends of
//    the local K and V (2*t*kv_dim/tp elements each); backward cp-1 sends of K,V and cp-1 of
//    dK,dV.
//  * pp (pp > 1), per micro-batch per virtual stage boundary: one send of t*h elements (t*h/tp
//    with sequence parallelism, as Megatron's scatter-gather of the boundary tensor) forward
//    and one backward; rank r sends m*(vp - [r == pp-1]) forward and m*(vp - [r == 0]) backward.
//    Tied embeddings: once per step the first and the last pp rank send each other their copy of
//    the embedding's gradient (this tp rank's vocab_slice rows * h elements) to sum them
//    (Megatron's embedding-group all-reduce, a point-to-point exchange of two ranks).
//  * dp (dp*cp > 1), over the dp*cp ranks holding the same weights, on one flat buffer of the
//    rank's N = parameters_on_rank(pp_rank, tp_rank) elements (no bucketing; with an odd vocab
//    the tp ranks' N differ by their vocabulary rows):
//      zero 0: one all-reduce of N per step;  zero 1/2: one reduce-scatter of the gradients and
//      one all-gather of the updated weights per step;  zero 3: per micro-batch an all-gather
//      forward, an all-gather backward and a reduce-scatter of the gradients; on a single stage
//      with tied embeddings (pp 1) also the LM head's all-gathers of the embedding unit (its
//      vocab_slice rows * h, plus seq_len * h learned positions), forward and backward.
//    Not counted: the grad-norm all-reduce (one scalar), loss logging.
#pragma once
#include <array>
#include <cstdint>
#include <string>

#include "catalog/device.hpp"
#include "job/job.hpp"
#include "plan/plan.hpp"

namespace exatrain::plan {

enum class CommKind {
  tp_all_reduce, tp_reduce_scatter, tp_all_gather, cp_send, pp_send,
  dp_all_reduce, dp_reduce_scatter, dp_all_gather
};
constexpr int kCommKinds = 8;
const char* to_string(CommKind k);

struct RankPosition { int64_t tp_rank = 0, cp_rank = 0, dp_rank = 0, pp_rank = 0; };
RankPosition rank_position(const Plan& p, int64_t global_rank);  // Megatron order, see plan.hpp

struct CommBytes {
  std::array<int64_t, kCommKinds> bytes{};
  int64_t& operator[](CommKind k) { return bytes[size_t(k)]; }
  int64_t operator[](CommKind k) const { return bytes[size_t(k)]; }
};

// Chunk sizes and ring sends in ELEMENTS (see the convention above).
int64_t ring_chunk(int64_t elements, int64_t p, int64_t c);
int64_t ring_reduce_scatter_sent(int64_t elements, int64_t p, int64_t r);
int64_t ring_all_gather_sent(int64_t elements, int64_t p, int64_t r);
int64_t ring_all_reduce_sent(int64_t elements, int64_t p, int64_t r);

// Exact bytes the rank at `pos` sends in one optimizer step, per collective kind.
CommBytes bytes_sent_per_step(const ModelSpec& m, const Plan& p, const RankPosition& pos);

// ---- time (alpha-beta) ----

// ring: NCCL/RCCL's ring, (p-1) steps each paying alpha. hierarchical: an intra-node ring, then an
// inter-node ring among nodes on 1/per_node of the data. tree: NCCL's double binary tree for
// all-reduce (Sanders et al. 2009; NCCL 2.4): a reduce up and a broadcast down, each pipelined
// over the whole buffer, latency 2*log2(nodes)*alpha_inter + 2*(per_node-1)*alpha_intra (the
// chain inside each node), bandwidth term 2*bytes/bw like a ring's at large p. NCCL offers the tree
// for all-reduce only; all-gather and reduce-scatter are ring-only (asking for tree throws).
enum class Algorithm { ring, hierarchical, tree };

// A process group as the machine sees it: `size` ranks, `per_node` of them in each node.
struct Group { int64_t size = 1, per_node = 1; };
// The group of `size` ranks whose members are `stride` apart in the rank order.
Group group_on_machine(int64_t size, int64_t stride, int64_t gpus_per_node);

// Seconds for a collective on a buffer of `bytes` (the full buffer E * element size). Every
// device of a node is assumed busy with a group of its own at the same time (they all run the
// same phase), so a node's NICs are shared by its gpus_per_node devices. `bus_efficiency`
// (docs/planner.md) is the fraction of link bandwidth collectives reach.
double all_reduce_time(double bytes, const Group& g, const MachineSpec& mach, Algorithm a);
double reduce_scatter_time(double bytes, const Group& g, const MachineSpec& mach, Algorithm a);
double all_gather_time(double bytes, const Group& g, const MachineSpec& mach, Algorithm a);
// The fastest algorithm NCCL/RCCL's tuner can pick: ring, hierarchical or (all-reduce only) tree.
double best_all_reduce_time(double bytes, const Group& g, const MachineSpec& mach);
double best_reduce_scatter_time(double bytes, const Group& g, const MachineSpec& mach);
double best_all_gather_time(double bytes, const Group& g, const MachineSpec& mach);
// ZeRO-3's per-layer parameter all-gather / gradient reduce-scatter: ring only (what NCCL runs
// for these collectives), so every one pays (p-1) alpha; see predict.cpp.
double ring_all_gather_time(double bytes, const Group& g, const MachineSpec& mach);
// One point-to-point message between ranks in the same node or not.
double p2p_time(double bytes, bool same_node, const MachineSpec& mach);

constexpr double kBusEfficiency = 0.8;

}  // namespace exatrain::plan
