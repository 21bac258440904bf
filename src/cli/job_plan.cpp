#include "cli/job_plan.hpp"

#include <fmt/format.h>

#include "core/check.hpp"
#include "plan/plan.hpp"

namespace exatrain::cli {

plan::Plan resolved_plan_of(const Job& job, const std::string& path) {
  plan::Plan p;
  try {
    p = plan::resolve_plan(job.parallel, job.train.precision);
  } catch (const Error& e) {  // name the job file; drop the internal (src/...:line) suffix
    std::string msg = e.what();
    auto k = msg.rfind(" (");
    if (k != std::string::npos && msg.find(".cpp:", k) != std::string::npos) msg.erase(k);
    throw Error(fmt::format("{}: {}", path, msg));
  }
  // Plan errors name the job file and print the failing equation (no source-line suffix).
  if (std::string err = plan::plan_error(job.model, p); !err.empty())
    throw Error(fmt::format("{}: invalid plan: {}", path, err));
  return p;
}

bool parallel_is_resolved(const ParallelSpec& p) {
  return p.tp && p.pp && p.zero && p.micro_batch && p.recompute;
}

}  // namespace exatrain::cli
