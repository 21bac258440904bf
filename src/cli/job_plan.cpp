#include "cli/job_plan.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>

#include "catalog/device.hpp"
#include "core/check.hpp"
#include "data/manifest.hpp"
#include "job/parse.hpp"
#include "plan/flops.hpp"
#include "plan/plan.hpp"
#include "train/session.hpp"

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

std::string vocab_from_data(Job& job) {
  if (!job.model.vocab_from_data) return "";
  if (job.train.data.empty()) {  // the bundled corpus: its vocabulary is known before it is prepared
    job.model.vocab = kBundledVocab;
    return fmt::format("[model] vocab = {}: the bundled corpus's tokenizer, which `train` uses for a job that leaves "
                       "vocab and [train] data to it", job.model.vocab);
  }
  const std::string manifest = (std::filesystem::path(job.train.data) / data::kManifestName).string();
  if (!std::filesystem::exists(manifest))
    return fmt::format("[model] vocab = {} (the default): the job leaves vocab to its data, and [train] data = \"{}\" "
                       "is not prepared yet (no {}); `train` takes its tokenizer's vocabulary", job.model.vocab,
                       job.train.data, manifest);
  try {
    job.model.vocab = int64_t(data::read_manifest(job.train.data).vocab_size);
  } catch (const Error& e) {
    return fmt::format("[model] vocab = {} (the default): the job leaves vocab to its data, and [train] data = \"{}\" "
                       "cannot be read: {}", job.model.vocab, job.train.data, e.what());
  }
  return fmt::format("[model] vocab = {}: the tokenizer's of [train] data = \"{}\", which `train` uses because the "
                     "job leaves vocab to its data", job.model.vocab, job.train.data);
}

bool parallel_is_resolved(const ParallelSpec& p) {
  return p.tp && p.pp && p.zero && p.micro_batch && p.recompute;
}

}  // namespace exatrain::cli
