// The predict JSON object follows the contract (../shared/contracts/job-file.md) and is
// self-consistent; a job file goes through the parser, the predictor and the search.
#include <cmath>
#include <set>

#include <gtest/gtest.h>

#include "core/check.hpp"
#include "job/parse.hpp"
#include "plan/comm.hpp"
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
  Job job = parse_job(kJob, "job.toml", {"parallel.tp=auto", "parallel.pp=auto", "parallel.dp=auto",
                                          "parallel.vp=auto", "parallel.micro_batch=auto"});
  SearchResult r = search_plans(job.model, job.machine, job.parallel, job.train.precision, 3);
  ASSERT_EQ(r.top.size(), 3u);
  EXPECT_LE(r.top[0].step_time_s, r.top[1].step_time_s);
  EXPECT_LE(r.top[1].step_time_s, r.top[2].step_time_s);
  for (const auto& c : r.top) {
    EXPECT_EQ(c.plan.zero, 1);  // fixed in the file
    EXPECT_EQ(c.plan.tp * c.plan.pp * c.plan.dp * c.plan.cp, 64);
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

TEST(Predict, DeviceShapeConstantsReplaceTheGlobalOnes) {
  // cpu-local has its own gemm_dim_half / gemm_tokens_half (devices.toml, measured): the global
  // calibration's shape constants (fitted to GPU tiles) do not move its prediction; a GPU device
  // without them follows the global constants.
  ModelSpec m;
  m.layers = 4, m.hidden = 256, m.heads = 8, m.kv_heads = 8, m.ffn_hidden = 1024, m.seq_len = 128, m.vocab = 4096;
  Plan p;
  p.micro_batch = 2, p.global_batch = 8, p.precision = Precision::fp32;
  Calibration other = default_calibration();
  other.set("dim_half=500");
  other.set("tokens_half=5000");
  MachineSpec local = find_cluster("local");
  ASSERT_TRUE(find_device("cpu-local").gemm_dim_half.has_value());
  ASSERT_TRUE(find_device("cpu-local").gemm_tokens_half.has_value());
  EXPECT_DOUBLE_EQ(predict(m, local, p, other).breakdown.compute, predict(m, local, p).breakdown.compute);
  MachineSpec gpu = find_cluster("selene");
  ASSERT_FALSE(find_device(gpu.device).gemm_dim_half.has_value());
  EXPECT_GT(predict(m, gpu, p, other).breakdown.compute, 2 * predict(m, gpu, p).breakdown.compute);
}
