// `exatrain profile` (profile/profile.hpp): the structure and sanity of what it measures and
// writes, and that the catalog and the job parser read it back as the local machine. Never its
// speeds: the machine is shared, so the figures are only checked to be positive and consistent.
#include <cstdlib>
#include <filesystem>

#include <gtest/gtest.h>

#include "catalog/device.hpp"
#include "core/fileio.hpp"
#include "core/profile_cache.hpp"
#include "core/toml.hpp"
#include "job/parse.hpp"
#include "profile/profile.hpp"

using namespace exatrain;

TEST(Profile, QuickProfileHasEveryFigureOfACatalogEntry) {
  const profile::MachineProfile p = profile::profile_machine({.quick = true});
  ASSERT_EQ(p.devices.size(), 2u);
  EXPECT_EQ(p.devices[0].name, "cpu-local");
  EXPECT_EQ(p.devices[0].threads, 1);
  EXPECT_EQ(p.devices[1].name, "cpu-local-2c");
  EXPECT_FALSE(p.network.has_value());  // one rank: no collectives to measure
  EXPECT_EQ(p.fingerprint, machine_fingerprint());
  for (const profile::DeviceProfile& d : p.devices) {
    EXPECT_GT(d.peak_gflops, 0) << d.name;
    for (const profile::GemmPoint& g : d.gemms) EXPECT_LE(g.gflops, d.peak_gflops) << d.name;
    EXPECT_GT(d.gemm_efficiency, 0) << d.name;
    EXPECT_LE(d.gemm_efficiency, 1) << d.name;
    EXPECT_GE(d.dim_half, 0) << d.name;
    EXPECT_GE(d.tokens_half, 0) << d.name;
    EXPECT_GT(d.attention_efficiency, 0) << d.name;
    EXPECT_LE(d.attention_efficiency, 1) << d.name;
    EXPECT_GT(d.copy_gbs, 0) << d.name;
    EXPECT_GT(d.elementwise_gbs, 0) << d.name;
    EXPECT_LE(d.elementwise_gbs, d.copy_gbs) << d.name;
    EXPECT_GT(d.memory_gib, 0) << d.name;
    // Released memory is written again slower than mapped memory is copied (a page fault each page),
    // or 0 where the difference cannot be measured (never the rate of a difference of noise).
    EXPECT_GE(d.refault_gbs, 0) << d.name;
    EXPECT_LT(d.refault_gbs, d.copy_gbs) << d.name;
  }
  // The TOML is a catalog entry: every key devices.toml requires, read back by the catalog's own
  // parser below.
  const toml::value root = parse_toml(profile::profile_toml(p), "profile");
  EXPECT_EQ(toml::find<std::string>(root, "profile", "fingerprint"), machine_fingerprint());
  for (const char* dev : {"cpu-local", "cpu-local-2c"})
    for (const char* key : {"peak_tflops_fp32", "peak_tflops_bf16", "hbm_gib", "hbm_bw_gbs", "gemm_efficiency",
                            "gemm_dim_half", "gemm_tokens_half", "flash2_efficiency", "bw_efficiency", "refault_gbs",
                            "measured"})
      EXPECT_TRUE(root.at(dev).contains(key)) << dev << "." << key;
}

TEST(Profile, CacheIsUsedOnlyForThisMachine) {
  const std::string dir = std::filesystem::temp_directory_path() / ("exatrain-profile-test-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  setenv("EXATRAIN_PROFILE_DIR", dir.c_str(), 1);
  unsetenv("EXATRAIN_PROFILE");
  std::string why;
  EXPECT_FALSE(active_profile(&why).has_value());
  EXPECT_NE(why.find("no profile at"), std::string::npos) << why;
  // Another machine's profile is ignored, with the reason.
  write_file_atomic(profile_cache_file(), "[profile]\nfingerprint = \"host=elsewhere\"\n");
  EXPECT_FALSE(active_profile(&why).has_value());
  EXPECT_NE(why.find("another machine"), std::string::npos) << why;
  // This machine's is used; EXATRAIN_PROFILE=off turns it off.
  write_file_atomic(profile_cache_file(), "[profile]\nfingerprint = \"" + machine_fingerprint() + "\"\n");
  EXPECT_EQ(active_profile(&why), profile_cache_file());
  setenv("EXATRAIN_PROFILE", "off", 1);
  EXPECT_FALSE(active_profile(&why).has_value());
  EXPECT_EQ(why, "EXATRAIN_PROFILE=off");
  unsetenv("EXATRAIN_PROFILE_DIR");
  std::filesystem::remove_all(dir);
}

// `exatrain profile` on one rank measures the devices and no network: the job parser takes its
// devices and keeps the shipped [machine] of `local` (it refused such a profile before, "expected a
// [machine] table", so every job without [machine] failed after a one-rank profile).
TEST(Profile, OneRankProfileIsTheLocalMachinesDevices) {
  const std::string dir = std::filesystem::temp_directory_path() / ("exatrain-profile-1r-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  setenv("EXATRAIN_PROFILE_DIR", dir.c_str(), 1);
  unsetenv("EXATRAIN_PROFILE");
  profile::MachineProfile p = profile::profile_machine({.quick = true});
  ASSERT_FALSE(p.network.has_value());
  p.devices[0].peak_gflops = 12.5;  // a figure no shipped entry has, to see which one is read
  write_file_atomic(profile_cache_file(), profile::profile_toml(p));
  ASSERT_TRUE(active_profile().has_value());
  const Job job = parse_job("[model]\npreset = \"gpt2\"\n", "one-rank-profile.toml");
  EXPECT_EQ(job.machine.preset, "local");
  EXPECT_NEAR(find_device(job.machine.device).peak_tflops_fp32, 0.0125, 1e-9) << job.machine.device;
  EXPECT_GT(job.machine.intra_node_bw_gbs, 0);  // the shipped network figures
  unsetenv("EXATRAIN_PROFILE_DIR");
  std::filesystem::remove_all(dir);
}
