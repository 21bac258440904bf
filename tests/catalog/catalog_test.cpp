// The catalog: device figures, lookups with clear errors, and every preset file accepted by the
// job-file parser.
#include <filesystem>

#include <gtest/gtest.h>

#include "catalog/device.hpp"
#include "core/check.hpp"
#include "job/parse.hpp"
#include "plan/flops.hpp"

using namespace exatrain;

TEST(Catalog, DeviceFigures) {
  EXPECT_DOUBLE_EQ(find_device("h100-sxm").peak_tflops(Precision::bf16), 989.4);
  EXPECT_DOUBLE_EQ(find_device("h100-sxm").peak_tflops(Precision::fp8), 1978.9);
  EXPECT_DOUBLE_EQ(find_device("a100-80g").peak_tflops(Precision::fp16), 312.0);
  EXPECT_DOUBLE_EQ(find_device("mi250x-gcd").hbm_gib, 64.0);
  // Memory is what the driver gives a process (nvidia-smi memory.total, MiB), not the datasheet's
  // decimal GB: an H200's "141 GB" is 143771 MiB (141e9 bytes would be 134,468 MiB).
  EXPECT_NEAR(find_device("h200").hbm_gib * 1024, 143771, 60);
  EXPECT_NEAR(find_device("h100-sxm").hbm_gib * 1024, 81559, 10);
  for (const char* name : {"a100-40g", "a100-80g", "h100-sxm", "h200", "mi250x-gcd", "v100", "cpu-local",
                           "cpu-local-2c"})
    EXPECT_NO_THROW(find_device(name)) << name;
}

TEST(Catalog, OptionalShapeConstantsOnlyWhereMeasured) {
  // The CPU devices carry their measured GEMM shape constants; the GPUs use the global fit.
  EXPECT_DOUBLE_EQ(*find_device("cpu-local").gemm_dim_half, 0.0);
  EXPECT_DOUBLE_EQ(*find_device("cpu-local").gemm_tokens_half, 4.0);
  EXPECT_DOUBLE_EQ(*find_device("cpu-local-2c").gemm_tokens_half, 10.0);
  EXPECT_GT(find_device("cpu-local-2c").peak_tflops_fp32, 1.9 * find_device("cpu-local").peak_tflops_fp32);
  // Released memory written again: measured on the CPU devices (one core's share, both cores);
  // GPUs keep released memory mapped (0: not modelled).
  EXPECT_DOUBLE_EQ(find_device("cpu-local").refault_gbs, 0.26);
  EXPECT_DOUBLE_EQ(find_device("cpu-local-2c").refault_gbs, 0.52);
  for (const Device& d : all_devices())
    if (d.name.rfind("cpu-", 0) != 0) {
      EXPECT_FALSE(d.gemm_dim_half.has_value()) << d.name;
      EXPECT_FALSE(d.gemm_tokens_half.has_value()) << d.name;
      EXPECT_EQ(d.refault_gbs, 0) << d.name;
    }
}

TEST(Catalog, UnknownDeviceListsKnownNames) {
  try {
    find_device("a100-81g");
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("unknown device 'a100-81g'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("a100-80g"), std::string::npos) << msg;
    EXPECT_NE(msg.find("mi250x-gcd"), std::string::npos) << msg;
  }
}

TEST(Catalog, Clusters) {
  MachineSpec f = find_cluster("frontier");
  EXPECT_EQ(f.device, "mi250x-gcd");
  EXPECT_EQ(f.gpus_per_node, 8);
  EXPECT_DOUBLE_EQ(f.inter_node_bw_gbs, 100);
  for (const char* name : {"frontier", "perlmutter", "polaris", "selene", "eos", "jean-zay-a100", "local"})
    EXPECT_NO_THROW(find_cluster(name)) << name;
  EXPECT_THROW(find_cluster("summit"), Error);
}

TEST(Catalog, EveryPresetParsesThroughTheJobParser) {
  std::string root = EXATRAIN_SOURCE_DIR;
  int models = 0;
  for (const auto& e : std::filesystem::directory_iterator(root + "/models")) {
    if (e.path().extension() != ".toml") continue;
    std::string name = e.path().stem().string();
    std::string text = "[model]\npreset = \"" + name + "\"\n[machine]\npreset = \"local\"\n";
    Job job;
    ASSERT_NO_THROW(job = parse_job(text, "preset-test.toml")) << name;
    EXPECT_EQ(job.model.hidden % job.model.heads, 0) << name;
    ++models;
  }
  EXPECT_GE(models, 20);
  for (const auto& name : cluster_names()) {
    std::string text = "[machine]\npreset = \"" + name + "\"\n";
    EXPECT_NO_THROW(parse_job(text, "preset-test.toml")) << name;
  }
}

TEST(Catalog, PresetSizes) {
  auto load = [](const std::string& name) {
    return parse_job("[model]\npreset = \"" + name + "\"\n", "t.toml").model;
  };
  EXPECT_NEAR(plan::total_parameters(load("gpt3-175b")) / 1e9, 175.0, 1.0);
  EXPECT_NEAR(plan::total_parameters(load("gpt3-1t")) / 1e9, 1008.0, 8.0);
  EXPECT_NEAR(plan::total_parameters(load("gpt3-22b")) / 1e9, 22.0, 0.5);
  EXPECT_NEAR(plan::total_parameters(load("llama3-405b")) / 1e9, 405.9, 0.5);
  EXPECT_NEAR(plan::total_parameters(load("llama2-70b")) / 1e9, 69.0, 0.3);
  EXPECT_EQ(plan::total_parameters(load("gpt2-xl")), 1557611200);
}
