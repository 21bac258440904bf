// The job-file parser: defaults, presets, overrides, round trip, and one clear error per problem.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "core/check.hpp"
#include "job/parse.hpp"
#include "../test_util/error_of.hpp"
#include "job_errors.hpp"

using namespace exatrain;

using job_test::contains;
using job_test::parse_error;

TEST(JobParse, ContractExampleReadsEveryKey) {
  Job j = parse_job(R"(
[model]
layers = 96
hidden = 12288
heads = 96
kv_heads = 8
ffn_hidden = 49152
seq_len = 2048
vocab = 51200
activation = "swiglu"
norm = "rmsnorm"
position = "rope"
tie_embeddings = false
[machine]
device = "mi250x-gcd"
gpus_per_node = 8
intra_node_bw_gbs = 50
inter_node_bw_gbs = 100
intra_node_latency_us = 2
inter_node_latency_us = 4
storage_bw_gbs = 5000
node_mtbf_hours = 50000
[parallel]
gpus = 1024
tp = 4
pp = 16
dp = 16
cp = 1
vp = 1
zero = 1
micro_batch = 1
global_batch = 1024
recompute = "full"
seq_parallel = false
schedule = "1f1b"
[train]
precision = "bf16"
optimizer = "adamw"
steps = 1000
seed = 1234
lr = 6e-4
warmup_steps = 100
data = "data/corpus"
run_dir = "runs/my-run"
checkpoint_every = 100
)", "job.toml");
  EXPECT_EQ(j.model.layers, 96);
  EXPECT_EQ(j.model.kv_heads, 8);
  EXPECT_EQ(j.model.activation, Activation::swiglu);
  EXPECT_EQ(j.model.norm, Norm::rmsnorm);
  EXPECT_EQ(j.model.position, Position::rope);
  EXPECT_FALSE(j.model.tie_embeddings);
  EXPECT_FALSE(j.model.vocab_from_data);
  EXPECT_EQ(j.machine.device, "mi250x-gcd");
  EXPECT_DOUBLE_EQ(j.machine.inter_node_bw_gbs, 100);
  ASSERT_TRUE(j.machine.node_mtbf_hours.has_value());
  EXPECT_EQ(*j.parallel.tp, 4);
  EXPECT_EQ(*j.parallel.dp, 16);
  EXPECT_EQ(*j.parallel.zero, 1);
  EXPECT_EQ(*j.parallel.recompute, Recompute::full);
  EXPECT_EQ(*j.parallel.schedule, Schedule::one_f_one_b);
  EXPECT_EQ(j.train.precision, Precision::bf16);
  EXPECT_DOUBLE_EQ(j.train.lr, 6e-4);
  EXPECT_EQ(j.train.checkpoint_every, 100);
}

TEST(JobParse, DefaultsFollowTheContract) {
  Job j = parse_job("[model]\nhidden = 256\nheads = 8\n", "job.toml");
  EXPECT_EQ(j.model.kv_heads, 8);         // default: heads
  EXPECT_EQ(j.model.ffn_hidden, 1024);    // default: 4 * hidden
  EXPECT_TRUE(j.model.vocab_from_data);   // train takes the dataset's vocabulary
  EXPECT_FALSE(j.parallel.tp.has_value());
  EXPECT_FALSE(j.parallel.recompute.has_value());
}

TEST(JobParse, ModelBiasKey) {
  EXPECT_TRUE(parse_job("[model]\nhidden = 256\nheads = 8\n", "job.toml").model.bias);  // GPT-2 default
  Job j = parse_job("[model]\npreset = \"llama3-8b\"\n", "job.toml");
  EXPECT_FALSE(j.model.bias);  // the Llama presets: no linear-layer biases
  EXPECT_FALSE(parse_job(job_to_toml(j), "roundtrip.toml").model.bias);
  EXPECT_TRUE(parse_job("", "job.toml", {"model.preset=llama3-8b", "model.bias=true"}).model.bias);
  std::string e = parse_error("[model]\nbias = 0\n");
  EXPECT_TRUE(contains(e, "job.toml: [model] bias = 0: expected true or false")) << e;
}

