// `exatrain predict JOB.toml [--json] [--set k=v ...]`: the performance and memory model of one
// fully specified plan (../shared/contracts/job-file.md).
#include <fmt/format.h>

#include "cli/commands.hpp"
#include "job/parse.hpp"
#include "plan/predict.hpp"

namespace exatrain::cli {
void add_predict_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("predict", "predict step time, MFU and memory of one plan");
  auto path = std::make_shared<std::string>();
  auto sets = std::make_shared<std::vector<std::string>>();
  auto json = std::make_shared<bool>(false);
  cmd->add_option("job", *path, "the job file (TOML)")->required();
  cmd->add_option("--set", *sets, "override a key: section.key=value (repeatable)");
  cmd->add_flag("--json", *json, "print the contract's JSON object");
  cmd->callback([path, sets, json] {
    Job job = load_job(*path, *sets);
    plan::Plan p = plan::resolve_plan(job.parallel, job.train.precision);
    plan::Prediction pred = plan::predict(job.model, job.machine, p);
    if (*json) fmt::print("{}\n", plan::to_json(pred).dump(2));
    else fmt::print("{}", plan::to_table(pred, job.model));
  });
}
}  // namespace exatrain::cli
