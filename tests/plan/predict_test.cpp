// The predict JSON object follows the contract (../shared/contracts/job-file.md) and is
// self-consistent; a job file goes through the parser, the predictor and the search.
#include <array>
#include <cmath>
#include <set>

#include <gtest/gtest.h>

#include "core/check.hpp"
#include "job/model_shapes.hpp"
#include "job/parse.hpp"
#include "plan/comm.hpp"
#include "plan/compute.hpp"
#include "plan/io.hpp"
#include "plan/memory.hpp"
#include "plan/predict.hpp"
#include "plan/search.hpp"

using namespace exatrain;
using namespace exatrain::plan;

namespace {
const char* kJob = R"(
[model]
preset = "gpt3-175b"
[machine]
preset = "selene"
[parallel]
gpus = 64
tp = 8
pp = 8
dp = 1
vp = 3
zero = 1
micro_batch = 1
global_batch = 64
recompute = "selective"
seq_parallel = true
[train]
precision = "bf16"
)";
}  // namespace

TEST(Predict, JsonHasTheContractKeysAndAddsUp) {
  Job job = parse_job(kJob, "job.toml");
  Prediction pr = predict(job.model, job.machine, resolve_plan(job.parallel, job.train.precision));
  nlohmann::json j = to_json(pr);
  for (const char* k : {"step_time_s", "tokens_per_s", "model_tflops_per_gpu",
                        "hardware_tflops_per_gpu", "mfu", "hfu", "memory_gib_per_gpu", "fits",
                        "breakdown_s", "plan"})
    EXPECT_TRUE(j.contains(k)) << k;
  std::set<std::string> mem_keys, bd_keys, plan_keys;
  for (auto& [k, v] : j["memory_gib_per_gpu"].items()) mem_keys.insert(k);
  for (auto& [k, v] : j["breakdown_s"].items()) bd_keys.insert(k);
  for (auto& [k, v] : j["plan"].items()) plan_keys.insert(k);
  EXPECT_EQ(mem_keys, (std::set<std::string>{"params", "grads", "optimizer", "activations", "buffers", "total"}));
  EXPECT_EQ(bd_keys, (std::set<std::string>{"compute", "tp_comm", "cp_comm", "pp_comm", "pp_bubble",
                                            "dp_comm", "optimizer", "other"}));
  EXPECT_EQ(plan_keys, (std::set<std::string>{"gpus", "tp", "pp", "dp", "cp", "vp", "zero", "micro_batch",
                                              "global_batch", "recompute", "seq_parallel", "schedule"}));
  double sum = 0;
  for (auto& [k, v] : j["breakdown_s"].items()) sum += v.get<double>();
  EXPECT_NEAR(sum, j["step_time_s"].get<double>(), 1e-9 * sum);
  double mem = 0;
  for (auto& [k, v] : j["memory_gib_per_gpu"].items())
    if (k != "total") mem += v.get<double>();
  EXPECT_NEAR(mem, j["memory_gib_per_gpu"]["total"].get<double>(), 1e-9 * mem);
  EXPECT_EQ(j["plan"]["recompute"], "selective");
  EXPECT_EQ(j["plan"]["schedule"], "1f1b");
  // MFU / HFU relation: hardware FLOPs add the selective recomputation's attention core.
  EXPECT_GT(pr.hfu, pr.mfu);
  EXPECT_NEAR(pr.mfu, pr.model_tflops_per_gpu / 312.0, 1e-12);
  // Korthikanti et al. Table 5 measured 13.75 s for this exact run; the model is within 10%.
  EXPECT_NEAR(pr.step_time_s / 13.75, 1.0, 0.10);
  EXPECT_TRUE(pr.fits);
}

TEST(Predict, AutoFieldIsRejectedWithItsName) {
  Job job = parse_job(kJob, "job.toml", {"parallel.tp=auto"});
  try {
    resolve_plan(job.parallel, job.train.precision);
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[parallel] tp is auto"), std::string::npos) << e.what();
  }
}

TEST(Predict, SearchFillsAutoFieldsAndBestIsFirst) {
  // 128 GPUs: on 64 A100-80GB 175B with ZeRO 1 fits only at dp 1 and at the memory limit, where a
  // change of the fitted `fragmentation_at_capacity` decides how many plans are left.
  Job job = parse_job(kJob, "job.toml", {"parallel.tp=auto", "parallel.pp=auto", "parallel.dp=auto",
                                          "parallel.vp=auto", "parallel.micro_batch=auto", "parallel.gpus=128",
                                          "parallel.global_batch=128"});
  SearchResult r = search_plans(job.model, job.machine, job.parallel, job.train.precision, 3);
  ASSERT_EQ(r.top.size(), 3u);
  EXPECT_LE(r.top[0].step_time_s, r.top[1].step_time_s);
  EXPECT_LE(r.top[1].step_time_s, r.top[2].step_time_s);
  for (const auto& c : r.top) {
    EXPECT_EQ(c.plan.zero, 1);  // fixed in the file
    EXPECT_EQ(c.plan.tp * c.plan.pp * c.plan.dp * c.plan.cp, 128);
  }
  std::string why = explain_choice(r.top[0], r.top[1]);
  EXPECT_NE(why.find("faster"), std::string::npos) << why;
}

TEST(Io, YoungDalyInterval) {
  MachineSpec mach;
  mach.storage_bw_gbs = 1000;
  EXPECT_DOUBLE_EQ(checkpoint_write_seconds(1e9, Precision::bf16, mach), 14e9 / 1e12);
  EXPECT_FALSE(young_daly_interval_seconds(10, 100, mach).has_value());
  mach.node_mtbf_hours = 10000;
  // sqrt(2 * C * M), M = 10000 h / 100 nodes = 360000 s.
  EXPECT_DOUBLE_EQ(*young_daly_interval_seconds(10, 100, mach), std::sqrt(2.0 * 10 * 360000));
}

TEST(Predict, DefaultDpMustBeAnInteger) {
  Job job = parse_job(kJob, "job.toml", {"parallel.tp=3", "parallel.dp=auto"});
  try {
    resolve_plan(job.parallel, job.train.precision);
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("gpus / (tp * pp * cp) = 64 / (3 * 8 * 1)"), std::string::npos)
        << e.what();
  }
}