TEST(JobParse, AutoLeavesParallelFieldsOpen) {
  Job j = parse_job("[parallel]\ngpus = 8\ntp = \"auto\"\nrecompute = \"auto\"\nseq_parallel = \"auto\"\n", "job.toml");
  EXPECT_FALSE(j.parallel.tp.has_value());
  EXPECT_FALSE(j.parallel.recompute.has_value());
  EXPECT_FALSE(j.parallel.seq_parallel.has_value());
}

TEST(JobParse, SetOverridesFileAndParsesTypes) {
  Job j = parse_job("[model]\nhidden = 256\nheads = 8\n[parallel]\ntp = 2\n", "job.toml",
                    {"model.hidden=512", "parallel.tp=auto", "model.activation=swiglu", "train.lr=0.01"});
  EXPECT_EQ(j.model.hidden, 512);
  EXPECT_FALSE(j.parallel.tp.has_value());
  EXPECT_EQ(j.model.activation, Activation::swiglu);
  EXPECT_DOUBLE_EQ(j.train.lr, 0.01);
}

TEST(JobParse, UnknownKeyIsNamedWithSuggestion) {
  std::string e = parse_error("[model]\nhiden = 256\n");
  EXPECT_TRUE(contains(e, "job.toml: [model] unknown key \"hiden\" (did you mean \"hidden\"?)")) << e;
}

TEST(JobParse, UnknownSectionIsNamed) {
  std::string e = parse_error("[modle]\nhidden = 256\n");
  EXPECT_TRUE(contains(e, "unknown section [modle]")) << e;
}

TEST(JobParse, WrongTypeNamesKeyValueAndExpectation) {
  std::string e = parse_error("[model]\nlayers = \"twelve\"\n");
  EXPECT_TRUE(contains(e, "job.toml: [model] layers = \"twelve\": expected an integer")) << e;
  e = parse_error("[model]\nactivation = \"relu\"\n");
  EXPECT_TRUE(contains(e, "[model] activation = \"relu\": expected one of \"gelu\" \"swiglu\"")) << e;
  e = parse_error("[parallel]\nzero = 4\n");
  EXPECT_TRUE(contains(e, "[parallel] zero = 4: expected an integer in [0, 3] or \"auto\"")) << e;
}

TEST(JobParse, ImpossibleShapesPrintTheEquation) {
  std::string e = parse_error("[model]\nhidden = 770\nheads = 12\n");
  EXPECT_TRUE(contains(e, "hidden = 770 is not divisible by heads = 12")) << e;
  e = parse_error("[model]\nhidden = 768\nheads = 12\nkv_heads = 5\n");
  EXPECT_TRUE(contains(e, "heads = 12 is not divisible by kv_heads = 5")) << e;
}

// A problem between keys names where each value came from: a value given by --set is named as
// that --set (the file alone would send the user looking in the wrong place).
TEST(JobParse, DerivedChecksNameTheSetThatCausedThem) {
  std::string e = parse_error("[model]\nhidden = 768\nheads = 12\n", {"model.heads=7"});
  EXPECT_TRUE(contains(e, "job.toml and --set model.heads=7: [model] hidden = 768 is not divisible by heads = 7"))
      << e;
  e = parse_error("[model]\nhidden = 768\n", {"model.heads=12", "model.kv_heads=5"});
  EXPECT_TRUE(contains(e, "\n  --set model.heads=12 and --set model.kv_heads=5: [model] heads = 12 is not divisible "
                          "by kv_heads = 5")) << e;
  e = parse_error("[train]\nlr = 0.001\n", {"train.min_lr=0.01"});
  EXPECT_TRUE(contains(e, "--set train.min_lr=0.01 and job.toml: [train] min_lr = 0.01 is above lr = 0.001")) << e;
  e = parse_error("[model]\nhidden = 770\nheads = 12\n");  // no --set: the file alone
  EXPECT_TRUE(contains(e, "\n  job.toml: [model] hidden = 770 is not divisible by heads = 12")) << e;
}

TEST(JobParse, AllProblemsReportedTogether) {
  std::string e = parse_error("[model]\nhiden = 1\nlayers = -3\n[train]\nlr = \"fast\"\n");
  EXPECT_TRUE(contains(e, "3 problems in job job.toml")) << e;
}

