// The job resolved ONCE into the plan `train` runs, for a run on `world` ranks; everything below
// the training loop receives this plan and checks nothing of the job again.
//
//   training_job_problems  what the file alone must satisfy to train on `world` ranks (precision,
//                          steps, gpus against the world, degrees a single process cannot run),
//                          every problem at once: `train` passes them to load_job, which reports
//                          them with the file's own problems (check_training_job: as one error)
//   fill_auto_parallel     [parallel] fields left "auto" or omitted: on one rank the single-process
//                          defaults (every degree 1, ZeRO 0, micro_batch 1, no recomputation); on
//                          several, the planner's best plan on the `local` machine that this runtime
//                          can run (printed to `log`)
//   plan_from_job          the fully set [parallel] as a Plan, dp inferred (world / (tp cp pp)),
//                          checked by plan/plan.hpp's rules (Purpose::train): an error names the
//                          origins of the keys and the equation that fails
//   resolve_training_plan  the three in order, once per run (train/session.cpp)
//   framework_not_run_here what the job plans ([parallel] overlap_*, tp_comm_overlap,
//                          recompute_early_stop; ZeRO 3's prefetch) that this trainer runs otherwise
//                          (plan.hpp as_run_here, with which `report` predicts a run, `calibrate` fits
//                          to one, and `auto` fields are searched)
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
// The three in order, on a job that passed check_training_job (the session checks it first,
// before any data is prepared; `train` already at load_job, with the file's own problems); the
// job's inferred dp and gpus are written back, so that the run's job.toml says which.
Plan resolve_training_plan(Job& job, int world, std::FILE* log);

// A line for each framework behaviour of the job's [parallel] (on `plan`'s degrees) that this
// trainer runs otherwise (plan.hpp as_run_here) where it acts on this plan, e.g.
// "overlap_param_gather = true: this trainer all-gathers the updated weights after the optimizer
// step, before the next forward". `set_only`: only keys the job sets (what `train` says at start);
// else the defaults too, and ZeRO 3's prefetch (what `report` says under its prediction).
std::vector<std::string> framework_not_run_here(const Job& job, const Plan& plan, bool set_only);

}  // namespace exatrain::plan
