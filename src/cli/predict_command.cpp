// `exatrain predict JOB.toml [--json] [--set k=v ...]`: the performance and memory model of one
// fully specified plan (../shared/contracts/job-file.md).
#include <fmt/format.h>

#include <cmath>

#include "cli/commands.hpp"
#include "cli/job_plan.hpp"
#include "core/check.hpp"
#include "job/parse.hpp"
#include "plan/calibrate.hpp"
#include "plan/comm.hpp"
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
  auto rank = std::make_shared<int64_t>(-1);
  cmd->add_option("--rank-bytes", *rank,
                  "print the exact bytes this rank sends per step per collective kind (JSON; the "
                  "convention is in src/plan/comm.hpp) instead of the prediction");
  auto calibration = std::make_shared<std::string>();
  cmd->add_option("--calibration", *calibration, "a calibration file of `exatrain calibrate` (this machine's constants)");
  cmd->callback([path, sets, json, rank, calibration] {
    Job job = load_job(*path, *sets, check_job_catalog);
    const std::string vocab_note = vocab_from_data(job);  // the vocabulary `train` will use
    const plan::Plan p = resolved_plan_of(job, *path);
    if (*rank >= 0) {  // JSON on stdout: the vocabulary's note, which changes the bytes, on stderr
      if (!vocab_note.empty()) fmt::print(stderr, "note: {}\n", vocab_note);
      plan::CommBytes b = plan::bytes_sent_per_step(job.model, p, plan::rank_position(p, *rank));
      nlohmann::json j;
      for (int k = 0; k < plan::kCommKinds; ++k)
        j[plan::to_string(plan::CommKind(k))] = b.bytes[size_t(k)];
      fmt::print("{}\n", j.dump(2));
      return;
    }
    plan::check_machine_for_plan(job.machine, p, *path);
    const plan::Calibration cal = plan::calibration_for(*calibration, job.machine.device);
    plan::Prediction pred = plan::predict(job.model, job.machine, p, cal);
    std::vector<std::string> notes = plan::plan_notes(job, p);
    if (!vocab_note.empty()) notes.push_back(vocab_note);
    if (!std::isfinite(pred.step_time_s))
      throw Error(fmt::format("{}: predicted step time is {} (check the [machine] and device "
                              "figures: a bandwidth or peak of 0?)", *path, pred.step_time_s));
    if (*json) {
      nlohmann::json j = plan::to_json(pred);
      j["notes"] = notes;
      fmt::print("{}\n", j.dump(2));
    } else {
      fmt::print("{}", plan::to_table(pred, job.model));
      for (const auto& n : notes) fmt::print("note: {}\n", n);
    }
  });
}
}  // namespace exatrain::cli