TEST(JobParse, SetErrorsAreNamed) {
  std::string e = parse_error("", {"model.hidden=abc"});
  EXPECT_TRUE(contains(e, "--set: [model] hidden = \"abc\": expected an integer")) << e;
  e = parse_error("", {"nosection"});
  EXPECT_TRUE(contains(e, "--set nosection: expected section.key=value")) << e;
}

TEST(JobParse, SyntaxErrorNamesTheFile) {
  std::string e = parse_error("[model\nhidden = 1\n");
  EXPECT_TRUE(contains(e, "job.toml: not valid TOML")) << e;
}

TEST(JobParse, MissingPresetIsNamed) {
  std::string e = parse_error("[model]\npreset = \"no-such-model\"\n");
  EXPECT_TRUE(contains(e, "preset = \"no-such-model\": expected the name of a preset in models/ (one of: ")) << e;
}

TEST(JobParse, MissingFileIsNamed) {
  try {
    load_job("/nonexistent/job.toml");
    FAIL();
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "cannot open job file '/nonexistent/job.toml'")) << e.what();
  }
}

TEST(JobParse, RoundTripThroughToml) {
  Job a = parse_job("[model]\nhidden = 256\nheads = 8\nkv_heads = 2\nvocab = 1000\nposition = \"rope\"\n"
                    "[parallel]\ngpus = 4\ntp = 2\nlayers_per_stage = [1, 2]\n[train]\nlr = 0.001\nseed = 7\n",
                    "job.toml");
  Job b = parse_job(job_to_toml(a), "roundtrip.toml");
  EXPECT_EQ(job_to_toml(a), job_to_toml(b));
  EXPECT_EQ(b.model.kv_heads, 2);
  EXPECT_EQ(b.parallel.layers_per_stage, (std::vector<int64_t>{1, 2}));
  EXPECT_FALSE(b.parallel.pp.has_value());
  EXPECT_EQ(b.train.seed, 7u);
  // Paths with quotes and backslashes survive the round trip.
  a.train.run_dir = "runs/a \"quoted\" \\ dir";
  EXPECT_EQ(parse_job(job_to_toml(a), "roundtrip.toml").train.run_dir, a.train.run_dir);
}

TEST(JobParse, PresetThenFileThenSet) {
  // A private data root with one model preset, so the test does not depend on shipped presets.
  std::string root = testing::TempDir() + "/exatrain_home";
  std::filesystem::create_directories(root + "/models");
  std::ofstream(root + "/models/tiny.toml") << "[model]\nlayers = 2\nhidden = 64\nheads = 4\nvocab = 300\n";
  setenv("EXATRAIN_HOME", root.c_str(), 1);
  std::ofstream(root + "/models/other.toml") << "[model]\nlayers = 5\nhidden = 96\nheads = 6\n";
  Job j = parse_job("[model]\npreset = \"tiny\"\nheads = 8\n", "job.toml", {"model.layers=3"});
  // --set model.preset replaces the file's preset; the file's keys still override it.
  Job k = parse_job("[model]\npreset = \"tiny\"\nheads = 8\n", "job.toml", {"model.preset=other"});
  Job l = parse_job("", "empty.toml", {"model.preset=other"});
  unsetenv("EXATRAIN_HOME");
  EXPECT_EQ(k.model.preset, "other");
  EXPECT_EQ(k.model.hidden, 96);
  EXPECT_EQ(k.model.layers, 5);
  EXPECT_EQ(k.model.heads, 8);
  EXPECT_EQ(l.model.hidden, 96);
  EXPECT_EQ(l.model.heads, 6);
  EXPECT_EQ(j.model.preset, "tiny");
  EXPECT_EQ(j.model.hidden, 64);   // from the preset
  EXPECT_EQ(j.model.heads, 8);     // the file overrides the preset
  EXPECT_EQ(j.model.kv_heads, 8);  // default follows the final heads
  EXPECT_EQ(j.model.layers, 3);    // --set overrides the file
  EXPECT_FALSE(j.model.vocab_from_data);
}

