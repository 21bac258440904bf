// This machine's measured fp32 GEMM peak (the denominator of MFU on the CPU) and the peak RSS.
#pragma once
#include <string>

#include "backend/backend.hpp"

namespace exatrain {

// Measures now: the best of `repeats` sgemm runs of n^3 (after one warm-up run) at the
// backend's thread count. bench_train_step uses 2048^3 (about a second).
double measure_sgemm_gflops(Backend& backend, int64_t n = 2048, int repeats = 3);
// The machine's sgemm peak for this CPU model and thread count, the MFU denominator: the BEST
// measurement seen so far, kept in $XDG_CACHE_HOME (or ~/.cache)/exatrain/
// sgemm_peak_<cpu model>_t<threads>.txt. Each call measures once more (a 1024^3 sgemm, best of
// 3 after a warm-up: tens of ms) and keeps the maximum, so one measurement taken while the
// machine was busy cannot lower the peak and inflate the MFU. (1024^3 for speed: its rate may
// differ from the 2048^3 rate of bench_train_step; the kept maximum only grows.)
double cached_sgemm_peak_gflops(Backend& backend, int threads);

// "model name" of the first processor in /proc/cpuinfo, "unknown-cpu" when there is none.
std::string cpu_model_name();
// The cache file's name: "sgemm_peak_<model>_t<threads>.txt", the model's characters outside
// [A-Za-z0-9.-] turned into single underscores.
std::string sgemm_peak_cache_name(const std::string& cpu_model, int threads);

// Peak resident set size of this process so far, in bytes (getrusage).
int64_t peak_rss_bytes();
// Resident set size of this process now, in bytes (/proc/self/statm); -1 where it cannot be read.
int64_t resident_bytes();

}  // namespace exatrain
