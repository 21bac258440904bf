#include "plan/predict.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/check.hpp"
#include "job/model_shapes.hpp"
#include "plan/comm.hpp"
#include "plan/compute.hpp"
#include "plan/flops.hpp"
#include "plan/io.hpp"
#include "plan/pipeline.hpp"

namespace exatrain::plan {

const Calibration& default_calibration() {
  static const Calibration cal;
  return cal;
}

namespace {
// The global constants by name (one table: set, get and the names agree).
std::vector<std::pair<const char*, double*>> global_table(Calibration& c) {
  return {{"optimizer_bytes_per_param", &c.optimizer_bytes_per_param}, {"fp8_relative", &c.fp8_relative},
          {"attention_relative", &c.attention_relative},
          {"fragmentation", &c.fragmentation}, {"fragmentation_at_capacity", &c.fragmentation_at_capacity}};
}
std::optional<double> DeviceConstants::*device_field(const std::string& name) {
  if (name == "sustained") return &DeviceConstants::sustained;
  if (name == "bw_efficiency") return &DeviceConstants::bw_efficiency;
  if (name == "network") return &DeviceConstants::network;
  if (name == "attention") return &DeviceConstants::attention;
  return nullptr;
}
std::string known_constants() {
  std::string known;
  for (const auto& n : global_constant_names()) known += (known.empty() ? "" : ", ") + n;
  for (const auto& n : device_constant_names()) known += ", DEVICE." + n;
  return known;
}
// The catalog's value of a device constant for `key` (a device name, or a family: its first
// device). Error when no device has that name or family.
double catalog_value(const std::string& key, const std::string& constant) {
  for (const Device& d : all_devices())
    if (d.name == key || d.family == key) {
      if (constant == "sustained") return d.sustained;
      if (constant == "bw_efficiency") return d.bw_efficiency;
      return 1.0;  // a multiplier (is_multiplier_constant)
    }
  EXA_FAIL("calibration constant '{}.{}': no device or device family '{}' in the catalog", key, constant, key);
}
}  // namespace

const std::vector<std::string>& global_constant_names() {
  static const std::vector<std::string> names = [] {
    Calibration c;
    std::vector<std::string> out;
    for (auto& [n, ptr] : global_table(c)) out.push_back(n);
    return out;
  }();
  return names;
}
const std::vector<std::string>& device_constant_names() {
  static const std::vector<std::string> names = {"sustained", "bw_efficiency", "network", "attention"};
  return names;
}

bool is_multiplier_constant(const std::string& short_name) {
  return short_name == "network" || short_name == "attention";
}

void Calibration::set(const std::string& a) {
  auto eq = a.find('=');
  EXA_CHECK(eq != std::string::npos, "calibration override '{}': expected name=value", a);
  double v = 0;
  try {
    size_t used = 0;
    v = std::stod(a.substr(eq + 1), &used);
    EXA_CHECK(used == a.size() - eq - 1, "");
  } catch (...) {
    EXA_FAIL("calibration override '{}': the value is not a number", a);
  }
  set(a.substr(0, eq), v);
}

void Calibration::set(const std::string& name, double v) {
  EXA_CHECK(std::isfinite(v) && v > 0, "calibration constant {} = {}: expected a positive number", name, v);
  for (auto& [n, ptr] : global_table(*this))
    if (name == n) { *ptr = v; return; }
  const auto dot = name.rfind('.');
  if (dot != std::string::npos && device_field(name.substr(dot + 1))) {
    const std::string key = name.substr(0, dot), constant = name.substr(dot + 1);
    catalog_value(key, constant);  // the device or family exists
    EXA_CHECK(is_multiplier_constant(constant) || v <= 1,
              "calibration constant {} = {}: a fraction, expected <= 1", name, v);
    devices[key].*device_field(constant) = v;
    return;
  }
  EXA_FAIL("unknown calibration constant '{}': known are {}", name, known_constants());
}

double Calibration::get(const std::string& name) const {
  Calibration copy = *this;
  for (auto& [n, ptr] : global_table(copy))
    if (name == n) return *ptr;
  const auto dot = name.rfind('.');
  EXA_CHECK(dot != std::string::npos && device_field(name.substr(dot + 1)), "unknown calibration constant '{}': known "
            "are {}", name, known_constants());
  const std::string key = name.substr(0, dot), constant = name.substr(dot + 1);
  if (auto it = devices.find(key); it != devices.end())
    if (const auto& v = it->second.*device_field(constant)) return *v;
  // A device's family entry, as tuned() and network() apply it ("a100.sustained" set, asked for
  // "a100-80g.sustained"): the value the predictions use.
  for (const Device& d : all_devices())
    if (d.name == key && d.family != key)
      if (auto it = devices.find(d.family); it != devices.end())
        if (const auto& v = it->second.*device_field(constant)) return *v;
  return catalog_value(key, constant);
}

Device Calibration::tuned(const Device& d) const {
  Device out = d;
  double attention = 1;
  for (const std::string* key : {&d.family, &d.name}) {  // the device's own entry last: it wins
    auto it = devices.find(*key);
    if (it == devices.end()) continue;
    if (it->second.sustained) out.sustained = *it->second.sustained;
    if (it->second.bw_efficiency) out.bw_efficiency = *it->second.bw_efficiency;
    if (it->second.attention) attention = *it->second.attention;
  }
  // The catalog efficiency is a fraction of the 16-bit peak: scaled, it stops at 1.
  for (std::optional<double>* eff : {&out.flash1_efficiency, &out.flash2_efficiency, &out.flash3_efficiency})
    if (*eff) **eff = std::min(1.0, **eff * attention);
  return out;
}

double Calibration::network(const Device& d) const {
  double n = 1;
  for (const std::string* key : {&d.family, &d.name})
    if (auto it = devices.find(*key); it != devices.end() && it->second.network) n = *it->second.network;
  return n;
}

void check_machine_for_plan(const MachineSpec& mach, const Plan& p, const std::string& source) {
  auto need = [&](bool needed, double value, const char* key, const char* why) {
    if (needed && !(value > 0))
      throw Error(fmt::format("{}: machine.{} = {} but this plan needs it > 0 ({})", source, key,
                              value, why));
  };
  need(p.gpus > 1 && mach.gpus_per_node > 1, mach.intra_node_bw_gbs, "intra_node_bw_gbs",
       "its groups have ranks inside one node");
  need(p.gpus > mach.gpus_per_node, mach.inter_node_bw_gbs, "inter_node_bw_gbs",
       fmt::format("gpus = {} spans more than gpus_per_node = {}", p.gpus, mach.gpus_per_node)
           .c_str());
  if (mach.intra_node_latency_us < 0 || mach.inter_node_latency_us < 0)
    throw Error(fmt::format("{}: machine latencies must be >= 0 (intra_node_latency_us = {}, "
                            "inter_node_latency_us = {})",
                            source, mach.intra_node_latency_us, mach.inter_node_latency_us));
}

namespace {

constexpr double kGiB = double(1 << 30);

double tokens_per_micro_batch(const ModelSpec& m, const Plan& p) {
  return double(p.micro_batch) * double(m.seq_len) / double(p.cp);
}

// A collective run in tp chunks under the GEMM that consumes or produces it (tp_comm_overlap): chunk
// i + 1 moves while GEMM chunk i runs, so the pair takes c/tp + (tp - 1) max(c, g)/tp + g/tp for
// c = comm, g = gemm, and what shows beyond the GEMM is its excess plus the first chunk of the
// shorter of the two: max(0, c - g) + min(c, g)/tp. Never more than the collective run whole.
double exposed_under_gemm(double comm, double gemm, int64_t tp) {
  return std::max(0.0, comm - gemm) + std::min(comm, gemm) / double(tp);
}

// Op-level checkpointing (torchtitan's policy, plan/compute.cpp) saves the outputs of reduce-scatters
// but not of all-gathers (torchtitan's _save_list: mm, SDPA, reduce_scatter_tensor, max), so its
// recompute re-runs a layer's two sequence-parallel all-gathers, whose outputs the saved matmuls'
// backward needs. Without sequence parallelism it re-runs the attention's all-reduce, whose output
// the MLP's norm needs (not saved); the MLP's comes after the last tensor the backward needs
// (torch.compile's partitioner, or eager with early stop). With tp_comm_overlap (sequence parallel
// only) each all-gather runs in chunks under the recomputed GEMM that consumes it
// (LayerTime::op_gather_consumers); a short GEMM, Llama 3's k at tp = 8 (128 columns a rank),
// hides little of it.
// ag, ar: one all-gather's and one all-reduce's seconds over the layer's activation.
double op_recompute_tp_time(const Plan& p, const LayerTime& lt, double ag, double ar) {
  if (!p.seq_parallel) return ar;
  if (p.tp_comm_overlap == TpCommOverlap::none) return 2 * ag;
  double t = 0;
  for (double gemm : lt.op_gather_consumers) t += exposed_under_gemm(ag, gemm, p.tp);
  return t;
}

// Tensor parallel: per layer per micro-batch 2 all-reduces forward and 2 backward (sequence
// parallel: 2 all-gathers + 2 reduce-scatters each way), the recompute forward's again (with early
// stop all but the last), op-level checkpointing's re-run all-gathers (op_recompute_tp_time); the
// embedding's and the LM head's all-reduce. Exposed (Megatron runs them on the critical path)
// unless tp_comm_overlap: then each all-gather / reduce-scatter runs in tp chunks under the GEMM
// that consumes / produces it, and what shows is the excess of communication over the pass's
// linear-layer GEMMs plus the first chunk of the shorter of the two (exposed_under_gemm): in every
// pass (Megatron's userbuffers), or in the forward passes only, the recompute forward's included
// (PyTorch's async TP, whose end-to-end gain is its forward's: job/job.hpp TpCommOverlap).
double tp_comm_time(const ModelSpec& m, const Plan& p, const MachineSpec& mach, const LayerTime& lt,
                    double layers) {
  if (p.tp == 1) return 0;
  const Group g = group_on_machine(p.tp, 1, mach.gpus_per_node);
  const double act = double(p.tp_element_bytes()) * tokens_per_micro_batch(m, p) * double(m.hidden);
  const double ag = best_all_gather_time(act, g, mach), rs = best_reduce_scatter_time(act, g, mach);
  const double ar = best_all_reduce_time(act, g, mach);
  const double pass = p.seq_parallel ? 2 * (ag + rs) : 2 * ar;
  const double ends = 2 * ar;
  const double mbs = double(p.micro_batches());
  // Full recomputation re-runs the forward's collectives; with early stop (Plan::recompute_early_stop)
  // not the one after the last linear (the MLP's reduce-scatter, or its all-reduce without sequence
  // parallelism), whose GEMM is not re-run either.
  const double last = p.seq_parallel ? rs : ar;
  const double again = p.recompute != Recompute::full ? 0 : p.recompute_stops_early() ? pass - last : pass;
  const double op = p.recompute == Recompute::op ? op_recompute_tp_time(p, lt, ag, ar) : 0;
  if (p.tp_comm_overlap == TpCommOverlap::none) return mbs * (layers * (2 * pass + again + op) + ends);
  const int64_t q = p.tp;
  const double backward = p.tp_comm_overlap == TpCommOverlap::all ? exposed_under_gemm(pass, lt.linear_bwd, q) : pass;
  const double recompute = (again > 0 ? exposed_under_gemm(again, lt.linear_recompute, q) : 0) + op;
  return mbs * (layers * (exposed_under_gemm(pass, lt.linear_fwd, q) + recompute + backward) + ends);
}

// Context parallel: ring exchange of K,V, overlapped with the attention core.
double cp_comm_time(const ModelSpec& m, const Plan& p, const MachineSpec& mach, const LayerTime& lt, double layers) {
  if (p.cp == 1) return 0;
  const Group g = group_on_machine(p.cp, p.tp, mach.gpus_per_node);
  const double kv_local = double(kv_dim_per_rank(m, p.tp));
  const double msg = double(element_bytes(p.precision)) * 2 * tokens_per_micro_batch(m, p) * kv_local;
  const double step = p2p_time(msg, g.per_node == g.size, mach);
  const double fwd = double(p.cp - 1) * std::max(0.0, step - lt.attention_fwd / double(p.cp));
  const double passes = p.recompute == Recompute::full ? 4 : 3;  // fwd, bwd = 2 sends (+ recompute)
  return double(p.micro_batches()) * layers * passes * fwd;
}

// Pipeline point-to-point: 2 (m vp + pp - 1) messages of t h elements on the critical path. With
// overlap_p2p_comm (Megatron-Core's interleaved schedule, megatron/core/pipeline_parallel/schedules.py:
// each chunk's send and the next chunk's receive are posted asynchronously and waited for only when
// their tensor is needed) the 2 m vp steady-state messages run under the compute of the chunk in
// flight, a message exposed by what it takes beyond one chunk's forward (`layers` / vp layers of
// lt.fwd, the shorter pass) and by its latency α at least (posting and completing it is not free:
// so more, smaller chunks are not free either); the 2 (pp - 1) of the warm-up and cool-down, which
// no chunk covers yet (Megatron-LM's --overlap-p2p-communication-warmup-flush, off by default),
// stay on the critical path.
double pp_comm_time(const ModelSpec& m, const Plan& p, const MachineSpec& mach, const LayerTime& lt, double layers) {
  if (p.pp == 1) return 0;
  const int64_t G = mach.gpus_per_node;
  const double msg = double(p.pipeline_element_bytes()) * tokens_per_micro_batch(m, p) * double(m.hidden);
  const bool same_node = p.tp * p.cp * p.dp < G;
  double t = p2p_time(msg, same_node, mach);
  // Megatron's scatter/gather optimisation (SC21 Sec. 4.1): across nodes each tp rank sends
  // 1/tp of the (replicated) activation, and the receiving node all-gathers it over NVLink.
  if (!same_node && p.tp > 1 && !p.seq_parallel && p.pp_scatter_gather)
    t = p2p_time(msg / double(p.tp), false, mach) + best_all_gather_time(msg, group_on_machine(p.tp, 1, G), mach);
  if (!same_node && p.tp > 1 && p.seq_parallel) t = p2p_time(msg / double(p.tp), false, mach);
  const double steady = 2 * double(p.micro_batches()) * double(p.vp), fill = 2 * double(p.pp - 1);
  const double chunk = layers / double(p.vp) * lt.fwd, alpha = p2p_time(0.0, same_node, mach);
  double total = (p.overlap_p2p_comm && p.vp > 1) ? steady * std::max(alpha, t - chunk) + fill * t : (steady + fill) * t;
  // Tied embeddings: once per step the first and the last stage add their copies' gradients (this
  // tp rank's vocabulary rows, the gradient precision; ZeRO 2/3 only the rank's 1/(dp cp) share),
  // an exchange between two ranks pp - 1 stages apart, after the backward.
  if (m.tie_embeddings) {
    const double rows = double(vocab_slice(m.vocab, p.tp, 0).rows) * double(m.hidden);
    const double bytes = (p.grads_16bit ? 2.0 : 4.0) * rows / double(p.zero >= 2 ? p.dp * p.cp : 1);
    total += p2p_time(bytes, (p.pp - 1) * p.tp * p.cp * p.dp < G, mach);
  }
  return total;
}

// ZeRO-3 (DeepSpeed stage 3, FSDP): per micro-batch, every layer's parameters are all-gathered
// before its forward, all-gathered again before its backward (which also serves full
// recomputation: it runs right before the backward of that layer) and its gradients
// reduce-scattered after it. Each is a ring over the replicas (NCCL runs all-gather and
// reduce-scatter as rings only), so each pays (p-1) alpha: at dp in the thousands the latency
// alone is milliseconds per collective, per layer, per micro-batch. Prefetching (DeepSpeed's
// prefetch bucket, FSDP's forward/backward prefetch) overlaps the next layer's gather with this
// layer's compute, and the previous layer's reduce-scatter with this layer's backward; what it
// cannot hide: the first gather of each pass, the last reduce-scatter, and any per-layer excess of
// communication over compute. The embedding and head parameters are gathered like a layer.
// FSDP2 under PyTorch's pipelining (Plan::fsdp_unsharded_in_pipeline) keeps every unit gathered
// and its gradient unsharded for the step: one gather per layer in the first micro-batch's forward,
// one reduce-scatter per layer after the last micro-batch's backward (stage.py's manual
// post_backward: after it, so nothing hides it), nothing in between. Without prefetch
// (Plan::zero3_prefetch false: this runtime) zero3_blocking_time below.
double zero3_time(const Plan& p, const MachineSpec& mach, const Group& g, const LayerTime& lt, double layers,
                  double weights, double grads) {
  const double per = std::max(1.0, layers);
  const double ag = ring_all_gather_time(weights / per, g, mach);
  const double rs = ring_all_gather_time(grads / per, g, mach);  // same ring pass, fp32
  const double exposed_fwd = ag + (layers - 1) * std::max(0.0, ag - lt.fwd);
  if (p.fsdp_unsharded_in_pipeline && p.pp > 1) return exposed_fwd + layers * rs;
  const double exposed_bwd = ag + rs + (layers - 1) * std::max(0.0, ag + rs - lt.bwd - lt.recompute);
  return double(p.micro_batches()) * (exposed_fwd + exposed_bwd);
}

// What this runtime's ZeRO 3 gathers on pipeline rank `rank` in one micro-batch (below): each unit
// before every pass that reads it.
struct Zero3Units {
  double layers = 0, passes = 2;    // the rank's layers; the gathers of each per micro-batch
  double layer_n = 0, layer_w = 0;  // a layer's parameters, and the bytes of one gather of it
  double ends = 0, ends_n = 0;      // end units on the rank (0-2) and their parameters
  double ends_w = 0;                // the bytes of one gather of every end unit (a re-gathered embedding too)
  double gathered_bytes() const { return layers * passes * layer_w + 2 * ends_w; }
  double parameters() const { return layers * layer_n + ends_n; }
};
Zero3Units zero3_units(const ModelSpec& m, const Plan& p, int64_t rank) {
  Zero3Units u;
  // The end units' parameters, on tp rank 0 (the most rows).
  const EndParameters end = end_parameters_on_rank(m, p, rank);
  const bool first = rank == 0, last = rank == p.pp - 1;
  u.ends_n = double(end.embedding + end.head);
  u.ends = double(first) + double(last);
  u.layers = double(layers_on_rank(m, p, rank));
  u.layer_n = u.layers > 0 ? (double(parameters_on_rank(m, p, rank)) - u.ends_n) / u.layers : 0.0;
  const double matrices = double(matrix_parameters_on_rank(m, p, rank));
  u.layer_w = u.layers > 0 ? gathered_weight_bytes(p, u.layer_n, matrices / u.layers) : 0.0;
  // The end units are 16-bit (fp32 training: 32-bit); a single tied stage's head gathers the embedding again.
  const double regather = first && last && m.tie_embeddings ? double(end.embedding) : 0.0;
  u.ends_w = double(element_bytes(p.precision)) * (u.ends_n + regather);
  u.passes = p.recompute == Recompute::full ? 3 : 2;
  return u;
}

// This runtime's ZeRO 3 (Plan::zero3_prefetch false; parallel/zero3_sync.cpp, model/gpt.cpp):
// every unit of pipeline rank `rank` (its layers, the embedding on the first stage, the head on
// the last) is all-gathered, blocking, before each pass that reads it and released after: the
// forward, the backward, and for recompute = full the layer's rerun before its backward; each
// unit's gradient is reduce-scattered after every micro-batch's backward. With one stage and tied
// embeddings the head gathers the embedding's segment again. `grad_bytes`: per parameter.
double zero3_blocking_time(const ModelSpec& m, const Plan& p, const MachineSpec& mach, const Group& g, int64_t rank,
                           double grad_bytes) {
  const Zero3Units u = zero3_units(m, p, rank);
  auto ag = [&](double bytes) { return ring_all_gather_time(bytes, g, mach); };  // affine in bytes: units add up
  double step = u.layers * (u.passes * ag(u.layer_w) + ag(grad_bytes * u.layer_n));
  if (u.ends > 0) step += u.ends * (2 * ag(u.ends_w / u.ends) + ag(grad_bytes * u.ends_n / u.ends));
  return double(p.micro_batches()) * step;
}

// This runtime's CPU backend gives released memory back to the OS (Device::refault_gbs), and the
// next write faults its pages in again: every micro-batch, ZeRO 2 releases the gradient buckets it
// reduce-scattered (parallel/zero.cpp GradBucketer::retire), ZeRO 3 each unit's parameters after
// every pass and its fp32 gradients after the backward (parallel/zero3_sync.cpp); over one replica
// both run ZeRO 0 (parallel/grad_sync.hpp zero_run), which releases nothing. Seconds per
// micro-batch on pipeline rank `rank`: `compute`, what the rank writes itself (the gradients, its own
// shard of each gather); `dp`, what MPI writes into the gathered units (the other replicas' shards:
// inside the all-gather, which the runtime times as dp_comm; a segment dp does not divide is
// gathered into staging and copied by the rank, not modelled). 0 on devices that keep released
// memory mapped (GPUs).
struct Refault { double compute = 0, dp = 0; };
Refault refault_time(const ModelSpec& m, const Plan& p, const Device& d, int64_t rank) {
  const double replicas = double(p.dp * p.cp);
  if (d.refault_gbs <= 0 || replicas == 1) return {};
  const double rate = d.refault_gbs * 1e9;
  if (p.zero == 2) return {4.0 * double(parameters_on_rank(m, p, rank)) / rate, 0.0};
  if (p.zero != 3) return {};
  const Zero3Units u = zero3_units(m, p, rank);
  const double gathered = u.gathered_bytes() / rate;
  return {4.0 * u.parameters() / rate + gathered / replicas, gathered * (replicas - 1) / replicas};
}

// ZeRO 1 and 2's all-gather of the updated 16-bit weights over the replicas (the matrices in fp8
// with fp8_param_gather: gathered_weight_bytes); with overlap_param_gather (Megatron's
// --overlap-param-gather) it hides behind the next forward.
double param_gather_time(const ModelSpec& m, const Plan& p, const MachineSpec& mach, const LayerTime& lt,
                         int64_t rank, double layers) {
  const Group g = group_on_machine(p.dp * p.cp, p.tp, mach.gpus_per_node);
  const double bytes = gathered_weight_bytes(p, double(parameters_on_rank(m, p, rank)),
                                             double(matrix_parameters_on_rank(m, p, rank)));
  const double ag = best_all_gather_time(bytes, g, mach);
  return p.overlap_param_gather ? std::max(0.0, ag - layers * lt.fwd) : ag;
}

// Data parallel over the dp*cp replicas. Gradients are reduced in fp32 (4 bytes) whatever the
// training precision: Megatron-LM forces --accumulate-allreduce-grads-in-fp32 for bf16 (and its
// main_grad buffers are fp32), FSDP's mixed-precision policies in torchtitan and llm-foundry reduce
// in fp32; memory.cpp counts the same fp32 gradients. ZeRO's parameter all-gathers move 16-bit
// weights. With overlap_grad_reduce the reduction of the last micro-batch's gradients runs under
// its backward (bucket by bucket); without it, after. ZeRO-1 (Megatron's distributed optimizer)
// reduce-scatters once per step; ZeRO-2 (DeepSpeed stage 2) keeps only its shard, so it
// reduce-scatters every micro-batch's gradients; both all-gather the updated weights, under the
// next step's first forward with overlap_param_gather.
double dp_comm_time(const ModelSpec& m, const Plan& p, const MachineSpec& mach, const LayerTime& lt, int64_t rank,
                    double layers) {
  const int64_t replicas = p.dp * p.cp;
  if (replicas == 1) return 0;
  const Group g = group_on_machine(replicas, p.tp, mach.gpus_per_node);
  const double n = double(parameters_on_rank(m, p, rank));
  const double grads = (p.grads_16bit || p.grad_reduce_bf16 ? 2.0 : 4.0) * n;  // the weights: param_gather_time
  if (p.zero == 3 && !p.zero3_prefetch) return zero3_blocking_time(m, p, mach, g, rank, grads / n);
  if (p.zero == 3)
    return zero3_time(p, mach, g, lt, layers, gathered_weight_bytes(p, n, double(matrix_parameters_on_rank(m, p, rank))),
                      grads);
  const double bwd_mb = layers * (lt.bwd + lt.recompute);  // what a micro-batch's reduction overlaps
  auto reduce = [&](double t) { return p.overlap_grad_reduce ? std::max(0.0, t - bwd_mb) : t; };
  if (p.zero == 0) return reduce(best_all_reduce_time(grads, g, mach));
  const double rs = best_reduce_scatter_time(grads, g, mach);
  return (p.zero == 2 ? double(p.micro_batches()) : 1.0) * reduce(rs) + param_gather_time(m, p, mach, lt, rank, layers);
}

// DeepSpeed's BF16Optimizer (grads_twice) adds every micro-batch's bf16 .grad into its fp32
// gradient buffer right after that micro-batch's backward (bf16_optimizer.py update_hp_grads:
// hp_grad.add_(lp.grad.to(fp32)), called by the pipeline engine per backward pass): the cast reads 2
// bytes and writes 4, the add reads 4 + 4 and writes 4, per parameter of pipeline rank r, per
// micro-batch, whatever the micro-batch size. Other frameworks accumulate inside the weight-gradient
// GEMM (Megatron's main_grad fusion) or on the reduce-scattered shard (FSDP, 1/dp of it: not
// counted), but FSDP1 has a pass of its own over the unsharded gradient, below.
//
// PyTorch FSDP1 (fsdp_grad_pass), per FSDP unit per micro-batch, in its post-backward hook
// (torch/distributed/fsdp/_runtime_utils.py _post_backward_hook, _reduce_grad): the unsharded
// gradient is cast to the reduce dtype (`flat_param.grad.to(reduce_dtype)`: bf16 -> fp32 reads 2
// bytes and writes 4 per parameter; none when the gradient already has that dtype, FSDP's PURE
// policy) and divided in place by the pre-divide factor before the reduce-scatter
// (`_div_if_needed(padded_unsharded_grad, _gradient_predivide_factor)`, a factor > 1 for any world
// size >= 2: read and write the reduce dtype). 14 bytes per parameter of the rank with fp32
// reduction, 4 with bf16; whatever the micro-batch size, so it weighs on short micro-batches. It
// runs on FSDP's post-backward stream beside the next unit's backward; counted in full, as the
// memory-bound kernels take SMs and HBM bandwidth from it.
double fsdp_grad_pass_bytes(const Plan& p) {
  if (!p.fsdp_grad_pass || p.zero < 2 || p.dp * p.cp == 1) return 0;
  return p.grads_16bit ? 2.0 + 2.0 : (2.0 + 4.0) + (4.0 + 4.0);
}
double grad_accumulation_time(const ModelSpec& m, const Plan& p, const Device& d, int64_t r) {
  const double bytes = (p.grads_twice ? 18.0 : 0.0) + fsdp_grad_pass_bytes(p);
  if (bytes == 0) return 0;
  return bytes * double(parameters_on_rank(m, p, r)) / (d.hbm_bw_gbs * 1e9 * d.bw_efficiency);
}

}  // namespace

std::string plan_summary(const Plan& p) {
  std::string s = fmt::format("tp={} pp={} dp={} cp={} vp={} zero={} mb={} recompute={}{} sp={} {}",
                              p.tp, p.pp, p.dp, p.cp, p.vp, p.zero, p.micro_batch, to_string(p.recompute),
                              p.recompute_stops_early() ? "+early-stop" : "", p.seq_parallel ? "yes" : "no",
                              p.vp > 1 ? "interleaved-1f1b" : to_string(p.schedule));
  if (!p.layers_per_stage.empty())
    s += fmt::format(" stages=[{}]", fmt::join(p.layers_per_stage, ","));
  return s;
}

Prediction predict(const ModelSpec& m, const MachineSpec& mach, const Plan& p,
                   const Calibration& c) {
  check_plan(m, p);
  const Device d = c.tuned(find_device(mach.device));
  if (const std::string e = kernel_problem(p, d); !e.empty()) throw Error(e);
  return predict_checked(m, mach, d, p, memory_per_device(m, p, d, c.fragmentation, c.fragmentation_at_capacity), c);
}

namespace {
// What follows from a predicted step: tokens/s, model and hardware FLOP rates and their
// utilisation of the peak, the memory and whether it fits, the pipeline bubble, the checkpoint
// write time and Young/Daly's interval for this many nodes.
void fill_rates_and_memory(Prediction& out, const ModelSpec& m, const MachineSpec& mach, const Device& d,
                           const Memory& memory) {
  const Plan& p = out.plan;
  const double peak = d.peak_tflops(p.precision) * 1e12;
  const double step_tokens = double(p.global_batch) * double(m.seq_len);
  out.tokens_per_s = step_tokens / out.step_time_s;
  const double model_flops = model_flops_per_step(m, p.global_batch);
  const double hw_flops = hardware_flops_per_step(m, p.global_batch, p.recompute, p.recompute_stops_early());
  out.model_tflops_per_gpu = model_flops / out.step_time_s / double(p.gpus) / 1e12;
  out.hardware_tflops_per_gpu = hw_flops / out.step_time_s / double(p.gpus) / 1e12;
  out.mfu = out.model_tflops_per_gpu * 1e12 / peak;
  out.hfu = out.hardware_tflops_per_gpu * 1e12 / peak;

  out.memory = memory;
  out.device_memory_bytes = d.hbm_gib * kGiB;
  out.fits = out.memory.total <= out.device_memory_bytes;

  out.parameters = double(total_parameters(m));
  out.bubble_fraction = bubble_fraction(p);
  out.checkpoint_write_s = checkpoint_write_seconds(out.parameters, p.precision, mach);
  const int64_t G = mach.gpus_per_node;
  const int64_t nodes = (p.gpus + G - 1) / G;
  out.checkpoint_interval_s = young_daly_interval_seconds(out.checkpoint_write_s, nodes, mach);
}

}  // namespace

Prediction predict_checked(const ModelSpec& m, const MachineSpec& mach_in, const Device& d,
                           const Plan& p, const Memory& memory, const Calibration& c) {
  // A calibration's network constant scales the collective bandwidths of this device's machine.
  const double network = c.network(d);
  MachineSpec scaled;
  if (network != 1) {
    scaled = mach_in;
    scaled.intra_node_bw_gbs *= network;
    scaled.inter_node_bw_gbs *= network;
  }
  const MachineSpec& mach = network != 1 ? scaled : mach_in;
  Prediction out;
  out.plan = p;
  out.device = d.name;
  const double mbs = double(p.micro_batches());

  // ---- compute per micro-batch on each pipeline rank (plan/compute.hpp) ----
  const LayerTime lt = layer_time(m, p, d, c);
  const double head = head_time(m, p, d, c), embed = embedding_time(m, p, d);
  std::vector<int64_t> layers = layers_per_rank(m, p);
  std::vector<double> rank_time(p.pp), accumulate(p.pp, 0.0);
  std::vector<Refault> refault(p.pp);
  for (int64_t r = 0; r < p.pp; ++r) {
    rank_time[r] = double(layers[r]) * lt.total();
    if (r == 0) rank_time[r] += embed;
    if (r == p.pp - 1) rank_time[r] += head;
    refault[r] = refault_time(m, p, d, r);
    // Per micro-batch, on every rank (so in the bubble too); reported in the element-wise part of
    // compute_parts, though a page fault is kernel time, not memory bandwidth.
    accumulate[r] = grad_accumulation_time(m, p, d, r) + refault[r].compute;
    rank_time[r] += accumulate[r];
  }
  int64_t slow = std::max_element(rank_time.begin(), rank_time.end()) - rank_time.begin();
  double slow_layers = double(layers[slow]);
  Breakdown& b = out.breakdown;
  b.compute = mbs * rank_time[slow];
  out.compute_parts = {mbs * slow_layers * lt.linear, mbs * slow_layers * lt.attention,
                       mbs * (slow_layers * lt.elementwise + accumulate[slow]), mbs * slow_layers * lt.casts,
                       slow == p.pp - 1 ? mbs * head : 0, slow == 0 ? mbs * embed : 0};
  b.pp_bubble = bubble_time(rank_time, p.vp);
  b.tp_comm = tp_comm_time(m, p, mach, lt, slow_layers);
  b.cp_comm = cp_comm_time(m, p, mach, lt, slow_layers);
  b.pp_comm = pp_comm_time(m, p, mach, lt, slow_layers);
  if (p.comm.active() && p.dp * p.cp > 1) {
    // [comm]: compressed reductions (plan/compression.hpp), blocking; the dense reduction they are
    // compared with hides behind the backward as dp_comm_time's does. ZeRO 2 runs one per
    // micro-batch; ZeRO 1 and 2 all-gather the weights as usual.
    const double overlap = p.overlap_grad_reduce ? slow_layers * (lt.bwd + lt.recompute) : 0.0;
    out.compression = compression_cost(m, mach, d, p, slow, p.zero >= 1, overlap);
    b.dp_comm = (p.zero == 2 ? mbs : 1.0) * out.compression->seconds() +
                (p.zero >= 1 ? param_gather_time(m, p, mach, lt, slow, slow_layers) : 0.0);
  } else {
    b.dp_comm = dp_comm_time(m, p, mach, lt, slow, slow_layers);
  }
  b.dp_comm += mbs * refault[slow].dp;
  // ---- optimizer step: elementwise (memory bound) and matrix work (GEMM bound) of the same
  // pipeline rank as dp_comm, over the replicas as ZeRO splits it (plan/optimizer_cost.hpp) ----
  out.optimizer_step = optimizer_step_cost(m, p, d, c, slow);
  if (const KfacBytes kb = kfac_bytes(m, p, slow); kb.all_reduce > 0) {  // K-FAC's own traffic over the replicas
    const Group g = group_on_machine(p.dp * p.cp, p.tp, mach.gpus_per_node);
    out.optimizer_step.comm_s = best_all_reduce_time(kb.all_reduce, g, mach) + p2p_time(kb.sent, g.size == g.per_node, mach);
  }
  b.optimizer = out.optimizer_step.seconds();

  out.step_time_s = b.sum();
  fill_rates_and_memory(out, m, mach, d, memory);
  return out;
}

nlohmann::json to_json(const Prediction& pr) {
  using nlohmann::json;
  const Plan& p = pr.plan;
  const Memory& mem = pr.memory;
  const Breakdown& b = pr.breakdown;
  json j;
  j["step_time_s"] = pr.step_time_s;
  j["tokens_per_s"] = pr.tokens_per_s;
  j["model_tflops_per_gpu"] = pr.model_tflops_per_gpu;
  j["hardware_tflops_per_gpu"] = pr.hardware_tflops_per_gpu;
  j["mfu"] = pr.mfu;
  j["hfu"] = pr.hfu;
  j["memory_gib_per_gpu"] = {{"params", mem.params / kGiB},   {"grads", mem.grads / kGiB},
                             {"optimizer", mem.optimizer / kGiB},
                             {"activations", mem.activations / kGiB},
                             {"buffers", mem.buffers / kGiB}, {"total", mem.total / kGiB}};
  j["fits"] = pr.fits;
  j["breakdown_s"] = {{"compute", b.compute},     {"tp_comm", b.tp_comm},
                      {"cp_comm", b.cp_comm},     {"pp_comm", b.pp_comm},
                      {"pp_bubble", b.pp_bubble}, {"dp_comm", b.dp_comm},
                      {"optimizer", b.optimizer}, {"other", b.other}};
  j["plan"] = {{"gpus", p.gpus},
               {"tp", p.tp},
               {"pp", p.pp},
               {"dp", p.dp},
               {"cp", p.cp},
               {"vp", p.vp},
               {"zero", p.zero},
               {"micro_batch", p.micro_batch},
               {"global_batch", p.global_batch},
               {"recompute", to_string(p.recompute)},
               {"seq_parallel", p.seq_parallel},
               {"schedule", to_string(p.schedule)}};
  if (!p.layers_per_stage.empty()) j["plan"]["layers_per_stage"] = p.layers_per_stage;
  // Extensions (extra keys; the contract's keys above are unchanged).
  j["device"] = pr.device;
  j["memory_peak_gib"] = mem.peak / kGiB;  // Memory::peak (total is what fits compares)
  j["parameters"] = pr.parameters;
  j["micro_batches"] = p.micro_batches();
  j["bubble_fraction"] = pr.bubble_fraction;
  j["memory_most_loaded_pp_rank"] = mem.pp_rank;
  j["device_memory_gib"] = pr.device_memory_bytes / kGiB;
  j["checkpoint_write_s"] = pr.checkpoint_write_s;
  j["checkpoint_interval_s"] =
      pr.checkpoint_interval_s ? json(*pr.checkpoint_interval_s) : json(nullptr);
  // breakdown_s.compute by kind (plan/compute.hpp).
  const Prediction::ComputeParts& cp = pr.compute_parts;
  j["compute_s"] = {{"linear", cp.linear}, {"attention", cp.attention}, {"elementwise", cp.elementwise},
                    {"fp8_casts", cp.casts}, {"lm_head", cp.head}, {"embedding", cp.embedding}};
  // breakdown_s.optimizer = elementwise_s + matrix_s + comm_s (K-FAC's own communication).
  j["optimizer_step"] = {{"optimizer", p.optimizer},
                         {"elementwise_s", pr.optimizer_step.elementwise_s},
                         {"matrix_s", pr.optimizer_step.matrix_s},
                         {"comm_s", pr.optimizer_step.comm_s},
                         {"matrix_tflop_per_gpu", pr.optimizer_step.matrix_flops / 1e12}};
  if (pr.compression) j["compression"] = to_json(*pr.compression);
  return j;
}

std::string to_table(const Prediction& pr, const ModelSpec& m) {
  const Breakdown& b = pr.breakdown;
  const Memory& mem = pr.memory;
  std::string s;
  s += fmt::format("model   {:.2f} B parameters, {} layers x {} hidden, seq {}\n",
                   pr.parameters / 1e9, m.layers, m.hidden, m.seq_len);
  s += fmt::format("plan    gpus={} {} ({} micro-batches, {} precision, device {})\n",
                   pr.plan.gpus, plan_summary(pr.plan), pr.plan.micro_batches(),
                   to_string(pr.plan.precision), pr.device);
  s += fmt::format("step    {:.4g} s   {:.4g} tokens/s   {:.4g} model TFLOP/s/GPU   "
                   "MFU {:.1f}%   HFU {:.1f}%\n",
                   pr.step_time_s, pr.tokens_per_s, pr.model_tflops_per_gpu, 100 * pr.mfu,
                   100 * pr.hfu);
  auto row = [&](const char* name, double v) {
    s += fmt::format("  {:<10} {:>10.4f} s  {:>5.1f}%\n", name, v, 100 * v / pr.step_time_s);
  };
  s += "time breakdown (exposed)\n";
  row("compute", b.compute);
  row("tp_comm", b.tp_comm);
  row("cp_comm", b.cp_comm);
  row("pp_comm", b.pp_comm);
  row("pp_bubble", b.pp_bubble);
  row("dp_comm", b.dp_comm);
  row("optimizer", b.optimizer);
  if (pr.optimizer_step.matrix_s > 0)  // what the matrix optimizers add to the elementwise update
    s += fmt::format("    ({}: elementwise {:.4f} s + matrix {:.4f} s{}, {:.4g} TFLOP per GPU)\n", pr.plan.optimizer,
                     pr.optimizer_step.elementwise_s, pr.optimizer_step.matrix_s,
                     pr.optimizer_step.comm_s > 0 ? fmt::format(" + communication {:.4f} s", pr.optimizer_step.comm_s) : "",
                     pr.optimizer_step.matrix_flops / 1e12);
  row("other", b.other);
  if (pr.compression) s += to_lines(*pr.compression);
  s += fmt::format("memory per GPU (pipeline rank {}, GiB)  {}\n", mem.pp_rank,
                   pr.fits ? "fits" : "DOES NOT FIT");
  auto mrow = [&](const char* name, double v) { s += fmt::format("  {:<12} {:>8.2f}\n", name, v / kGiB); };
  mrow("params", mem.params);
  mrow("grads", mem.grads);
  mrow("optimizer", mem.optimizer);
  mrow("activations", mem.activations);
  mrow("buffers", mem.buffers);
  mrow("total", mem.total);
  s += fmt::format("  {:<12} {:>8.2f}  (what a memory monitor shows with room to spare: the allocator's cache)\n",
                   "peak held", mem.peak / kGiB);
  s += fmt::format("  {:<12} {:>8.2f}\n", "device", pr.device_memory_bytes / kGiB);
  s += fmt::format("checkpoint  {:.1f} s to write", pr.checkpoint_write_s);
  if (pr.checkpoint_interval_s)
    s += fmt::format("; Young/Daly interval {:.0f} s ({:.0f} steps)", *pr.checkpoint_interval_s,
                     *pr.checkpoint_interval_s / pr.step_time_s);
  s += "\n";
  return s;
}

}  // namespace exatrain::plan