TEST(Predict, ZeroThreePaysPerLayerRingLatency) {
  // 175B, tp 8, dp 512 on Selene, ZeRO-3: per micro-batch every layer is gathered twice and its
  // gradients reduce-scattered, each a ring of dp ranks paying (dp-1) alpha; at least the first
  // gathers and the last reduce-scatter of each micro-batch are exposed.
  Job job = parse_job(kJob, "job.toml",
                      {"parallel.gpus=4096", "parallel.pp=1", "parallel.vp=1", "parallel.dp=512",
                       "parallel.zero=3", "parallel.global_batch=1024"});
  Plan p = resolve_plan(job.parallel, job.train.precision);
  Prediction z3 = predict(job.model, job.machine, p);
  Group g = group_on_machine(512, 8, 8);
  double layer_bytes = 2.0 * double(parameters_on_rank(job.model, p, 0)) / 96;
  double ag = ring_all_gather_time(layer_bytes, g, job.machine);
  EXPECT_GE(ag, 511 * job.machine.inter_node_latency_us * 1e-6);
  EXPECT_GE(z3.breakdown.dp_comm, p.micro_batches() * 3 * ag * (1 - 1e-12));
  // The same plan with ZeRO-1 communicates once per step, not per micro-batch and layer.
  p.zero = 1;
  EXPECT_LT(predict(job.model, job.machine, p).breakdown.dp_comm, z3.breakdown.dp_comm);
}

TEST(Predict, FsdpUnderPipeliningGathersOncePerStep) {
  // Plan::fsdp_unsharded_in_pipeline (FSDP2 under torch.distributed.pipelining): the units stay
  // gathered and the gradients unsharded for the step, so each layer is gathered once (first
  // forward) and reduce-scattered once (after the last backward), not per micro-batch.
  Job job = parse_job(kJob, "job.toml",
                      {"parallel.gpus=4096", "parallel.pp=8", "parallel.vp=1", "parallel.dp=64",
                       "parallel.zero=3", "parallel.global_batch=1024"});
  Plan p = resolve_plan(job.parallel, job.train.precision);
  ASSERT_EQ(p.micro_batches(), 16);
  const double per_micro_batch = predict(job.model, job.machine, p).breakdown.dp_comm;
  p.fsdp_unsharded_in_pipeline = true;
  const double once = predict(job.model, job.machine, p).breakdown.dp_comm;
  const Group g = group_on_machine(64, 8, 8);
  const double layers = double(layers_on_rank(job.model, p, 0));
  const double n = double(parameters_on_rank(job.model, p, 0));
  const double ag = ring_all_gather_time(2 * n / layers, g, job.machine);
  const double rs = ring_all_gather_time(4 * n / layers, g, job.machine);
  // Every reduce-scatter runs after the last backward (exposed); of the gathers at least the first.
  EXPECT_GE(once, (ag + layers * rs) * (1 - 1e-12));
  EXPECT_LE(once, layers * (ag + rs) * (1 + 1e-12));
  EXPECT_LT(once, per_micro_batch / 8);
}

TEST(Predict, ZeroBandwidthIsRejectedWithTheKey) {
  Job job = parse_job(kJob, "job.toml");
  Plan p = resolve_plan(job.parallel, job.train.precision);
  job.machine.inter_node_bw_gbs = 0;
  try {
    check_machine_for_plan(job.machine, p, "job.toml");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("job.toml: machine.inter_node_bw_gbs = 0"), std::string::npos)
        << e.what();
  }
  job.machine.inter_node_bw_gbs = 200;
  job.machine.intra_node_bw_gbs = 0;
  EXPECT_THROW(check_machine_for_plan(job.machine, p, "job.toml"), Error);
  Plan single = p;
  single.gpus = 1;  // one device: no bandwidth needed
  EXPECT_NO_THROW(check_machine_for_plan(job.machine, single, "job.toml"));
}

TEST(Predict, ZeroTwoPaysTheExposedReduceScatterPerMicroBatch) {
  // 175B, tp 8 x dp 8, 8 micro-batches: ZeRO 2 reduce-scatters every micro-batch's gradients (each
  // overlapped with that micro-batch's backward), ZeRO 1 once per step; the all-gather is the same.
  Job job = parse_job(kJob, "job.toml", {"parallel.pp=1", "parallel.vp=1", "parallel.dp=8"});
  Plan p = resolve_plan(job.parallel, job.train.precision);
  ASSERT_GT(p.micro_batches(), 1);
  ASSERT_GT(p.dp, 1);
  const double z1 = predict(job.model, job.machine, p).breakdown.dp_comm;
  p.zero = 2;
  const double z2 = predict(job.model, job.machine, p).breakdown.dp_comm;
  // The all-gather of fp16 weights: the same in both; the rest is the exposed reduce-scatter.
  const Group g = group_on_machine(p.dp * p.cp, p.tp, job.machine.gpus_per_node);
  const double ag = best_all_gather_time(2.0 * double(parameters_on_rank(job.model, p, 0)), g, job.machine);
  ASSERT_GT(z1 - ag, 0) << "the test needs an exposed reduce-scatter";
  EXPECT_NEAR(z2 - ag, double(p.micro_batches()) * (z1 - ag), 1e-9 * z2);
}

TEST(Predict, DeviceConstantsOfACalibration) {
  // A calibration's device constants (plan::Calibration::devices, by device or family) move only
  // that device's prediction: sustained scales its compute, network its collectives.
  Job job = parse_job(kJob, "job.toml");
  const Plan p = resolve_plan(job.parallel, job.train.precision);
  const Prediction base = predict(job.model, job.machine, p);
  Calibration slower = default_calibration();
  slower.set("a100.sustained=" + std::to_string(find_device("a100-80g").sustained / 2));
  const Prediction half = predict(job.model, job.machine, p, slower);
  EXPECT_GT(half.breakdown.compute, 1.8 * base.breakdown.compute);  // element-wise work does not slow down
  EXPECT_LT(half.breakdown.compute, 2.0 * base.breakdown.compute + 1e-12);
  EXPECT_DOUBLE_EQ(half.breakdown.tp_comm, base.breakdown.tp_comm);
  Calibration net = default_calibration();
  net.set("a100-80g.network=0.5");
  const Prediction slow_net = predict(job.model, job.machine, p, net);
  EXPECT_DOUBLE_EQ(slow_net.breakdown.compute, base.breakdown.compute);
  EXPECT_GT(slow_net.breakdown.tp_comm, 1.5 * base.breakdown.tp_comm);
  // attention scales the fused attention kernel's rate and nothing else: 0.5 doubles the
  // attention core's time (the job's default attention is FlashAttention-2), and, being a
  // multiplier like network, it may exceed 1.
  Calibration att = default_calibration();
  att.set("a100-80g.attention=0.5");
  const Prediction slow_att = predict(job.model, job.machine, p, att);
  ASSERT_GT(base.compute_parts.attention, 0);
  EXPECT_NEAR(slow_att.compute_parts.attention, 2 * base.compute_parts.attention, 1e-9 * base.compute_parts.attention);
  EXPECT_DOUBLE_EQ(slow_att.compute_parts.linear, base.compute_parts.linear);
  EXPECT_DOUBLE_EQ(slow_att.breakdown.tp_comm, base.breakdown.tp_comm);
  // A device's entry wins over its family's, applied once: 0.25 is 4 times the time.
  Calibration both = default_calibration();
  both.set("a100.attention=0.5");
  both.set("a100-80g.attention=0.25");
  EXPECT_NEAR(predict(job.model, job.machine, p, both).compute_parts.attention, 4 * base.compute_parts.attention,
              1e-9 * base.compute_parts.attention);
  // The scaled efficiency stops at the peak: a multiplier of 4 on FlashAttention-2's 0.6 gives 1.
  const double eff = *find_device("a100-80g").flash2_efficiency;
  ASSERT_GT(4 * eff, 1.0);
  Calibration fast = default_calibration();
  fast.set("a100-80g.attention=4");
  EXPECT_NEAR(predict(job.model, job.machine, p, fast).compute_parts.attention, eff * base.compute_parts.attention,
              1e-9 * base.compute_parts.attention);
  EXPECT_NO_THROW(att.set("a100-80g.attention=1.5"));
  EXPECT_DOUBLE_EQ(att.get("a100-80g.attention"), 1.5);
  EXPECT_DOUBLE_EQ(default_calibration().get("a100-80g.attention"), 1.0);
  // Another device's constants change nothing here.
  Calibration other = default_calibration();
  other.set("hopper.sustained=0.1");
  EXPECT_DOUBLE_EQ(predict(job.model, job.machine, p, other).step_time_s, base.step_time_s);
  // Names are checked: an unknown constant, device or a fraction above 1 is refused.
  Calibration c;
  EXPECT_THROW(c.set("a100.speed=0.5"), Error);
  EXPECT_THROW(c.set("b200.sustained=0.5"), Error);
  EXPECT_THROW(c.set("a100.sustained=1.5"), Error);
  EXPECT_THROW(c.set("fp8_relative=abc"), Error);
}

