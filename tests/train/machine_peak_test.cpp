// The MFU denominator's cache: named by CPU model and thread count, and it keeps the best
// measurement (a slower measurement never replaces a faster one).
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>

#include "../test_util/temp_dir.hpp"
#include "train/machine_peak.hpp"

using namespace exatrain;

TEST(MachinePeak, CacheNameCarriesCpuModelAndThreads) {
  EXPECT_EQ(sgemm_peak_cache_name("AMD EPYC 9454 48-Core Processor", 2),
            "sgemm_peak_AMD_EPYC_9454_48-Core_Processor_t2.txt");
  EXPECT_EQ(sgemm_peak_cache_name("Intel(R) Xeon(R) Platinum 8480+  @ 2.0GHz", 16),
            "sgemm_peak_Intel_R_Xeon_R_Platinum_8480_2.0GHz_t16.txt");
  EXPECT_EQ(sgemm_peak_cache_name("/../", 1), "sgemm_peak_.._t1.txt");  // no path separators
  EXPECT_EQ(sgemm_peak_cache_name("", 4), "sgemm_peak_unknown-cpu_t4.txt");
  EXPECT_FALSE(cpu_model_name().empty());
}

TEST(MachinePeak, CacheKeepsTheBestMeasurement) {
  TempDir dir;
  const char* old = std::getenv("XDG_CACHE_HOME");
  const std::string saved = old ? old : "";
  ASSERT_EQ(setenv("XDG_CACHE_HOME", dir.path.c_str(), 1), 0);
  auto be = make_cpu_backend(1);
  const std::string file = dir / ("exatrain/" + sgemm_peak_cache_name(cpu_model_name(), 1));
  const double first = cached_sgemm_peak_gflops(*be, 1);  // no cache yet: measures and writes
  EXPECT_GT(first, 0.0);
  double stored = 0;
  ASSERT_TRUE(bool(std::ifstream(file) >> stored)) << file;
  EXPECT_NEAR(stored, first, 1e-5 * first);  // written with 6 significant digits
  {
    std::ofstream(file) << 1e9 << "\n";  // a better (impossible) earlier measurement wins
  }
  EXPECT_EQ(cached_sgemm_peak_gflops(*be, 1), 1e9);
  if (old) setenv("XDG_CACHE_HOME", saved.c_str(), 1);
  else unsetenv("XDG_CACHE_HOME");
}
