// `exatrain check JOB.toml [--set k=v ...]`: validate a job file and print it fully resolved
// (presets applied, defaults explicit) — the quickest way to see what a run will use. When every
// [parallel] degree is set, the plan is validated as `predict` does (gpus = tp*pp*dp*cp, batch
// arithmetic, micro-batches >= stages, ...), with the failing equation, and the settings that have
// no effect on it get a note (plan::plan_notes) as comment lines.
#include <fmt/format.h>

#include "cli/commands.hpp"
#include "cli/job_plan.hpp"
#include "core/toml.hpp"
#include "job/parse.hpp"

#include <tuple>

namespace exatrain::cli {
void add_check_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("check", "validate a job file and print it fully resolved");
  auto path = std::make_shared<std::string>();
  auto sets = std::make_shared<std::vector<std::string>>();
  cmd->add_option("job", *path, "the job file (TOML)")->required();
  cmd->add_option("--set", *sets, "override a key: section.key=value (repeatable)");
  cmd->callback([path, sets] {
    Job job = load_job(*path, *sets, check_job_catalog);
    if (const std::string note = vocab_from_data(job); !note.empty()) fmt::print("# note: {}\n", note);
    // A resolved plan is validated; settings without effect on it get a note, as `predict` gives them.
    if (parallel_is_resolved(job.parallel))
      for (const std::string& note : plan::plan_notes(job, resolved_plan_of(job, *path)))
        fmt::print("# note: {}\n", note);
    // Where each section started from: a catalog preset by name, or a file of the user's own
    // (comments: the resolved TOML below is all a run uses).
    for (const auto& [section, preset, file] : {std::tuple("model", job.model.preset, job.model.preset_file),
                                                std::tuple("machine", job.machine.preset, job.machine.preset_file)}) {
      if (!file.empty())
        fmt::print("# [{}] preset_file = {}: a file of your own (not a catalog preset), applied below\n", section,
                   toml_text(toml::value(file)));
      else if (!preset.empty())
        fmt::print("# [{}] preset = {}: {}/{}.toml, applied below\n", section, toml_text(toml::value(preset)),
                   std::string(section) == "model" ? "models" : "catalog/clusters", preset);
    }
    fmt::print("{}", job_to_toml(job));
  });
}
}  // namespace exatrain::cli