TEST(Predict, FrameworkOverlapsHideCommunication) {
  // [parallel] overlap_grad_reduce hides the gradient reduction under the last backward; without
  // it the whole reduction is exposed. tp_comm_overlap hides the sequence-parallel collectives
  // under the GEMMs, down to the first chunk of each.
  Job job = parse_job(kJob, "job.toml", {"parallel.pp=1", "parallel.vp=1", "parallel.dp=8", "parallel.zero=0",
                                         "parallel.global_batch=64"});
  Plan p = resolve_plan(job);
  p.overlap_grad_reduce = true;
  const double hidden = predict(job.model, job.machine, p).breakdown.dp_comm;
  p.overlap_grad_reduce = false;
  const double exposed = predict(job.model, job.machine, p).breakdown.dp_comm;
  EXPECT_GT(exposed, 0);
  EXPECT_LT(hidden, exposed);
  const Group g = group_on_machine(8, 8, job.machine.gpus_per_node);
  EXPECT_NEAR(exposed, best_all_reduce_time(4.0 * double(parameters_on_rank(job.model, p, 0)), g, job.machine),
              1e-9 * exposed);
  p.tp_comm_overlap = TpCommOverlap::none;
  const double tp_exposed = predict(job.model, job.machine, p).breakdown.tp_comm;
  p.tp_comm_overlap = TpCommOverlap::all;
  const double tp_hidden = predict(job.model, job.machine, p).breakdown.tp_comm;
  EXPECT_LT(tp_hidden, 0.5 * tp_exposed);
  EXPECT_GT(tp_hidden, tp_exposed / double(p.tp) / 4);  // the first chunks stay exposed
  // PyTorch's async TP ("forward") hides the forward passes' collectives only. Every pass has the
  // same collectives, each hidden down to its first chunks (kJob's GEMMs outlast them), so the
  // forward-only overlap saves 1/2 of what every pass's saves with one forward (selective
  // recomputation repeats no collective) and 2/3 with two (full recomputation's second forward);
  // hiding the backward's instead would save 1/2 and 1/3. The embedding's and the head's
  // all-reduces, which no overlap hides, cancel.
  for (const auto& [recompute, share] : {std::pair{Recompute::selective, 0.5}, std::pair{Recompute::full, 2.0 / 3}}) {
    p.recompute = recompute;
    auto tp_time = [&](TpCommOverlap o) {
      p.tp_comm_overlap = o;
      return predict(job.model, job.machine, p).breakdown.tp_comm;
    };
    const double none = tp_time(TpCommOverlap::none), all = tp_time(TpCommOverlap::all);
    const double forward = tp_time(TpCommOverlap::forward);
    EXPECT_NEAR(none - forward, share * (none - all), 1e-9 * none) << to_string(recompute);
    EXPECT_LT(all, forward);
    EXPECT_LT(forward, none);
  }
}

// The chunked overlap of tp_comm_overlap as a pipeline of tp steps: communication chunk i + 1 moves
// while GEMM chunk i runs, and GEMM chunk i waits for communication chunk i (an all-gather feeding
// its GEMM; a reduce-scatter draining one is the same pipeline reversed). What shows beyond the GEMM.
namespace {
double chunked_exposed(double comm, double gemm, int tp) {
  double comm_done = 0, gemm_done = 0;
  for (int i = 0; i < tp; ++i) {
    comm_done += comm / tp;
    gemm_done = std::max(gemm_done, comm_done) + gemm / tp;
  }
  return gemm_done - gemm;
}
}  // namespace

TEST(Predict, OverlappedTpCollectivesShowWhatTheChunkedPipelineShows) {
  // predict's closed form for a collective run in tp chunks under its GEMM, against the pipeline
  // itself, where the GEMMs outlast the collectives (kJob) and where they do not (a 20 GB/s node
  // link): the pass's two all-gathers and two reduce-scatters under its linear GEMMs, forward and
  // backward (selective recomputation re-runs none).
  for (const auto& [bw, collective_outlasts_gemm] :
       {std::pair{"machine.intra_node_bw_gbs=300", false}, std::pair{"machine.intra_node_bw_gbs=20", true}}) {
    Job job = parse_job(kJob, "job.toml", {bw, "parallel.recompute=selective", "parallel.tp_comm_overlap=true"});
    Plan p = resolve_plan(job);
    ASSERT_TRUE(p.seq_parallel && p.tp > 1);
    const Calibration& cal = default_calibration();
    const LayerTime lt = layer_time(job.model, p, cal.tuned(find_device(job.machine.device)), cal);
    const double bytes = double(p.tp_element_bytes()) * double(p.micro_batch * job.model.seq_len * job.model.hidden);
    const Group g = group_on_machine(p.tp, 1, job.machine.gpus_per_node);
    const double pass = 2 * (best_all_gather_time(bytes, g, job.machine) + best_reduce_scatter_time(bytes, g, job.machine));
    const int q = int(p.tp);
    const double saved_per_layer = 2 * pass - chunked_exposed(pass, lt.linear_fwd, q) - chunked_exposed(pass, lt.linear_bwd, q);
    const double with = predict(job.model, job.machine, p).breakdown.tp_comm;
    p.tp_comm_overlap = TpCommOverlap::none;
    const double without = predict(job.model, job.machine, p).breakdown.tp_comm;
    const double per = double(p.micro_batches()) * double(layers_on_rank(job.model, p, 0));
    EXPECT_NEAR(without - with, per * saved_per_layer, 1e-9 * without) << bw;
    // Both branches of the formula are covered: which one each link takes.
    EXPECT_EQ(pass > lt.linear_fwd && pass > lt.linear_bwd, collective_outlasts_gemm) << bw;
    EXPECT_EQ(pass < lt.linear_fwd && pass < lt.linear_bwd, !collective_outlasts_gemm) << bw;
  }
}