TEST(JobParse, NoMachineSectionMeansThisMachine) {
  // A job without [machine] runs here: the `local` cluster, as "auto" plans use it.
  Job j = parse_job("[model]\nhidden = 64\nheads = 4\n", "job.toml", {});
  EXPECT_EQ(j.machine.preset, "local");
  EXPECT_EQ(j.machine.device, "cpu-local");
  EXPECT_EQ(j.machine.gpus_per_node, 2);
  EXPECT_GT(j.machine.intra_node_bw_gbs, 0);
  EXPECT_NE(j.origins.at("machine.preset").find("no [machine]: this machine"), std::string::npos);
  // A --set machine.KEY overrides one key of that machine, as of a preset.
  Job k = parse_job("[model]\nhidden = 64\nheads = 4\n", "job.toml", {"machine.node_mtbf_hours=50000"});
  EXPECT_EQ(k.machine.preset, "local");
  EXPECT_GT(k.machine.intra_node_bw_gbs, 0);
  EXPECT_EQ(k.machine.node_mtbf_hours.value_or(0), 50000);
  // A [machine] table in the file is the user's machine description: no preset is added.
  Job t = parse_job("[model]\nhidden = 64\nheads = 4\n[machine]\ndevice = \"h100-sxm\"\n", "job.toml", {});
  EXPECT_EQ(t.machine.preset, "");
  EXPECT_EQ(t.machine.intra_node_bw_gbs, 0);
}

// [train] device / backend (issue 13): values named when refused, the contradiction of the two
// named with both keys, and how "auto" and an omitted backend resolve (resolved_backend).
TEST(JobParse, DeviceAndBackendKeys) {
  const Job d = parse_job("[model]\nhidden = 256\nheads = 8\n", "job.toml");
  EXPECT_EQ(d.train.device, "auto");
  EXPECT_EQ(d.train.backend, "");
  EXPECT_EQ(resolved_backend(d.train, 0), "cpu");   // no GPU visible (or no CUDA backend)
  EXPECT_EQ(resolved_backend(d.train, 2), "cuda");  // a GPU visible
  auto with = [](const std::string& train) { return parse_job("[train]\n" + train, "job.toml").train; };
  EXPECT_EQ(resolved_backend(with("device = \"cpu\"\n"), 8), "cpu");
  EXPECT_EQ(resolved_backend(with("device = \"cuda\"\n"), 0), "cuda");  // make_backend then says why not
  EXPECT_EQ(resolved_backend(with("backend = \"cpu-guarded\"\n"), 8), "cpu-guarded");
  EXPECT_EQ(resolved_backend(with("backend = \"cuda\"\n"), 0), "cuda");
  EXPECT_EQ(resolved_backend(with("device = \"cpu\"\nbackend = \"cpu-guarded\"\n"), 1), "cpu-guarded");
  std::string e = parse_error("[train]\ndevice = \"tpu\"\n");
  EXPECT_TRUE(contains(e, "job.toml: [train] device = \"tpu\": expected one of \"auto\" \"cpu\" \"cuda\"")) << e;
  e = parse_error("[train]\nbackend = \"gpu\"\n");
  EXPECT_TRUE(contains(e, "[train] backend = \"gpu\": expected one of \"cpu\" \"cpu-guarded\" \"cuda\"")) << e;
  e = parse_error("[train]\ndevice = \"cpu\"\n", {"train.backend=cuda"});
  EXPECT_TRUE(contains(e, "[train] backend = \"cuda\" does not run on [train] device = \"cpu\"")) << e;
  EXPECT_TRUE(contains(e, "--set train.backend=cuda")) << e;
  e = parse_error("[train]\ndevice = \"cuda\"\nbackend = \"cpu-guarded\"\n");
  EXPECT_TRUE(contains(e, "[train] backend = \"cpu-guarded\" does not run on [train] device = \"cuda\"")) << e;
  // The canonical text keeps both (backend only when set) and parses back to the same settings.
  for (const char* train : {"device = \"cuda\"\n", "backend = \"cpu-guarded\"\n", ""}) {
    const Job a = parse_job(std::string("[train]\n") + train, "job.toml");
    const Job b = parse_job(job_to_toml(a), "roundtrip.toml");
    EXPECT_EQ(b.train.device, a.train.device);
    EXPECT_EQ(b.train.backend, a.train.backend);
  }
}
