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
//   as_run_here            a planner's plan of one of this trainer's runs with the framework
//                          behaviours ([parallel] overlap_*, tp_comm_overlap, recompute_early_stop)
//                          as this trainer runs them: `report` predicts a run, and `calibrate` fits
//                          to one, with it; framework_not_run_here says which the job plans otherwise
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

// `planned` with this trainer's framework behaviours (parallel/grad_sync.hpp, train/trainer.cpp):
// ZeRO 0 and 2 reduce bucket by bucket under the backward, ZeRO 1 reduce-scatters once after the
// last micro-batch (overlap_grad_reduce: true at ZeRO 0 and 2, false at 1; ZeRO 3's per-unit model
// has no such flag); ZeRO 1 and 2 all-gather the updated weights after the optimizer step (no
// overlap_param_gather); tensor-parallel collectives and pipeline sends block (no tp_comm_overlap,
// no overlap_p2p_comm); full recomputation re-runs whole layers (no recompute_early_stop).
Plan as_run_here(Plan planned);
// A line for each framework behaviour of the job's [parallel] (on `plan`'s degrees) that this
// trainer runs otherwise (as_run_here) where it acts on this plan, e.g. "overlap_p2p_comm = true:
// this trainer's pipeline sends and receives block". `set_only`: only keys the job sets (what
// `train` says at start); else the defaults too (what `report` says under its prediction).
std::vector<std::string> framework_not_run_here(const Job& job, const Plan& plan, bool set_only);

}  // namespace exatrain::plan