TEST(Predict, SeqParallelAtTpOneIsANoOpWithANote) {
  // Megatron and NeMo accept sequence_parallel = true at tp = 1 and turn it off: so does the
  // planner, and says so; other settings without effect likewise.
  Job job = parse_job(kJob, "job.toml", {"parallel.tp=1", "parallel.pp=1", "parallel.vp=1", "parallel.dp=64",
                                         "parallel.seq_parallel=true", "parallel.tp_comm_overlap=true",
                                         "model.preset=gpt3-1.3b"});
  const Plan p = resolve_plan(job);
  EXPECT_FALSE(p.seq_parallel);
  EXPECT_EQ(p.tp_comm_overlap, TpCommOverlap::none);
  EXPECT_EQ(plan_error(job.model, p), "");
  const std::vector<std::string> notes = plan_notes(job, p);
  ASSERT_EQ(notes.size(), 2u);
  EXPECT_NE(notes[0].find("seq_parallel = true has no effect at tp = 1"), std::string::npos) << notes[0];
  EXPECT_NE(notes[1].find("tp_comm_overlap = true has no effect at tp = 1"), std::string::npos) << notes[1];
  // The same plan with seq_parallel = false predicts the same.
  Job plain = parse_job(kJob, "job.toml", {"parallel.tp=1", "parallel.pp=1", "parallel.vp=1", "parallel.dp=64",
                                           "parallel.seq_parallel=false", "model.preset=gpt3-1.3b"});
  EXPECT_DOUBLE_EQ(predict(job.model, job.machine, p).step_time_s,
                   predict(plain.model, plain.machine, resolve_plan(plain)).step_time_s);
  EXPECT_TRUE(plan_notes(plain, resolve_plan(plain)).empty());
}

namespace {
// plan_notes' lines that name `key` (kJob's zero = 1 at dp = 1 has a note of its own).
std::vector<std::string> notes_naming(const Job& j, const std::string& key) {
  std::vector<std::string> out;
  for (const std::string& n : plan_notes(j, resolve_plan(j)))
    if (n.find(key) != std::string::npos) out.push_back(n);
  return out;
}

// [train] `key` = "fp32" gets one note where it has no effect: with the overrides `one` (its
// parallel degree at 1; the note says "at `why`") and at precision = "fp32"; none where it acts,
// none when the key is unset.
void expect_notes_where_it_has_no_effect(const std::string& key, std::vector<std::string> one, const std::string& why) {
  const std::string set = "train." + key + "=fp32";
  EXPECT_TRUE(notes_naming(parse_job(kJob, "job.toml", {set}), key).empty()) << key;
  one.push_back(set);
  std::vector<std::string> notes = notes_naming(parse_job(kJob, "job.toml", one), key);
  ASSERT_EQ(notes.size(), 1u) << key;
  EXPECT_NE(notes[0].find(key + " = \"fp32\" has no effect at " + why), std::string::npos) << notes[0];
  notes = notes_naming(parse_job(kJob, "job.toml", {set, "train.precision=fp32"}), key);
  ASSERT_EQ(notes.size(), 1u) << key;
  EXPECT_NE(notes[0].find("has no effect at precision = \"fp32\""), std::string::npos) << notes[0];
  EXPECT_TRUE(notes_naming(parse_job(kJob, "job.toml", {"train.precision=fp32"}), key).empty()) << key;
}
}  // namespace

// [train] pipeline_dtype = "fp32" doubles the pipeline messages of a bf16 plan: predict's p2p time
// grows, nothing else moves; the default follows the compute dtype.
TEST(Predict, PipelineDtypeFp32SendsTheStageMessagesInFourBytes) {
  Job job = parse_job(kJob, "job.toml");
  const Prediction p16 = predict(job.model, job.machine, resolve_plan(job));
  Job f32 = parse_job(kJob, "job.toml", {"train.pipeline_dtype=fp32"});
  const Plan p32 = resolve_plan(f32);
  EXPECT_TRUE(p32.pipeline_fp32);
  const Prediction w = predict(f32.model, f32.machine, p32);
  EXPECT_GT(w.breakdown.pp_comm, 1.5 * p16.breakdown.pp_comm);
  EXPECT_DOUBLE_EQ(w.breakdown.compute, p16.breakdown.compute);
  EXPECT_DOUBLE_EQ(w.breakdown.dp_comm, p16.breakdown.dp_comm);
  expect_notes_where_it_has_no_effect("pipeline_dtype", {"parallel.pp=1", "parallel.vp=1", "parallel.dp=8"}, "pp = 1");
}

// [train] tp_comm_dtype = "fp32" doubles the tensor-parallel messages of a bf16 plan: predict's
// tp time grows, nothing else moves.
TEST(Predict, TpCommDtypeFp32SendsTheRegionsMessagesInFourBytes) {
  Job job = parse_job(kJob, "job.toml", {"parallel.tp_comm_overlap=false"});
  const Prediction p16 = predict(job.model, job.machine, resolve_plan(job));
  Job f32 = parse_job(kJob, "job.toml", {"parallel.tp_comm_overlap=false", "train.tp_comm_dtype=fp32"});
  const Plan p32 = resolve_plan(f32);
  EXPECT_TRUE(p32.tp_comm_fp32);
  const Prediction w = predict(f32.model, f32.machine, p32);
  EXPECT_GT(w.breakdown.tp_comm, 1.5 * p16.breakdown.tp_comm);
  EXPECT_DOUBLE_EQ(w.breakdown.pp_comm, p16.breakdown.pp_comm);
  EXPECT_DOUBLE_EQ(w.breakdown.compute, p16.breakdown.compute);
  expect_notes_where_it_has_no_effect("tp_comm_dtype", {"parallel.tp=1", "parallel.dp=8", "parallel.seq_parallel=false"},
                                      "tp = 1");
}

