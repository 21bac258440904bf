// `exatrain sweep JOB.toml --vary section.key=V1,V2,... [--set k=v ...] [--svg FILE] [--json]`:
// `predict` of the same job once per value of one key, side by side — what changes when one
// setting changes (ZeRO stage, tp, micro-batch, recomputation, a machine figure). A value that
// makes the plan invalid gets its row with the reason instead of ending the sweep.
#include <fmt/format.h>

#include <cmath>
#include <set>

#include "cli/commands.hpp"
#include "cli/job_plan.hpp"
#include "cli/prediction_chart.hpp"
#include "core/check.hpp"
#include "job/parse.hpp"
#include "plan/predict.hpp"

namespace exatrain::cli {
namespace {
struct Vary {
  std::string key;
  std::vector<std::string> values;
};
Vary parse_vary(const std::string& s) {
  const auto eq = s.find('=');
  EXA_CHECK(eq != std::string::npos && eq > 0 && s.find('.') < eq && eq + 1 < s.size(),
            "sweep: --vary '{}': expected section.key=V1,V2,... (e.g. parallel.zero=0,1,2,3)", s);
  Vary v{s.substr(0, eq), {}};
  // Values are separated by commas outside brackets, so that a list is one value:
  // parallel.layers_per_stage=[6,6],[9,3].
  std::string value;
  int depth = 0;
  for (char c : s.substr(eq + 1) + ",") {
    depth += c == '[' ? 1 : c == ']' ? -1 : 0;
    if (c != ',' || depth > 0) { value += c; continue; }
    EXA_CHECK(!value.empty(), "sweep: --vary '{}': an empty value in the list", s);
    v.values.push_back(value);
    value.clear();
  }
  EXA_CHECK(depth == 0, "sweep: --vary '{}': unbalanced brackets", s);
  return v;
}
// The job's own message without the internal (src/...:line) suffix: a row of the table.
std::string short_message(std::string msg) {
  const auto k = msg.rfind(" (");
  if (k != std::string::npos && msg.find(".cpp:", k) != std::string::npos) msg.erase(k);
  const auto nl = msg.find('\n');
  if (nl != std::string::npos) {  // several problems: keep them on one line
    std::string one;
    for (char c : msg) one += c == '\n' ? ' ' : c;
    msg = one;
  }
  return msg;
}
// `vocab_note`: vocab_from_data's note for this value's job (cli/job_plan.hpp).
LabelledPrediction predict_variant(const std::string& path, std::vector<std::string> sets, const Vary& vary,
                                   const std::string& value, std::string& vocab_note) {
  LabelledPrediction out{value, nullptr, ""};
  sets.push_back(vary.key + "=" + value);
  // A bad key or a value of the wrong type is the user's mistake in every row: let it end the sweep.
  Job job = load_job(path, sets);
  vocab_note = vocab_from_data(job);  // the vocabulary `train` will use
  try {
    const plan::Plan p = resolved_plan_of(job, path);
    plan::check_machine_for_plan(job.machine, p, path);
    plan::Prediction pred = plan::predict(job.model, job.machine, p);
    EXA_CHECK(std::isfinite(pred.step_time_s), "{}: predicted step time is {}", path, pred.step_time_s);
    out.pred = plan::to_json(pred);
  } catch (const Error& e) {
    out.error = short_message(e.what());
  }
  return out;
}
}  // namespace

void add_sweep_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("sweep", "predict one job for several values of one key, side by side");
  struct Opts {
    std::string path, vary, svg;
    std::vector<std::string> sets;
    bool json = false;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("job", o->path, "the job file (TOML)")->required();
  cmd->add_option("--vary", o->vary, "the key and its values: section.key=V1,V2,... (e.g. parallel.zero=0,1,2,3)")
      ->required();
  cmd->add_option("--set", o->sets, "override a key for every value: section.key=value (repeatable)");
  cmd->add_option("--svg", o->svg, "also draw the time and memory breakdowns as bars (SVG)");
  cmd->add_flag("--json", o->json, "print a JSON array: {value, prediction} or {value, error} per value");
  cmd->callback([o] {
    const Vary vary = parse_vary(o->vary);
    std::vector<LabelledPrediction> preds;
    std::vector<std::string> notes(vary.values.size());  // vocab_from_data's, per value
    for (size_t i = 0; i < vary.values.size(); ++i)
      preds.push_back(predict_variant(o->path, o->sets, vary, vary.values[i], notes[i]));
    const std::set<std::string> vocab_notes(notes.begin(), notes.end());  // printed once each
    if (o->json) {
      nlohmann::json j = nlohmann::json::array();
      for (size_t i = 0; i < preds.size(); ++i) {
        const auto& p = preds[i];
        j.push_back(p.error.empty() ? nlohmann::json{{"value", p.label}, {"prediction", p.pred}}
                                    : nlohmann::json{{"value", p.label}, {"error", p.error}});
        if (!notes[i].empty()) j.back()["notes"] = {notes[i]};
      }
      fmt::print("{}\n", j.dump(2));
    } else {
      fmt::print("sweep of {} over {} ({} values)\n{}", vary.key, o->path, preds.size(),
                 prediction_tables(preds, vary.key));
      for (const std::string& n : vocab_notes)
        if (!n.empty()) fmt::print("note: {}\n", n);
    }
    if (!o->svg.empty()) {
      write_prediction_svg(preds, vary.key, o->svg);
      if (!o->json) fmt::print("plot: {}\n", o->svg);
    }
  });
}
}  // namespace exatrain::cli
