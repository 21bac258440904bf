#include "cli/job_plan.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "catalog/device.hpp"
#include "core/check.hpp"
#include "job/parse.hpp"
#include "plan/flops.hpp"
#include "plan/plan.hpp"

namespace exatrain::cli {

plan::Plan resolved_plan_of(const Job& job, const std::string& path) {
  plan::Plan p;
  try {
    p = plan::resolve_plan(job);
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

void check_job_catalog(const Job& job, std::vector<std::string>& errors) {
  const auto& devices = all_devices();
  if (std::none_of(devices.begin(), devices.end(), [&](const Device& d) { return d.name == job.machine.device; })) {
    std::string known;
    for (const Device& d : devices) known += (known.empty() ? "" : ", ") + d.name;
    errors.push_back(fmt::format("{}: [machine] device = \"{}\": expected a device of {}/devices.toml ({})",
                                 job_origin(job, {"machine.device"}), job.machine.device, catalog_dir(), known));
  }
  if (std::string e = plan::model_size_problem(job.model); !e.empty())
    errors.push_back(fmt::format("{}: {}", job_origin(job, {"model.layers", "model.hidden", "model.ffn_hidden",
                                                             "model.vocab"}), e));
}

bool parallel_is_resolved(const ParallelSpec& p) {
  return p.tp && p.pp && p.zero && p.micro_batch && p.recompute;
}

}  // namespace exatrain::cli
