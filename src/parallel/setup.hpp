// From the job's [parallel] section to the runtime's plan: resolves and validates every degree
// against the world size and the model's shape before any communicator exists, so a bad
// combination fails at start-up on every rank with the same message (the equation that does not
// add up), never as a hang or a shape error deep inside a step.
#pragma once
#include <cstdint>

#include "job/job.hpp"
#include "parallel/mesh.hpp"
#include "parallel/schedule.hpp"

namespace exatrain::parallel {

struct RuntimePlan {
  MeshShape mesh;
  int zero = 0;
  int64_t micro_batch = 1;    // sequences per micro-batch
  int64_t micro_batches = 1;  // per optimizer step on each pipeline = global / (micro_batch * dp)
  bool seq_parallel = false;
  Recompute recompute = Recompute::none;
  PipelinePlan pipeline;      // pp, vp, schedule (interleaved when vp > 1), micro_batches
};

// world: the number of MPI ranks. Errors (exatrain::Error) name the key, the values and the rule:
//   "[parallel] tp is \"auto\": run `exatrain plan` first; `train` needs every degree resolved"
//   "[parallel] gpus = 8 but the job runs on 4 MPI ranks"
//   "[parallel] global_batch 10 is not divisible by micro_batch 2 * dp 4 = 8"
//   "[parallel] tp 3 must divide heads 8: 8 % 3 = 2"
RuntimePlan runtime_plan_from_job(const Job& job, int world);

}  // namespace exatrain::parallel
