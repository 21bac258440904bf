#include "plan/comm.hpp"

#include <algorithm>
#include <cmath>

#include "core/check.hpp"
#include "job/model_shapes.hpp"
#include "plan/mesh.hpp"
#include "plan/flops.hpp"
#include "plan/memory.hpp"

namespace exatrain::plan {

const char* to_string(CommKind k) {
  switch (k) {
    case CommKind::tp_all_reduce: return "tp_all_reduce";
    case CommKind::tp_reduce_scatter: return "tp_reduce_scatter";
    case CommKind::tp_all_gather: return "tp_all_gather";
    case CommKind::cp_send: return "cp_send";
    case CommKind::pp_send: return "pp_send";
    case CommKind::dp_all_reduce: return "dp_all_reduce";
    case CommKind::dp_reduce_scatter: return "dp_reduce_scatter";
    case CommKind::dp_all_gather: return "dp_all_gather";
  }
  return "?";
}

RankPosition rank_position(const Plan& p, int64_t rank) {
  EXA_CHECK(rank >= 0 && rank < p.gpus, "rank {} outside 0..{}", rank, p.gpus - 1);
  // The one rank arithmetic (plan/mesh.hpp), shared with the runtime's communicators.
  const MeshShape shape{int(p.tp), int(p.cp), int(p.dp), int(p.pp)};
  const MeshCoord c = coord_of(shape, int(rank));
  return {c.tp, c.cp, c.dp, c.pp};
}

int64_t ring_chunk(int64_t e, int64_t p, int64_t c) { return e / p + (c < e % p ? 1 : 0); }
int64_t ring_reduce_scatter_sent(int64_t e, int64_t p, int64_t r) {
  return p <= 1 ? 0 : e - ring_chunk(e, p, r);
}
int64_t ring_all_gather_sent(int64_t e, int64_t p, int64_t r) {
  return p <= 1 ? 0 : e - ring_chunk(e, p, (r + 1) % p);
}
int64_t ring_all_reduce_sent(int64_t e, int64_t p, int64_t r) {
  return ring_reduce_scatter_sent(e, p, r) + ring_all_gather_sent(e, p, r);
}

namespace {

// What every kind's count needs: the rank's micro-batches, tokens, layers and stage.
struct RankWork {
  int64_t elem, mb, t, act, layers, fwd_passes;
  // Full recomputation with early stop (Plan::recompute_early_stop) does not re-run a layer's last
  // tp collective (the MLP's reduce-scatter, or its all-reduce without sequence parallelism).
  int64_t skipped_per_layer;
  // Op-level checkpointing's recompute re-runs a layer's two sequence-parallel all-gathers, or
  // without sequence parallelism the attention's all-reduce (plan/predict.cpp op_recompute_tp_time).
  bool op_recompute;
  bool first, last;
};
RankWork rank_work(const ModelSpec& m, const Plan& p, const RankPosition& pos) {
  RankWork w;
  w.elem = element_bytes(p.precision);
  w.mb = p.micro_batches();
  w.t = p.micro_batch * m.seq_len / p.cp;  // tokens per micro-batch on the rank
  w.act = w.t * m.hidden;                  // one activation tensor, elements
  w.layers = layers_on_rank(m, p, pos.pp_rank);
  w.first = pos.pp_rank == 0, w.last = pos.pp_rank == p.pp - 1;
  w.fwd_passes = p.recompute == Recompute::full ? 2 : 1;
  w.skipped_per_layer = p.recompute_stops_early() ? 1 : 0;
  w.op_recompute = p.recompute == Recompute::op;
  return w;
}

// Tensor parallelism: the regions' collectives, the cross entropy's, sequence parallelism's
// weight-gradient all-reduce.
void tp_bytes(const ModelSpec& m, const Plan& p, const RankPosition& pos, const RankWork& w, CommBytes& out) {
  const int64_t mb = w.mb, t = w.t, act = w.act, layers = w.layers, fwd_passes = w.fwd_passes;
  const bool first = w.first, last = w.last;
  const int64_t r = pos.tp_rank, q = p.tp;
  int64_t per_mb_ar = 0, per_mb_rs = 0, per_mb_ag = 0;  // collective counts per micro-batch
  if (p.seq_parallel) {
    per_mb_ag += layers * 2 * (fwd_passes + 1);
    per_mb_rs += layers * (2 * (fwd_passes + 1) - w.skipped_per_layer);
    if (w.op_recompute) per_mb_ag += layers * 2;
    if (first) { per_mb_rs += 1; per_mb_ag += 1; }  // embedding output / its gradient back to all rows
    if (last) { per_mb_ag += 1; per_mb_rs += 1; }  // LM head input forward / its grad backward
  } else {
    per_mb_ar += layers * (2 * (fwd_passes + 1) - w.skipped_per_layer);
    if (w.op_recompute) per_mb_ar += layers;
    if (first) per_mb_ar += 1;
    if (last) per_mb_ar += 1;
  }
  // The regions' messages in the tp dtype ([train] tp_comm_dtype: the compute dtype, or fp32).
  const int64_t tp_elem = p.tp_element_bytes();
  out[CommKind::tp_all_reduce] = mb * per_mb_ar * ring_all_reduce_sent(act, q, r) * tp_elem;
  out[CommKind::tp_reduce_scatter] = mb * per_mb_rs * ring_reduce_scatter_sent(act, q, r) * tp_elem;
  out[CommKind::tp_all_gather] = mb * per_mb_ag * ring_all_gather_sent(act, q, r) * tp_elem;
  if (last)  // cross entropy: 3 fp32 all-reduces of t elements per micro-batch
    out[CommKind::tp_all_reduce] += mb * 3 * ring_all_reduce_sent(t, q, r) * 4;
  if (p.seq_parallel) {
    // Once per step: the gradients of the weights used on this rank's sequence rows only
    // (norms, the biases after row-parallel layers) are partial sums over tp and are
    // all-reduced before the optimizer (Megatron's allreduce_sequence_parallel_grads). ZeRO 2/3
    // over several replicas hand every micro-batch's gradients to their dp owners, so the sum over
    // tp is taken per micro-batch first (m times); over one they run ZeRO 0 (parallel/grad_sync.hpp).
    const int64_t h = m.hidden;
    int64_t per_layer = 2 * norm_parameters(m);
    if (m.bias) per_layer += 2 * h;  // o_proj and fc2 (down_proj) biases
    int64_t sp_elems = layers * per_layer;
    if (last) sp_elems += norm_parameters(m);  // ln_f
    // Gradients: their dtype (fp32, Megatron's main_grad; 16-bit for Plan::grads_16bit).
    out[CommKind::tp_all_reduce] += (p.zero >= 2 && p.dp * p.cp > 1 ? mb : 1) * ring_all_reduce_sent(sp_elems, q, r) * (p.grads_16bit ? 2 : 4);
  }
}

// Context parallelism: K and V of the local chunk around the ring.
void cp_bytes(const ModelSpec& m, const Plan& p, const RankWork& w, CommBytes& out) {
  int64_t kv_local = kv_dim_per_rank(m, p.tp);
  int64_t kv_msg = 2 * w.t * kv_local;  // K and V of the local chunk
  int64_t sends_per_layer = (p.cp - 1) * (w.fwd_passes + 2);
  out[CommKind::cp_send] = w.mb * w.layers * sends_per_layer * kv_msg * w.elem;
}

// Pipeline parallelism: activations and their gradients between stages, tied embeddings' gradient.
void pp_bytes(const ModelSpec& m, const Plan& p, const RankPosition& pos, const RankWork& w, CommBytes& out) {
  const int64_t mb = w.mb, act = w.act;
  const bool first = w.first, last = w.last;
  int64_t sends = mb * (p.vp - (last ? 1 : 0)) + mb * (p.vp - (first ? 1 : 0));
  // Under sequence parallelism a stage boundary carries this rank's t/tp rows only.
  // Each message in the pipeline's dtype ([train] pipeline_dtype: the compute dtype, or fp32).
  out[CommKind::pp_send] = sends * (p.seq_parallel ? act / p.tp : act) * p.pipeline_element_bytes();
  // Tied embeddings: the first and last stage send each other their copy's gradient (this tp
  // rank's vocabulary rows) once per step, to sum them. ZeRO 2/3 have reduce-scattered it over
  // the replicas already: each rank sends only the 1/(dp cp) it owns.
  // A gradient: its bytes follow the gradients' dtype as the dp reductions' below (fp32 here at
  // every precision; predict's p2p time counts the same).
  if (m.tie_embeddings && (first || last))
    out[CommKind::pp_send] += vocab_slice(m.vocab, p.tp, pos.tp_rank).rows * m.hidden /
                              (p.zero >= 2 ? p.dp * p.cp : 1) * (p.grads_16bit ? 2 : 4);
}

// Data parallelism (and the cp replicas): the gradient reductions and ZeRO's parameter gathers.
void dp_bytes(const ModelSpec& m, const Plan& p, const RankPosition& pos, const RankWork& w, CommBytes& out) {
  const int64_t elem = w.elem, mb = w.mb;
  const int64_t replicas = p.dp * p.cp;
  const int64_t n = parameters_on_rank(m, p, pos.pp_rank, pos.tp_rank);
  const int64_t r = pos.dp_rank * p.cp + pos.cp_rank;
  // The gradient reductions send the gradients' reduce dtype, not the precision's: fp32 (4 bytes;
  // this runtime's fp32 gradients at every precision, Megatron's bf16 main_grad) unless [train]
  // grad_reduce_dtype = "bf16" or the framework reduces 16-bit gradients (Plan::grads_16bit:
  // Megatron's fp16 path). The same rule as predict's dp time (plan/predict.cpp). The parameter
  // all-gathers keep `elem`.
  const int64_t grad_elem = p.grad_reduce_bf16 || p.grads_16bit ? 2 : 4;
  if (p.zero == 0) {
    out[CommKind::dp_all_reduce] = ring_all_reduce_sent(n, replicas, r) * grad_elem;
  } else if (p.zero <= 2) {
    // ZeRO 1 (Megatron's distributed optimizer): the replicas accumulate the m micro-batches'
    // gradients locally and reduce-scatter once per step. ZeRO 2 (DeepSpeed stage 2) keeps
    // only its shard of the gradients, so every micro-batch's are reduce-scattered: m times.
    out[CommKind::dp_reduce_scatter] = (p.zero == 2 ? mb : 1) * ring_reduce_scatter_sent(n, replicas, r) * grad_elem;
    out[CommKind::dp_all_gather] = ring_all_gather_sent(n, replicas, r) * elem;
  } else {
    out[CommKind::dp_reduce_scatter] = mb * ring_reduce_scatter_sent(n, replicas, r) * grad_elem;
    out[CommKind::dp_all_gather] = mb * 2 * ring_all_gather_sent(n, replicas, r) * elem;
    // One stage with tied embeddings: the LM head reads the embedding's weights, so its forward
    // and its backward gather the embedding unit (this tp rank's vocabulary rows and, when
    // learned, the position table: one segment) once more (parallel/zero3_sync.cpp, make_chunk).
    if (m.tie_embeddings && p.pp == 1) {
      const int64_t emb = vocab_slice(m.vocab, p.tp, pos.tp_rank).rows * m.hidden +
                          (m.position == Position::learned ? m.seq_len * m.hidden : 0);
      out[CommKind::dp_all_gather] += mb * 2 * ring_all_gather_sent(emb, replicas, r) * elem;
    }
  }
}

}  // namespace

CommBytes bytes_sent_per_step(const ModelSpec& m, const Plan& p, const RankPosition& pos) {
  CommBytes out;
  const RankWork w = rank_work(m, p, pos);
  if (p.tp > 1) tp_bytes(m, p, pos, w, out);
  if (p.cp > 1) cp_bytes(m, p, w, out);
  if (p.pp > 1) pp_bytes(m, p, pos, w, out);
  if (p.dp * p.cp > 1) dp_bytes(m, p, pos, w, out);
  return out;
}

// ---- time ----

Group group_on_machine(int64_t size, int64_t stride, int64_t gpus_per_node) {
  Group g;
  g.size = size;
  if (stride >= gpus_per_node) g.per_node = 1;
  else g.per_node = std::max<int64_t>(1, std::min(size, gpus_per_node / stride));
  return g;
}

namespace {

double intra_bw(const MachineSpec& mach) { return mach.intra_node_bw_gbs * 1e9 * kBusEfficiency; }
// NIC bandwidth one device gets when every device of its node sends across nodes.
double nic_share(const MachineSpec& mach) {
  return mach.inter_node_bw_gbs * 1e9 * kBusEfficiency / double(mach.gpus_per_node);
}
double alpha_intra(const MachineSpec& mach) { return mach.intra_node_latency_us * 1e-6; }
double alpha_inter(const MachineSpec& mach) { return mach.inter_node_latency_us * 1e-6; }

// One ring pass (reduce-scatter or all-gather) of `bytes` over g.
double ring_pass(double bytes, const Group& g, const MachineSpec& mach) {
  if (g.size <= 1) return 0;
  double p = double(g.size);
  int64_t nodes = (g.size + g.per_node - 1) / g.per_node;
  if (nodes == 1) return (p - 1) / p * bytes / intra_bw(mach) + (p - 1) * alpha_intra(mach);
  // The ring crosses each node's NICs once; the node's gpus_per_node / per_node concurrent
  // rings share them.
  double bw = std::min(intra_bw(mach), nic_share(mach) * double(g.per_node));
  return (p - 1) / p * bytes / bw + (p - 1) * alpha_inter(mach);
}

// Intra-node pass among the per_node members, then an inter-node ring on bytes/per_node.
double hierarchical_pass(double bytes, const Group& g, const MachineSpec& mach) {
  if (g.size <= 1) return 0;
  int64_t k = g.per_node, nodes = (g.size + k - 1) / k;
  if (nodes == 1) return ring_pass(bytes, g, mach);
  double intra = ring_pass(bytes, Group{k, k}, mach);
  double n = double(nodes);
  double inter = (n - 1) / n * (bytes / double(k)) / nic_share(mach) + (n - 1) * alpha_inter(mach);
  return intra + inter;
}

double pass(double bytes, const Group& g, const MachineSpec& mach, Algorithm a) {
  EXA_CHECK(a != Algorithm::tree,
            "the tree algorithm is an all-reduce algorithm (NCCL runs all-gather and "
            "reduce-scatter as rings)");
  return a == Algorithm::ring ? ring_pass(bytes, g, mach) : hierarchical_pass(bytes, g, mach);
}

// Double binary tree all-reduce: reduce to the roots and broadcast back, both pipelined, so the
// bandwidth term is 2 * bytes over the slowest link a rank uses (the same link model as the ring:
// a node's NICs shared by its concurrent groups); latency grows with log2 of the node count.
double tree_all_reduce(double bytes, const Group& g, const MachineSpec& mach) {
  if (g.size <= 1) return 0;
  int64_t k = g.per_node, nodes = (g.size + k - 1) / k;
  double chain = 2 * double(k - 1) * alpha_intra(mach);
  if (nodes == 1) return 2 * bytes / intra_bw(mach) + chain;
  double bw = std::min(intra_bw(mach), nic_share(mach) * double(k));
  return 2 * bytes / bw + chain + 2 * std::log2(double(nodes)) * alpha_inter(mach);
}

}  // namespace

double all_reduce_time(double bytes, const Group& g, const MachineSpec& mach, Algorithm a) {
  if (a == Algorithm::tree) return tree_all_reduce(bytes, g, mach);
  return 2 * pass(bytes, g, mach, a);
}
double reduce_scatter_time(double bytes, const Group& g, const MachineSpec& mach, Algorithm a) {
  return pass(bytes, g, mach, a);
}
double all_gather_time(double bytes, const Group& g, const MachineSpec& mach, Algorithm a) {
  return pass(bytes, g, mach, a);
}
double best_all_reduce_time(double bytes, const Group& g, const MachineSpec& mach) {
  return std::min({all_reduce_time(bytes, g, mach, Algorithm::ring),
                   all_reduce_time(bytes, g, mach, Algorithm::hierarchical),
                   all_reduce_time(bytes, g, mach, Algorithm::tree)});
}
double best_reduce_scatter_time(double bytes, const Group& g, const MachineSpec& mach) {
  return std::min(reduce_scatter_time(bytes, g, mach, Algorithm::ring),
                  reduce_scatter_time(bytes, g, mach, Algorithm::hierarchical));
}
double best_all_gather_time(double bytes, const Group& g, const MachineSpec& mach) {
  return best_reduce_scatter_time(bytes, g, mach);
}
double ring_all_gather_time(double bytes, const Group& g, const MachineSpec& mach) {
  return ring_pass(bytes, g, mach);
}
double p2p_time(double bytes, bool same_node, const MachineSpec& mach) {
  if (same_node) return bytes / intra_bw(mach) + alpha_intra(mach);
  return bytes / nic_share(mach) + alpha_inter(mach);
}

}  // namespace exatrain::plan