// [train] residual_dtype = "fp32" keeps a bf16 plan's residual stream in 4 bytes: the activations
// grow; the time does not move (the time model does not count the residual adds' and norms' wider
// element-wise traffic: a known omission, docs/precision.md); at precision = "fp32" it has no
// effect and a note says so (there is no parallel degree at which it stops acting).
TEST(Predict, ResidualDtypeFp32CountsTheResidualStreamInFourBytes) {
  Job job = parse_job(kJob, "job.toml");
  const Prediction p16 = predict(job.model, job.machine, resolve_plan(job));
  Job f32 = parse_job(kJob, "job.toml", {"train.residual_dtype=fp32"});
  const Plan p32 = resolve_plan(f32);
  EXPECT_TRUE(p32.residual_fp32);
  const Prediction w = predict(f32.model, f32.machine, p32);
  EXPECT_GT(w.memory.activations, p16.memory.activations);
  EXPECT_DOUBLE_EQ(w.step_time_s, p16.step_time_s);
  // kJob has pp 8: without pipeline_dtype = "fp32" the stage boundaries still round (a note says
  // so); with it, Megatron's --fp32-residual-connection whole, no note.
  std::vector<std::string> half = notes_naming(f32, "residual_dtype");
  ASSERT_EQ(half.size(), 1u);
  EXPECT_NE(half[0].find("rounded to 16 bits at each stage boundary"), std::string::npos) << half[0];
  EXPECT_TRUE(notes_naming(parse_job(kJob, "job.toml", {"train.residual_dtype=fp32", "train.pipeline_dtype=fp32"}),
                           "residual_dtype").empty());
  const Job at_fp32 = parse_job(kJob, "job.toml", {"train.residual_dtype=fp32", "train.precision=fp32"});
  const std::vector<std::string> notes = notes_naming(at_fp32, "residual_dtype");
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_NE(notes[0].find("residual_dtype = \"fp32\" has no effect at precision = \"fp32\""), std::string::npos)
      << notes[0];
}

TEST(Predict, RecomputeEarlyStopSkipsTheLastLinearAndItsCollectiveInTheRecompute) {
  // [parallel] recompute_early_stop (PyTorch's non-reentrant checkpoint): full recomputation leaves
  // out each layer's down projection (compute.cpp) and the tensor-parallel collective after it:
  // with sequence parallelism one reduce-scatter per layer and micro-batch (kJob: tp 8, sp), so the
  // bytes a rank sends fall by exactly that and the step by at least the GEMMs' time; HFU counts
  // the down projections' FLOPs as not executed.
  Job whole = parse_job(kJob, "job.toml", {"parallel.recompute=full"});
  Job early = parse_job(kJob, "job.toml", {"parallel.recompute=full", "parallel.recompute_early_stop=true"});
  const Plan pw = resolve_plan(whole), pe = resolve_plan(early);
  ASSERT_TRUE(pe.recompute_early_stop);
  ASSERT_TRUE(pe.seq_parallel);
  // The plan's one-line summary (plan, validate --rows) says so.
  EXPECT_NE(plan_summary(pe).find(" recompute=full+early-stop sp=yes "), std::string::npos) << plan_summary(pe);
  EXPECT_NE(plan_summary(pw).find(" recompute=full sp=yes "), std::string::npos) << plan_summary(pw);
  const Prediction w = predict(whole.model, whole.machine, pw), e = predict(early.model, early.machine, pe);
  EXPECT_LT(e.breakdown.compute, w.breakdown.compute);
  EXPECT_EQ(e.breakdown.pp_comm, w.breakdown.pp_comm);
  const CommBytes bw = bytes_sent_per_step(whole.model, pw, {0, 0, 0}), be = bytes_sent_per_step(early.model, pe, {0, 0, 0});
  const double act = double(pw.micro_batch * whole.model.seq_len * whole.model.hidden);
  const double one_rs = ring_reduce_scatter_sent(int64_t(act), pw.tp, 0) * double(pw.tp_element_bytes());
  const double layers = double(layers_on_rank(whole.model, pw, 0));
  EXPECT_DOUBLE_EQ(bw[CommKind::tp_reduce_scatter] - be[CommKind::tp_reduce_scatter],
                   double(pw.micro_batches()) * layers * one_rs);
  EXPECT_EQ(bw[CommKind::tp_all_gather], be[CommKind::tp_all_gather]);
  // Without sequence parallelism the collective left out is the MLP's all-reduce; with the
  // collectives exposed the time falls by one such collective per layer and micro-batch, and with
  // them overlapped (every pass, or the forward passes only: the recompute is one) it falls too.
  for (const char* sp : {"parallel.seq_parallel=true", "parallel.seq_parallel=false"}) {
    Job jw = parse_job(kJob, "job.toml", {"parallel.recompute=full", sp});
    Job je = parse_job(kJob, "job.toml", {"parallel.recompute=full", sp, "parallel.recompute_early_stop=true"});
    const Plan qw = resolve_plan(jw), qe = resolve_plan(je);
    const bool seq = qw.seq_parallel;
    const Group g = group_on_machine(qw.tp, 1, jw.machine.gpus_per_node);
    const double bytes = double(qw.tp_element_bytes()) * act;
    const double last = seq ? best_reduce_scatter_time(bytes, g, jw.machine) : best_all_reduce_time(bytes, g, jw.machine);
    EXPECT_NEAR(predict(jw.model, jw.machine, qw).breakdown.tp_comm - predict(je.model, je.machine, qe).breakdown.tp_comm,
                double(qw.micro_batches()) * layers * last, 1e-12) << sp;
    const CommBytes cw = bytes_sent_per_step(jw.model, qw, {0, 0, 0}), ce = bytes_sent_per_step(je.model, qe, {0, 0, 0});
    const CommKind kind = seq ? CommKind::tp_reduce_scatter : CommKind::tp_all_reduce;
    const double one = double(seq ? ring_reduce_scatter_sent(int64_t(act), qw.tp, 0) : ring_all_reduce_sent(int64_t(act), qw.tp, 0));
    EXPECT_DOUBLE_EQ(cw[kind] - ce[kind], double(qw.micro_batches()) * layers * one * double(qw.tp_element_bytes())) << sp;
  }
  for (const char* overlap : {"parallel.tp_comm_overlap=true", "parallel.tp_comm_overlap=forward"}) {
    Job jw = parse_job(kJob, "job.toml", {"parallel.recompute=full", overlap});
    Job je = parse_job(kJob, "job.toml", {"parallel.recompute=full", overlap, "parallel.recompute_early_stop=true"});
    EXPECT_LT(predict(je.model, je.machine, resolve_plan(je)).breakdown.tp_comm,
              predict(jw.model, jw.machine, resolve_plan(jw)).breakdown.tp_comm) << overlap;
  }
  const double skipped = double(pw.global_batch) * whole.model.seq_len * whole.model.layers * 2.0 *
                         whole.model.hidden * whole.model.ffn_hidden;
  EXPECT_NEAR(w.hardware_tflops_per_gpu * w.step_time_s - e.hardware_tflops_per_gpu * e.step_time_s,
              skipped / pw.gpus / 1e12, 1e-9 * skipped / pw.gpus / 1e12);
  // Set without full recomputation it changes nothing, and a note says so.
  Job none = parse_job(kJob, "job.toml", {"parallel.recompute_early_stop=true"});
  const Plan pn = resolve_plan(none);
  ASSERT_NE(pn.recompute, Recompute::full);
  EXPECT_DOUBLE_EQ(predict(none.model, none.machine, pn).step_time_s,
                   predict(none.model, none.machine, resolve_plan(parse_job(kJob, "job.toml"))).step_time_s);
  const std::vector<std::string> notes = notes_naming(none, "recompute_early_stop");
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_NE(notes[0].find("recompute_early_stop = true has no effect at recompute = "), std::string::npos) << notes[0];
}

