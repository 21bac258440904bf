// The job's [parallel] as the planner's Plan, for the commands that need one resolved plan
// (predict, check): errors name the job file and print the failing equation.
#pragma once
#include <string>
#include <vector>

#include "job/job.hpp"
#include "plan/plan.hpp"

namespace exatrain::cli {

// Throws Error "<path>: ..." when a field is "auto" or the degrees do not add up.
plan::Plan resolved_plan_of(const Job& job, const std::string& path);

// What every command that reads a job (check, predict, plan, train) checks beyond the file's own
// rules, one line per problem, reported together with them (pass it to load_job): the
// [machine] device is one of the catalog's, and the model's parameters can be counted.
void check_job_catalog(const Job& job, std::vector<std::string>& errors);

// Where [model] leaves vocab to the data (ModelSpec::vocab_from_data), the vocabulary `train` will
// use, so that check, predict, plan and sweep see the model `train` builds: the bundled corpus's
// (train/session.hpp kBundledVocab) for a job without [train] data, else the tokenizer's of its
// prepared dataset (its manifest), which replaces the default in `job`. Returns a note saying which,
// or why the default stands (the dataset is not prepared yet, or unreadable); "" when the job sets
// vocab. Reads nothing and prepares nothing for the bundled corpus, so the answer does not depend on
// whether a cache exists.
std::string vocab_from_data(Job& job);

// True when every [parallel] field a plan needs is set (dp may be omitted: it defaults).
bool parallel_is_resolved(const ParallelSpec& p);

}  // namespace exatrain::cli
