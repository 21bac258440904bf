// Pipeline schedules: the idle (bubble) time of GPipe, 1F1B and interleaved 1F1B.
#pragma once
#include <vector>

#include "plan/plan.hpp"

namespace exatrain::plan {

// Ideal bubble fraction (bubble time / ideal compute time) with equal stages:
// GPipe and 1F1B: (pp - 1) / m;  interleaved 1F1B with vp virtual stages: (pp - 1) / (vp * m)
// (Narayanan et al. SC21, Sec. 2.2). 1F1B only changes memory (pp micro-batches in flight, not m).
double bubble_fraction(const Plan& p);

// Bubble time of a pipeline whose ranks take `rank_time_per_microbatch` seconds (forward +
// backward of one micro-batch through all of the rank's layers). The pipeline fills and drains
// through every rank but the slowest, each chunk of 1/vp of a rank's work at a time:
// (sum - max) / vp; equal stages give (pp - 1) * t / vp = bubble_fraction * m * t.
double bubble_time(const std::vector<double>& rank_time_per_microbatch, int64_t vp);

}  // namespace exatrain::plan