TEST(Predict, OpRecomputeRerunsTheAllGathersItDoesNotSave) {
  // torchtitan's op-level checkpointing saves reduce-scatter outputs, not all-gather outputs: its
  // recompute re-runs a layer's two sequence-parallel all-gathers (their outputs are the inputs the
  // saved matmuls' backward needs), and without sequence parallelism the attention's all-reduce.
  // Against recompute = "none" (which runs the same GEMMs' collectives once each way), exactly that
  // much more is sent and, exposed, that much more time is spent.
  for (const char* sp : {"parallel.seq_parallel=true", "parallel.seq_parallel=false"}) {
    Job jn = parse_job(kJob, "job.toml", {"parallel.recompute=none", sp});
    Job jo = parse_job(kJob, "job.toml", {"parallel.recompute=op", sp});
    const Plan pn = resolve_plan(jn), po = resolve_plan(jo);
    ASSERT_GT(pn.tp, 1);
    ASSERT_EQ(po.tp_comm_overlap, TpCommOverlap::none);
    const bool seq = pn.seq_parallel;
    const double act = double(pn.micro_batch * jn.model.seq_len * jn.model.hidden);
    const double layers = double(layers_on_rank(jn.model, pn, 0)), mbs = double(pn.micro_batches());
    const Group g = group_on_machine(pn.tp, 1, jn.machine.gpus_per_node);
    const double bytes = double(pn.tp_element_bytes()) * act;
    const double again = seq ? 2 * best_all_gather_time(bytes, g, jn.machine) : best_all_reduce_time(bytes, g, jn.machine);
    EXPECT_NEAR(predict(jo.model, jo.machine, po).breakdown.tp_comm - predict(jn.model, jn.machine, pn).breakdown.tp_comm,
                mbs * layers * again, 1e-12) << sp;
    const CommBytes cn = bytes_sent_per_step(jn.model, pn, {0, 0, 0}), co = bytes_sent_per_step(jo.model, po, {0, 0, 0});
    const CommKind kind = seq ? CommKind::tp_all_gather : CommKind::tp_all_reduce;
    const double one = double(seq ? 2 * ring_all_gather_sent(int64_t(act), pn.tp, 0) : ring_all_reduce_sent(int64_t(act), pn.tp, 0));
    EXPECT_DOUBLE_EQ(co[kind] - cn[kind], mbs * layers * one * double(pn.tp_element_bytes())) << sp;
    if (seq) EXPECT_EQ(co[CommKind::tp_reduce_scatter], cn[CommKind::tp_reduce_scatter]);  // saved, not re-run
  }
  // With tp_comm_overlap each re-run all-gather hides under the recomputed GEMM that consumes it
  // (compute.hpp LayerTime::op_gather_consumers), as the chunked pipeline shows: GPT-3's GELU layers
  // recompute o and fc2, which read no gathered input (both run whole); a SwiGLU layer's k and up
  // hide them down to their first chunks; with 8 kv heads (k 128 columns a rank) on a slow node
  // link, k is shorter than one chunk and hides little of its all-gather.
  const Calibration& cal = default_calibration();
  for (const char* overlap : {"parallel.tp_comm_overlap=true", "parallel.tp_comm_overlap=forward"}) {
    for (int variant = 0; variant < 3; ++variant) {
      std::vector<std::string> set = {overlap, variant == 0 ? "model.activation=gelu" : "model.activation=swiglu"};
      if (variant == 2) set.insert(set.end(), {"model.kv_heads=8", "machine.intra_node_bw_gbs=10"});
      set.push_back("parallel.recompute=none");
      Job jn = parse_job(kJob, "job.toml", set);
      set.back() = "parallel.recompute=op";
      Job jo = parse_job(kJob, "job.toml", set);
      const Plan pn = resolve_plan(jn), po = resolve_plan(jo);
      ASSERT_GT(pn.tp, 1);
      ASSERT_NE(po.tp_comm_overlap, TpCommOverlap::none);
      const double act = double(pn.micro_batch * jn.model.seq_len * jn.model.hidden);
      const double per = double(pn.micro_batches()) * double(layers_on_rank(jn.model, pn, 0));
      const double ag = best_all_gather_time(double(pn.tp_element_bytes()) * act,
                                             group_on_machine(pn.tp, 1, jn.machine.gpus_per_node), jn.machine);
      const std::array<double, 2> g = layer_time(jo.model, po, cal.tuned(find_device(jo.machine.device)), cal).op_gather_consumers;
      const double q = double(pn.tp);
      if (variant == 0) EXPECT_EQ(g[0] + g[1], 0);
      if (variant == 1) EXPECT_TRUE(g[0] >= ag && g[1] >= ag) << g[0] << " " << g[1] << " " << ag;   // both hide
      if (variant == 2) EXPECT_LT(g[0], ag / q) << g[0] << " " << ag;  // k shorter than one chunk
      double expect = 0;
      for (double gemm : g) expect += chunked_exposed(ag, gemm, int(q));
      const double diff = predict(jo.model, jo.machine, po).breakdown.tp_comm - predict(jn.model, jn.machine, pn).breakdown.tp_comm;
      EXPECT_NEAR(diff, per * expect, 1e-9 * per * expect) << overlap << " variant " << variant;
      if (variant == 1) EXPECT_NEAR(diff, per * 2 * ag / q, 1e-9 * per * ag) << overlap;
      if (variant == 2) EXPECT_GT(diff, per * ag) << overlap;
    }
  }
}

