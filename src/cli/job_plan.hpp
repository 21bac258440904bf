// The job's [parallel] as the planner's Plan, for the commands that need one resolved plan
// (predict, check): errors name the job file and print the failing equation.
#pragma once
#include <string>

#include "job/job.hpp"
#include "plan/plan.hpp"

namespace exatrain::cli {

// Throws Error "<path>: ..." when a field is "auto" or the degrees do not add up.
plan::Plan resolved_plan_of(const Job& job, const std::string& path);

// True when every [parallel] field a plan needs is set (dp may be omitted: it defaults).
bool parallel_is_resolved(const ParallelSpec& p);

}  // namespace exatrain::cli
