// The job resolved ONCE into the plan `train` runs, for a run on `world` ranks; everything below
// the training loop receives this plan and checks nothing of the job again.
//
//   training_job_problems  what the file alone must satisfy to train on `world` ranks (precision,
//                          steps, gpus against the world, degrees a single process cannot run),
//                          every problem at once: load_job reports them with the file's own
//   fill_auto_parallel     [parallel] fields left "auto" or omitted: on one rank the single-process
//                          defaults (every degree 1, ZeRO 0, micro_batch 1, no recomputation); on
//                          several, the planner's best plan on the `local` machine that this runtime
//                          can run (printed to `log`)
//   plan_from_job          the fully set [parallel] as a Plan, dp inferred (world / (tp cp pp)),
//                          checked by plan/plan.hpp's rules (Purpose::train): an error names the
//                          origins of the keys and the equation that fails
//
// Owns: the path from a Job to the plan `train` runs. May use: job/, catalog/, plan/.
#pragma once
#include <cstdio>
#include <string>
#include <vector>

#include "job/job.hpp"
#include "plan/plan.hpp"

namespace exatrain::plan {

void training_job_problems(const Job& job, int world, std::vector<std::string>& errors);
// Throws one error listing training_job_problems (none: returns).
void check_training_job(const Job& job, int world);
void fill_auto_parallel(Job& job, int world, std::FILE* log);
Plan plan_from_job(const Job& job, int world);
// The three in order (training_job_problems thrown as one error listing them); the job's
// inferred dp and gpus are written back, so that the run's job.toml says which.
Plan resolve_training_plan(Job& job, int world, std::FILE* log);

}  // namespace exatrain::plan
