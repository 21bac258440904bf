#include "plan/predict.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/check.hpp"
#include "plan/comm.hpp"
#include "plan/flops.hpp"
#include "plan/io.hpp"
#include "plan/pipeline.hpp"

namespace exatrain::plan {

const Calibration& default_calibration() {
  static const Calibration cal;
  return cal;
}

void Calibration::set(const std::string& a) {
  auto eq = a.find('=');
  EXA_CHECK(eq != std::string::npos, "calibration override '{}': expected name=value", a);
  std::string name = a.substr(0, eq);
  double v = std::stod(a.substr(eq + 1));
  std::pair<const char*, double*> all[] = {
      {"dim_half", &dim_half},         {"tokens_half", &tokens_half},
      {"flash_relative", &flash_relative},
      {"unfused_relative", &unfused_relative}, {"elementwise_h", &elementwise_h},
      {"elementwise_f", &elementwise_f}, {"score_passes", &score_passes},
      {"optimizer_bytes_per_param", &optimizer_bytes_per_param}, {"fp8_relative", &fp8_relative}};
  std::string known;
  for (auto& [n, ptr] : all) {
    if (name == n) { *ptr = v; return; }
    known += std::string(known.empty() ? "" : ", ") + n;
  }
  EXA_FAIL("unknown calibration constant '{}': known are {}", name, known);
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

// The GEMM shape constants: the device's own (devices.toml, e.g. a CPU whose BLAS reaches its rate
// on far smaller shapes than GPU tiles) or the global calibration.
double dim_half(const Device& d, const Calibration& c) { return d.gemm_dim_half.value_or(c.dim_half); }
double tokens_half(const Device& d, const Calibration& c) { return d.gemm_tokens_half.value_or(c.tokens_half); }

// Seconds of one transformer layer for one micro-batch on one rank.
struct LayerTime {
  double fwd = 0, bwd = 0, recompute = 0;  // compute incl. memory-bound work
  double attention_fwd = 0;                // part of fwd: the attention core (overlaps cp)
  double total() const { return fwd + bwd + recompute; }
};

LayerTime layer_time(const ModelSpec& m, const Plan& p, const Device& d, const Calibration& c) {
  double tokens = double(p.micro_batch) * double(m.seq_len) / double(p.cp);
  double tp = double(p.tp);
  // FP8 applies to the linear layers only; attention and everything else run in bf16.
  bool fp8 = p.precision == Precision::fp8;
  double peak = d.peak_tflops(fp8 ? Precision::bf16 : p.precision) * 1e12;
  double gemm_peak = fp8 ? d.peak_tflops_fp8 * 1e12 * c.fp8_relative : peak;
  double bw = d.hbm_bw_gbs * 1e9 * d.bw_efficiency;
  double elem = double(element_bytes(p.precision));
  double shard_h = double(m.hidden) / tp;
  double eff = d.gemm_efficiency / (1 + dim_half(d, c) / shard_h) / (1 + tokens_half(d, c) / tokens);

  double gemm = layer_gemm_flops_per_token(m) * tokens / tp / (gemm_peak * eff);
  // Attention core: with cp each rank's queries attend to the whole sequence (s / cp of it
  // locally per step), so its FLOPs per local token stay 4*s*h.
  double attn_flops = layer_attention_flops_per_token(m) * tokens / tp;
  double attn = p.flash_attention
                    ? attn_flops / (peak * eff * c.flash_relative)
                    : attn_flops / (peak * eff * c.unfused_relative);
  double ew_elems = (c.elementwise_h * m.hidden + c.elementwise_f * m.ffn_hidden) / tp;
  if (!p.seq_parallel && p.tp > 1)  // norms, dropout, residual run replicated on every tp rank
    ew_elems += 8.0 * m.hidden * (1 - 1 / tp);
  double ew = ew_elems * tokens * elem / bw;
  double scores = 0;
  if (!p.flash_attention)
    scores = c.score_passes * double(m.heads) / tp * double(m.seq_len) * tokens * elem / bw;

  LayerTime t;
  t.attention_fwd = attn + scores;
  t.fwd = gemm + attn + ew + scores;
  t.bwd = 2 * gemm + 2 * attn + 2 * ew + 2 * scores;
  if (p.recompute == Recompute::full) t.recompute = t.fwd;
  if (p.recompute == Recompute::selective) t.recompute = attn + scores;
  return t;
}

}  // namespace

std::string plan_summary(const Plan& p) {
  std::string s = fmt::format("tp={} pp={} dp={} cp={} vp={} zero={} mb={} recompute={} sp={} {}",
                              p.tp, p.pp, p.dp, p.cp, p.vp, p.zero, p.micro_batch,
                              to_string(p.recompute), p.seq_parallel ? "yes" : "no",
                              p.vp > 1 ? "interleaved-1f1b" : to_string(p.schedule));
  if (!p.layers_per_stage.empty())
    s += fmt::format(" stages=[{}]", fmt::join(p.layers_per_stage, ","));
  return s;
}

Prediction predict(const ModelSpec& m, const MachineSpec& mach, const Plan& p,
                   const Calibration& c) {
  check_plan(m, p);
  const Device& d = find_device(mach.device);
  return predict_checked(m, mach, d, p, memory_per_device(m, p, d), c);
}

Prediction predict_checked(const ModelSpec& m, const MachineSpec& mach, const Device& d,
                           const Plan& p, const Memory& memory, const Calibration& c) {
  Prediction out;
  out.plan = p;
  out.device = d.name;
  const double tokens = double(p.micro_batch) * double(m.seq_len) / double(p.cp);
  const double elem = double(element_bytes(p.precision));
  const double peak = d.peak_tflops(p.precision) * 1e12;
  const double bw = d.hbm_bw_gbs * 1e9 * d.bw_efficiency;
  const double mbs = double(p.micro_batches());
  const int64_t G = mach.gpus_per_node;

  // ---- compute per micro-batch on each pipeline rank ----
  LayerTime lt = layer_time(m, p, d, c);
  double eff_head = d.gemm_efficiency / (1 + tokens_half(d, c) / tokens);
  double head_peak = d.peak_tflops(p.precision == Precision::fp8 ? Precision::bf16 : p.precision) * 1e12;
  double head = 3 * logits_flops_per_token(m) * tokens / p.tp / (head_peak * eff_head) +
                3 * 3 * 4.0 * tokens * double(m.vocab) / p.tp / bw;  // fp32 softmax passes
  double embed = 3 * elem * tokens * m.hidden / bw;
  std::vector<int64_t> layers = layers_per_rank(m, p);
  std::vector<double> rank_time(p.pp);
  for (int64_t r = 0; r < p.pp; ++r) {
    rank_time[r] = double(layers[r]) * lt.total();
    if (r == 0) rank_time[r] += embed;
    if (r == p.pp - 1) rank_time[r] += head;
  }
  int64_t slow = std::max_element(rank_time.begin(), rank_time.end()) - rank_time.begin();
  double slow_layers = double(layers[slow]);
  Breakdown& b = out.breakdown;
  b.compute = mbs * rank_time[slow];
  b.pp_bubble = bubble_time(rank_time, p.vp);

  // ---- tensor parallel (exposed: Megatron runs these on the critical path) ----
  if (p.tp > 1) {
    Group g = group_on_machine(p.tp, 1, G);
    double act = elem * tokens * m.hidden;
    double passes = p.recompute == Recompute::full ? 3 : 2;  // fwd, bwd (+ recompute fwd)
    double per_layer = p.seq_parallel
                           ? 2 * passes * (best_all_gather_time(act, g, mach) +
                                           best_reduce_scatter_time(act, g, mach))
                           : 2 * passes * best_all_reduce_time(act, g, mach);
    b.tp_comm = mbs * (slow_layers * per_layer + 2 * best_all_reduce_time(act, g, mach));
  }
  // ---- context parallel: ring exchange of K,V overlapped with the attention core ----
  if (p.cp > 1) {
    Group g = group_on_machine(p.cp, p.tp, G);
    double kv_local = double(m.kv_heads >= p.tp ? kv_dim(m) / p.tp : m.head_dim());
    double msg = elem * 2 * tokens * kv_local;
    bool same = g.per_node == g.size;
    double step = p2p_time(msg, same, mach);
    double fwd = double(p.cp - 1) * std::max(0.0, step - lt.attention_fwd / double(p.cp));
    double passes = p.recompute == Recompute::full ? 4 : 3;  // fwd, bwd = 2 sends (+ recompute)
    b.cp_comm = mbs * slow_layers * passes * fwd;
  }
  // ---- pipeline point-to-point ----
  if (p.pp > 1) {
    int64_t stride = p.tp * p.cp * p.dp;
    double msg = elem * tokens * m.hidden;
    bool same_node = stride < G;
    double t = p2p_time(msg, same_node, mach);
    // Megatron's scatter/gather optimisation (SC21 Sec. 4.1): across nodes each tp rank sends
    // 1/tp of the (replicated) activation, and the receiving node all-gathers it over NVLink.
    if (!same_node && p.tp > 1 && !p.seq_parallel)
      t = p2p_time(msg / p.tp, false, mach) +
          best_all_gather_time(msg, group_on_machine(p.tp, 1, G), mach);
    if (!same_node && p.tp > 1 && p.seq_parallel) t = p2p_time(msg / p.tp, false, mach);
    b.pp_comm = 2 * (mbs * p.vp + p.pp - 1) * t;
  }
  // ---- data parallel: gradients (and ZeRO gathers) ----
  int64_t replicas = p.dp * p.cp;
  double n_params = double(parameters_on_rank(m, p, slow));
  if (replicas > 1) {
    Group g = group_on_machine(replicas, p.tp, G);
    // Gradients are reduced in fp32 (4 bytes) whatever the training precision: Megatron-LM forces
    // --accumulate-allreduce-grads-in-fp32 for bf16 (and its main_grad buffers are fp32), FSDP's
    // mixed-precision policies in torchtitan and llm-foundry reduce in fp32; memory.cpp counts the
    // same fp32 gradients. ZeRO's parameter all-gathers move 16-bit weights.
    double grads = 4.0 * n_params;
    double weights = elem * n_params;
    double bwd_mb = slow_layers * (lt.bwd + lt.recompute);  // what the last backward overlaps
    if (p.comm.active()) {
      // [comm]: compressed reductions (plan/compression.hpp), blocking, not overlapped; ZeRO 2 runs
      // one per micro-batch; ZeRO 1 and 2 all-gather the weights as usual.
      out.compression = compression_cost(m, mach, d, p, slow, p.zero >= 1, bwd_mb);
      b.dp_comm = (p.zero == 2 ? mbs : 1.0) * out.compression->seconds() +
                  (p.zero >= 1 ? best_all_gather_time(weights, g, mach) : 0.0);
    } else if (p.zero == 0) {
      b.dp_comm = std::max(0.0, best_all_reduce_time(grads, g, mach) - bwd_mb);
    } else if (p.zero == 1) {
      // One reduce-scatter per step, overlapped with the last micro-batch's backward.
      b.dp_comm = std::max(0.0, best_reduce_scatter_time(grads, g, mach) - bwd_mb) +
                  best_all_gather_time(weights, g, mach);
    } else if (p.zero == 2) {
      // Every micro-batch's gradients are reduce-scattered (the shard is all a rank keeps), each
      // overlapped with that micro-batch's backward: m times the exposed part.
      b.dp_comm = mbs * std::max(0.0, best_reduce_scatter_time(grads, g, mach) - bwd_mb) +
                  best_all_gather_time(weights, g, mach);
    } else {
      // ZeRO-3 (DeepSpeed stage 3, FSDP): per micro-batch, every layer's parameters are
      // all-gathered before its forward, all-gathered again before its backward (which also
      // serves full recomputation: it runs right before the backward of that layer) and its
      // gradients reduce-scattered after it. Each is a ring over the replicas (NCCL runs
      // all-gather and reduce-scatter as rings only), so each pays (p-1) alpha: at dp in the
      // thousands the latency alone is milliseconds per collective, per layer, per micro-batch.
      // Prefetching (DeepSpeed's prefetch bucket, FSDP's forward/backward prefetch) overlaps the
      // next layer's gather with this layer's compute, and the previous layer's reduce-scatter with
      // this layer's backward; what it cannot hide: the first gather of each pass, the last
      // reduce-scatter, and any per-layer excess of communication over compute. The embedding and
      // head parameters are gathered like a layer (included in the per-layer share below).
      double layers_here = std::max(1.0, slow_layers);
      double ag = ring_all_gather_time(weights / layers_here, g, mach);
      double rs = ring_all_gather_time(grads / layers_here, g, mach);  // same ring pass, fp32
      double fwd_layer = lt.fwd, bwd_layer = lt.bwd + lt.recompute;
      double exposed_fwd = ag + (slow_layers - 1) * std::max(0.0, ag - fwd_layer);
      double exposed_bwd = ag + rs + (slow_layers - 1) * std::max(0.0, ag + rs - bwd_layer);
      b.dp_comm = mbs * (exposed_fwd + exposed_bwd);
    }
  }
  // ---- optimizer step: elementwise (memory bound) and matrix work (GEMM bound) of the same
  // pipeline rank as dp_comm, over the replicas as ZeRO splits it (plan/optimizer_cost.hpp) ----
  out.optimizer_step = optimizer_step_cost(m, p, d, c, slow);
  if (const KfacBytes kb = kfac_bytes(m, p, slow); kb.all_reduce > 0) {  // K-FAC's own traffic over the replicas
    const Group g = group_on_machine(replicas, p.tp, G);
    out.optimizer_step.comm_s = best_all_reduce_time(kb.all_reduce, g, mach) + p2p_time(kb.sent, g.size == g.per_node, mach);
  }
  b.optimizer = out.optimizer_step.seconds();

  out.step_time_s = b.sum();
  double step_tokens = double(p.global_batch) * double(m.seq_len);
  out.tokens_per_s = step_tokens / out.step_time_s;
  double model_flops = model_flops_per_step(m, p.global_batch);
  double hw_flops = hardware_flops_per_step(m, p.global_batch, p.recompute);
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
  int64_t nodes = (p.gpus + G - 1) / G;
  out.checkpoint_interval_s = young_daly_interval_seconds(out.checkpoint_write_s, nodes, mach);
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
  j["parameters"] = pr.parameters;
  j["micro_batches"] = p.micro_batches();
  j["bubble_fraction"] = pr.bubble_fraction;
  j["memory_most_loaded_pp_rank"] = mem.pp_rank;
  j["device_memory_gib"] = pr.device_memory_bytes / kGiB;
  j["checkpoint_write_s"] = pr.checkpoint_write_s;
  j["checkpoint_interval_s"] =
      pr.checkpoint_interval_s ? json(*pr.checkpoint_interval_s) : json(nullptr);
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
  s += fmt::format("  {:<12} {:>8.2f}\n", "device", pr.device_memory_bytes / kGiB);
  s += fmt::format("checkpoint  {:.1f} s to write", pr.checkpoint_write_s);
  if (pr.checkpoint_interval_s)
    s += fmt::format("; Young/Daly interval {:.0f} s ({:.0f} steps)", *pr.checkpoint_interval_s,
                     *pr.checkpoint_interval_s / pr.step_time_s);
  s += "\n";
  return s;
}

}  // namespace exatrain::plan