TEST(Predict, WhatCannotBeModelledIsRefusedWithTheReason) {
  // tp_comm_overlap at tp > 1 overlaps sequence-parallel collectives: without them, refused;
  // overlap_param_gather needs ZeRO's parameter gather; flash3 kernels exist on Hopper only.
  Job job = parse_job(kJob, "job.toml", {"parallel.seq_parallel=false", "parallel.tp_comm_overlap=true"});
  EXPECT_NE(plan_error(job.model, resolve_plan(job)).find("tp_comm_overlap = true at tp = 8 needs seq_parallel = true"),
            std::string::npos);
  Job z0 = parse_job(kJob, "job.toml", {"parallel.zero=0", "parallel.overlap_param_gather=true", "parallel.pp=1",
                                        "parallel.vp=1", "parallel.dp=8"});
  EXPECT_NE(plan_error(z0.model, resolve_plan(z0)).find("overlap_param_gather = true needs zero >= 1"),
            std::string::npos);
  Job fa3 = parse_job(kJob, "job.toml", {"train.attention=flash3"});
  try {
    predict(fa3.model, fa3.machine, resolve_plan(fa3));
    FAIL() << "flash3 on an A100 must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("attention = \"flash3\""), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("a100-80g"), std::string::npos) << e.what();
  }
}

// [train] fp8_param_gather under ZeRO 1 (Megatron's distributed optimizer with --fp8-param-gather):
// the all-gather of the updated weights moves the layers' matrices in 1 byte, the rest in 2; the
// gradients' reduce-scatter and everything else stay. Without fp8, or without a gather, a note.
TEST(Predict, Fp8ParamGatherHalvesTheMatricesOfZeroOnesWeightGather) {
  const std::vector<std::string> base = {"parallel.pp=1", "parallel.vp=1", "parallel.dp=8", "parallel.zero=1",
                                         "train.precision=fp8", "machine.device=h100-sxm"};
  std::vector<std::string> with = base;
  with.push_back("train.fp8_param_gather=true");
  const Job j16 = parse_job(kJob, "job.toml", base), j8 = parse_job(kJob, "job.toml", with);
  const Plan p16 = resolve_plan(j16), p8 = resolve_plan(j8);
  ASSERT_TRUE(p8.fp8_all_gather);
  EXPECT_TRUE(plan_notes(j8, p8).empty());
  const double n = double(parameters_on_rank(j8.model, p8, 0)), mats = double(matrix_parameters_on_rank(j8.model, p8, 0));
  const Group g = group_on_machine(8, 8, j8.machine.gpus_per_node);
  const double saved = best_all_gather_time(2 * n, g, j8.machine) - best_all_gather_time(2 * (n - mats) + mats, g, j8.machine);
  const Prediction a = predict(j16.model, j16.machine, p16), b = predict(j8.model, j8.machine, p8);
  EXPECT_GT(saved, 0);
  EXPECT_NEAR(a.breakdown.dp_comm - b.breakdown.dp_comm, saved, 1e-9 * saved);
  EXPECT_DOUBLE_EQ(a.breakdown.compute, b.breakdown.compute);
  EXPECT_DOUBLE_EQ(a.memory.total, b.memory.total);
  std::vector<std::string> bf16 = with;
  bf16[4] = "train.precision=bf16";
  const Job jb = parse_job(kJob, "job.toml", bf16);
  ASSERT_EQ(plan_notes(jb, resolve_plan(jb)).size(), 1u);
  EXPECT_EQ(plan_notes(jb, resolve_plan(jb))[0], "fp8_param_gather = true has no effect at precision = \"bf16\" (no fp8 weights)");
  std::vector<std::string> zero0 = with;
  zero0[3] = "parallel.zero=0";
  const Job jz = parse_job(kJob, "job.toml", zero0);
  ASSERT_EQ(plan_notes(jz, resolve_plan(jz)).size(), 1u);
  EXPECT_EQ(plan_notes(jz, resolve_plan(jz))[0], "fp8_param_gather = true has no effect at zero = 0 (no parameter all-gather)");
}

// Plan::zero3_prefetch false (this runtime's ZeRO 3, plan.hpp as_run_here): every unit (the 96
// layers, the embedding, the head) is gathered before each pass that reads it, blocking: forward and
// backward, and a layer's rerun under full recomputation; the head of this single-stage, tied model
// gathers the embedding (words and learned positions) again; every unit's gradient is
// reduce-scattered once per micro-batch (fp32). GPT-3 175B, tp 8 x dp 8, bf16.
TEST(Predict, ZeroThreeWithoutPrefetchExposesEveryGatherAndReduceScatter) {
  const Job job = parse_job(kJob, "job.toml", {"parallel.pp=1", "parallel.vp=1", "parallel.dp=8", "parallel.zero=3",
                                               "train.precision=bf16"});
  Plan p = resolve_plan(job);
  ASSERT_TRUE(job.model.tie_embeddings && job.model.position == Position::learned);
  const double prefetched = predict(job.model, job.machine, p).breakdown.dp_comm;
  p.zero3_prefetch = false;
  const Group g = group_on_machine(8, 8, job.machine.gpus_per_node);
  auto ag = [&](double bytes) { return ring_all_gather_time(bytes, g, job.machine); };
  const double h = 12288, words = double(vocab_slice(50257, 8, 0).rows) * h, positions = 2048 * h, norm = 2 * h;
  const double layer_n = (double(parameters_on_rank(job.model, p, 0)) - words - positions - norm) / 96;
  const double mbs = double(p.micro_batches());
  for (Recompute r : {Recompute::selective, Recompute::full}) {
    p.recompute = r;
    const double passes = r == Recompute::full ? 3 : 2;
    const double gathers = passes * 96 * ag(2 * layer_n) + 2 * (ag(2 * (words + positions)) + ag(2 * (norm + words + positions)));
    const double reduces = 96 * ag(4 * layer_n) + ag(4 * (words + positions)) + ag(4 * norm);
    const double blocking = predict(job.model, job.machine, p).breakdown.dp_comm;
    EXPECT_NEAR(blocking, mbs * (gathers + reduces), 1e-9 * blocking) << to_string(r);
    EXPECT_GT(blocking, prefetched);
  }
}

