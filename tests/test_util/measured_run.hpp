// A measured run for the fitter's tests (tests/plan/fit_test.cpp, calibrate_test.cpp): a GPT preset
// on a machine preset at bf16, ZeRO 1, no recomputation, sequence parallelism when tp > 1, as
// Megatron's published runs; the test sets step_s from the constants it wants the fitter to recover.
#pragma once
#include <cstdint>
#include <string>

#include <fmt/format.h>

#include "job/parse.hpp"
#include "plan/fit.hpp"

namespace exatrain::test {

// seq_len 0: the preset's.
inline plan::MeasuredRun measured_run(const std::string& preset, const std::string& machine, int64_t gpus,
                                      int64_t tp, int64_t micro_batch, int64_t global_batch, int64_t seq_len = 0) {
  const std::string seq = seq_len > 0 ? "seq_len = " + std::to_string(seq_len) : std::string();
  const Job job = parse_job(fmt::format(R"([model]
preset = "{}"
{}
[machine]
preset = "{}"
[parallel]
gpus = {}
tp = {}
pp = 1
zero = 1
micro_batch = {}
global_batch = {}
recompute = "none"
seq_parallel = {}
[train]
precision = "bf16"
)", preset, seq, machine, gpus, tp, micro_batch,
                                        global_batch, tp > 1 ? "true" : "false"), "run.toml");
  plan::MeasuredRun r;
  r.group = r.label = fmt::format("{} on {} gpus tp {} seq {}", preset, gpus, tp, job.model.seq_len);
  r.model = job.model, r.machine = job.machine, r.plan = plan::resolve_plan(job);
  return r;
}

}  // namespace exatrain::test
