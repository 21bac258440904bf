// This machine's measured fp32 GEMM peak (the denominator of MFU on the CPU): the best of a
// few OpenBLAS sgemm runs of 2048^3 at the backend's thread count.
#pragma once
#include "backend/backend.hpp"

namespace exatrain {

// Measures now (about a second).
double measure_sgemm_gflops(Backend& backend, int64_t n = 2048, int repeats = 3);
// The machine's sgemm peak for this thread count, the MFU denominator: the BEST measurement seen
// so far, kept in $XDG_CACHE_HOME (or ~/.cache)/exatrain/sgemm_peak_t<threads>.txt. Each call
// measures once more (a quick 1024^3 sgemm, tens of ms) and keeps the maximum, so one
// measurement taken while the machine was busy cannot lower the peak and inflate the MFU.
double cached_sgemm_peak_gflops(Backend& backend, int threads);

// Peak resident set size of this process so far, in bytes (getrusage).
int64_t peak_rss_bytes();

}  // namespace exatrain