// This runtime's CPU backend gives released memory back to the OS and the next write faults it in
// again (Device::refault_gbs): per micro-batch, ZeRO 2 writes its released gradient arena (4 bytes a
// parameter); ZeRO 3 its gradients and every unit it gathers (fp32: 4 bytes a parameter), its own
// shard's share (1/4 at dp 4) in compute and the other replicas' (3/4) in dp_comm, because MPI
// writes that part inside the all-gather. The tutorial's tiny GPT (one stage, tied, fp32): n =
// 4 layers x (12 h^2 + 13 h) + the word and position tables E = (4096 + 64) h + the final norm 2 h
// = 1,325,824 parameters (the 5,303,296 bytes of its dp all-reduce, tutorial chapter 4). Each
// layer is gathered for the forward and the backward (and again for recompute = full's rerun), the
// embedding unit (E) by the first unit and by the head (which reads the tied table) in both
// passes, with the final norm. ZeRO 0 and 1 release nothing; over one replica every stage runs ZeRO
// 0 (parallel/grad_sync.hpp zero_run); a device without the figure (GPUs) pays nothing.
TEST(Predict, ReleasedMemoryWrittenAgainCostsZeroTwoAndThreeOnACpu) {
  const char* tiny = R"(
[model]
layers = 4
hidden = 128
heads = 4
seq_len = 64
vocab = 4096
[parallel]
tp = 1
pp = 1
global_batch = 16
micro_batch = 2
[train]
precision = "fp32"
)";
  const double h = 128, layer = 12 * h * h + 13 * h, E = (4096 + 64) * h, norm = 2 * h, n = 4 * layer + E + norm;
  ASSERT_EQ(n, 1325824);
  for (int dp : {1, 4})
    for (Recompute r : {Recompute::none, Recompute::full})
      for (int zero : {0, 1, 2, 3}) {
        SCOPED_TRACE(fmt::format("dp {} recompute {} zero {}", dp, to_string(r), zero));
        const Job job = parse_job(tiny, "job.toml", {"parallel.zero=" + std::to_string(zero), "parallel.dp=" + std::to_string(dp),
                                                     "parallel.gpus=" + std::to_string(dp),
                                                     "parallel.recompute=" + std::string(to_string(r))});
        ASSERT_TRUE(job.model.tie_embeddings && job.model.position == Position::learned);
        const Plan p = as_run_here(resolve_plan(job));
        ASSERT_EQ(double(parameters_on_rank(job.model, p, 0)), n);
        const Device cpu = find_device(job.machine.device);
        ASSERT_GT(cpu.refault_gbs, 0) << cpu.name;
        Device mapped = cpu;
        mapped.refault_gbs = 0;
        auto run = [&](const Device& d) {
          return predict_checked(job.model, job.machine, d, p, memory_per_device(job.model, p, d, 0.2, 0.05),
                                 default_calibration());
        };
        const Prediction with = run(cpu), without = run(mapped);
        const double compute = with.breakdown.compute - without.breakdown.compute;
        const double dp_comm = with.breakdown.dp_comm - without.breakdown.dp_comm;
        const double mbs = double(p.micro_batches()), rate = cpu.refault_gbs * 1e9;
        double want_compute = 0, want_dp = 0;
        if (dp > 1 && zero == 2) want_compute = mbs * 4 * n / rate;
        if (dp > 1 && zero == 3) {
          const double passes = r == Recompute::full ? 3 : 2;
          const double gathered = 4 * (passes * 4 * layer + 2 * (E + norm + E));
          want_compute = mbs * (4 * n + gathered / 4) / rate;
          want_dp = mbs * gathered * 3 / 4 / rate;
        }
        EXPECT_NEAR(compute, want_compute, 1e-12);
        EXPECT_NEAR(dp_comm, want_dp, 1e-12);
        EXPECT_NEAR(with.step_time_s - without.step_time_s, want_compute + want_dp, 1e-12);
      }
}

// [parallel] overlap_p2p_comm (Megatron-Core's interleaved schedule): each of the 2 m vp
// steady-state messages is exposed by what it takes beyond one chunk's forward (layers / vp layers
// of the layer's forward), and by its latency α at least; the warm-up's and cool-down's 2 (pp - 1)
// stay exposed. GPT-3 175B on tp 8 x pp 8 x vp 3 (untied embeddings: no gradient exchange between
// the end stages): on Selene's network a message hides under its 4-layer chunk; on a network of
// 0.05 GB/s a node it outlasts it. Nothing else moves; at vp = 1 a note says it does nothing.
TEST(Predict, OverlapP2pCommLeavesTheWarmupAndCooldownMessagesExposed) {
  for (const char* bw : {"", "machine.inter_node_bw_gbs=0.05"}) {
    SCOPED_TRACE(bw);
    std::vector<std::string> sets = {"model.tie_embeddings=false"};
    if (*bw) sets.push_back(bw);
    Job job = parse_job(kJob, "job.toml", sets);
    const Prediction blocking = predict(job.model, job.machine, resolve_plan(job));
    sets.push_back("parallel.overlap_p2p_comm=true");
    Job ov = parse_job(kJob, "job.toml", sets);
    const Plan p = resolve_plan(ov);
    ASSERT_TRUE(p.overlap_p2p_comm);
    const Prediction overlapped = predict(ov.model, ov.machine, p);
    const double steady = 2.0 * double(p.micro_batches()) * double(p.vp), fill = 2.0 * double(p.pp - 1);
    const double t = blocking.breakdown.pp_comm / (steady + fill);  // one message (tp = 8 fills a node: across nodes)
    const double chunk = double(ov.model.layers) / double(p.pp * p.vp) *
                         layer_time(ov.model, p, find_device(ov.machine.device), default_calibration()).fwd;
    const double alpha = p2p_time(0.0, false, ov.machine);
    if (*bw) EXPECT_GT(t - chunk, alpha);
    else EXPECT_LT(t, chunk);
    EXPECT_NEAR(overlapped.breakdown.pp_comm, steady * std::max(alpha, t - chunk) + fill * t,
                1e-9 * blocking.breakdown.pp_comm);
    EXPECT_LT(overlapped.breakdown.pp_comm, blocking.breakdown.pp_comm);
    EXPECT_DOUBLE_EQ(overlapped.breakdown.compute, blocking.breakdown.compute);
    EXPECT_DOUBLE_EQ(overlapped.breakdown.pp_bubble, blocking.breakdown.pp_bubble);
  }
  // Without the interleaved schedule: a note, and the blocking sends.
  Job one = parse_job(kJob, "job.toml", {"parallel.overlap_p2p_comm=true", "parallel.vp=1"});
  const Plan p1 = resolve_plan(one);
  bool noted = false;
  for (const std::string& n : plan_notes(one, p1)) noted |= n.find("overlap_p2p_comm = true has no effect") == 0;
  EXPECT_TRUE(noted);
  Job one_plain = parse_job(kJob, "job.toml", {"parallel.vp=1"});
  EXPECT_DOUBLE_EQ(predict(one.model, one.machine, p1).breakdown.pp_comm,
                   predict(one_plain.model, one_plain.machine, resolve_plan(one_plain)).breakdown.pp_comm);
}
