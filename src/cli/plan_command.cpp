// `exatrain plan JOB.toml [--json] [--top K] [--set k=v ...]`: fill every auto/omitted field of
// [parallel] by exhaustive search and rank the plans that fit by predicted step time, for the
// job's [train] optimizer. `--optimizers a,b,...` / `--compare-optimizers` (every optimizer):
// the search once per optimizer, one row each (docs/planner.md, "Comparing optimizers").
#include <fmt/format.h>

#include <algorithm>
#include <sstream>

#include "cli/commands.hpp"
#include "cli/prediction_chart.hpp"
#include "cli/job_plan.hpp"
#include "core/check.hpp"
#include "job/parse.hpp"
#include "plan/calibrate.hpp"
#include "plan/predict.hpp"
#include "plan/search.hpp"

namespace exatrain::cli {
namespace {

constexpr double kGiB = double(1 << 30);
// Said with every comparison, in the text and in the JSON.
constexpr const char* kPerStepNote =
    "per-step cost and memory only: the planner does not predict how many steps each optimizer needs "
    "to reach a loss (that is measured by training, the optimizer benchmark of docs/optimizers.md)";

// "--optimizers adamw,muon": the names, each one of optimizer_names(); an Error names the value.
std::vector<std::string> optimizer_list(const std::string& text) {
  const std::vector<std::string>& known = optimizer_names();
  std::string choices;
  for (const std::string& n : known) choices += (choices.empty() ? "" : ", ") + n;
  std::vector<std::string> out;
  std::stringstream in(text);
  for (std::string name; std::getline(in, name, ',');) {
    if (std::find(known.begin(), known.end(), name) == known.end())
      throw Error(fmt::format("--optimizers {}: \"{}\" is not an optimizer; expected a comma-separated list of {}",
                              text, name, choices));
    if (std::find(out.begin(), out.end(), name) == out.end()) out.push_back(name);
  }
  if (out.empty()) throw Error(fmt::format("--optimizers \"{}\": expected a comma-separated list of {}", text, choices));
  return out;
}

nlohmann::json comparison_json(const std::vector<plan::OptimizerSearch>& rows) {
  nlohmann::json j;
  j["note"] = kPerStepNote;
  j["optimizers"] = nlohmann::json::array();
  for (const plan::OptimizerSearch& r : rows) {
    nlohmann::json o = {{"optimizer", r.optimizer}, {"searched", r.result.searched}, {"feasible", r.result.feasible},
                        {"fits", !r.result.top.empty()}};
    if (r.result.top.empty()) {
      o["best"] = nullptr;
    } else {
      const plan::Prediction& b = r.result.top.front();
      o["best"] = plan::to_json(b);
      o["step_time_s"] = b.step_time_s;
      o["optimizer_s"] = b.breakdown.optimizer;
      o["optimizer_state_gib"] = b.memory.optimizer / kGiB;
      o["memory_gib"] = b.memory.total / kGiB;
    }
    j["optimizers"].push_back(o);
  }
  return j;
}

void print_comparison(const std::vector<plan::OptimizerSearch>& rows) {
  std::vector<std::string> plans;  // the best plan of each, or why there is none
  size_t width = 9;
  for (const plan::OptimizerSearch& r : rows) {
    plans.push_back(r.result.top.empty()
                        ? fmt::format("no plan fits ({} valid plans searched)", r.result.searched)
                        : plan::plan_summary(r.result.top.front().plan));
    width = std::max(width, plans.back().size());
  }
  fmt::print("{:<10} {:<{}} {:>9} {:>11} {:>9} {:>9} {}\n", "optimizer", "best plan", width, "step s", "optimizer s",
             "state GiB", "mem GiB", "fits");
  for (size_t i = 0; i < rows.size(); ++i) {
    const plan::OptimizerSearch& r = rows[i];
    if (r.result.top.empty()) {
      fmt::print("{:<10} {:<{}} {:>9} {:>11} {:>9} {:>9} {}\n", r.optimizer, plans[i], width, "-", "-", "-", "-", "no");
      continue;
    }
    const plan::Prediction& b = r.result.top.front();
    fmt::print("{:<10} {:<{}} {:>9.4g} {:>11.4g} {:>9.2f} {:>9.1f} {}\n", r.optimizer, plans[i], width, b.step_time_s,
               b.breakdown.optimizer, b.memory.optimizer / kGiB, b.memory.total / kGiB, "yes");
  }
  fmt::print("\n{}.\n", kPerStepNote);
}

// What the search found, refused with the reason when nothing was valid or nothing fits.
void refuse_empty_search(const plan::SearchResult& res, const Job& job, const std::string& path, double headroom) {
  if (res.searched == 0)
    throw Error(fmt::format(
        "{}: no valid plan for gpus = {} and global_batch = {}: every split gpus = tp * pp * "
        "dp * cp breaks a rule (tp | heads and ffn_hidden, pp * vp | layers, dp * micro_batch "
        "| global_batch, micro-batches >= pp); try a global_batch divisible by more of gpus' "
        "factors", path, job.parallel.gpus, job.parallel.global_batch));
  if (res.top.empty())
    throw Error(fmt::format(
        "{}: no plan fits: {} valid plans searched for {} GPUs and global_batch {}, none fits "
        "in the device's memory ({}) less the {:.0f}% headroom (--memory-headroom)", path,
        res.searched, job.parallel.gpus, job.parallel.global_batch, job.machine.device,
        100 * headroom));
}

nlohmann::json search_json(const plan::SearchResult& res) {
  nlohmann::json j;
  j["best"] = plan::to_json(res.top.front());
  j["candidates"] = nlohmann::json::array();
  for (const auto& c : res.top) j["candidates"].push_back(plan::to_json(c));
  if (res.best_other_layout) j["best_other_layout"] = plan::to_json(*res.best_other_layout);
  j["searched"] = res.searched;
  j["feasible"] = res.feasible;
  j["evaluated"] = res.evaluated;
  j["search_time_s"] = res.seconds;
  return j;
}

// The listed plans, the winner's breakdown, and why it beats the runner-up and the best plan of
// another layout.
void print_search(const plan::SearchResult& res, const Job& job) {
  fmt::print("searched {} plans ({} fit in memory) in {:.3f} s\n\n", res.searched, res.feasible,
             res.seconds);
  fmt::print("{:>3} {:<72} {:>9} {:>7} {:>9}\n", "#", "plan", "step s", "MFU%", "mem GiB");
  for (size_t i = 0; i < res.top.size(); ++i) {
    const auto& c = res.top[i];
    fmt::print("{:>3} {:<72} {:>9.4g} {:>7.1f} {:>9.1f}\n", i + 1, plan::plan_summary(c.plan),
               c.step_time_s, 100 * c.mfu, c.memory.total / double(1 << 30));
  }
  fmt::print("\n{}", plan::to_table(res.top.front(), job.model));
  if (res.top.size() > 1) fmt::print("\n{}", plan::explain_choice(res.top[0], res.top[1]));
  if (res.best_other_layout &&
      (res.top.size() < 2 ||
       plan::plan_summary(res.best_other_layout->plan) != plan::plan_summary(res.top[1].plan)))
    fmt::print("\nagainst the best plan with another tp/pp/dp/cp layout:\n{}",
               plan::explain_choice(res.top[0], *res.best_other_layout));
}

struct PlanArgs {
  std::string path;
  std::vector<std::string> sets;
  bool json = false;
  int top = 5;
  double headroom = 0.10;
  std::string svg, optimizers, calibration;
  bool compare = false;
};

void run_plan(const PlanArgs& a) {
  Job job = load_job(a.path, a.sets, check_job_catalog);
  const std::string vocab_note = vocab_from_data(job);  // the vocabulary `train` will use
  const plan::Calibration cal = plan::calibration_for(a.calibration, job.machine.device);
  {
    plan::Plan probe;
    probe.gpus = job.parallel.gpus;
    plan::check_machine_for_plan(job.machine, probe, a.path);
  }
  if (a.compare || !a.optimizers.empty()) {
    if (!a.svg.empty()) throw Error("--svg draws one optimizer's plans: leave it out with --optimizers");
    const std::vector<std::string> names = a.compare ? optimizer_names() : optimizer_list(a.optimizers);
    const auto rows = plan::compare_optimizers(job.model, job.machine, job.parallel, job.train, names, 1, cal,
                                               a.headroom);
    if (a.json) {
      nlohmann::json j = comparison_json(rows);
      if (!vocab_note.empty()) j["notes"] = {vocab_note};
      fmt::print("{}\n", j.dump(2));
    } else {
      print_comparison(rows);
      if (!vocab_note.empty()) fmt::print("note: {}\n", vocab_note);
    }
    return;
  }
  plan::SearchResult res =
      plan::search_plans(job.model, job.machine, job.parallel, job.train, a.top, cal, a.headroom);
  refuse_empty_search(res, job, a.path, a.headroom);
  if (!a.svg.empty()) {
    std::vector<LabelledPrediction> bars;
    for (size_t i = 0; i < res.top.size(); ++i)
      bars.push_back({fmt::format("#{} {}", i + 1, plan::plan_summary(res.top[i].plan)), plan::to_json(res.top[i]), ""});
    write_prediction_svg(bars, fmt::format("{} best plans", res.top.size()), a.svg);
  }
  if (a.json) {
    nlohmann::json j = search_json(res);
    if (!vocab_note.empty()) j["notes"] = {vocab_note};
    fmt::print("{}\n", j.dump(2));
  } else {
    print_search(res, job);
    if (!vocab_note.empty()) fmt::print("note: {}\n", vocab_note);
  }
}

}  // namespace

void add_plan_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("plan", "search the best parallel plan for a job");
  auto a = std::make_shared<PlanArgs>();
  cmd->add_option("job", a->path, "the job file (TOML)")->required();
  cmd->add_option("--set", a->sets, "override a key: section.key=value (repeatable)");
  cmd->add_flag("--json", a->json, "print the contract's JSON object");
  cmd->add_option("--top", a->top, "how many candidates to list (default 5)")->check(CLI::Range(1, 1000000));
  cmd->add_option("--memory-headroom", a->headroom,
                  "fraction of device memory a plan must leave free (default 0.10: the memory "
                  "model's error, docs/planner.md)")
      ->check(CLI::Range(0.0, 0.9));
  cmd->add_option("--svg", a->svg, "also draw the listed plans' time and memory breakdowns as bars (SVG)");
  cmd->add_option("--optimizers", a->optimizers,
                  "compare optimizers: the search once per optimizer of this comma-separated list "
                  "(e.g. adamw,muon,shampoo,soap), one row each: per-step time and memory only");
  cmd->add_flag("--compare-optimizers", a->compare, "the same for every optimizer of [train] optimizer");
  cmd->add_option("--calibration", a->calibration, "a calibration file of `exatrain calibrate` (this machine's constants)");
  cmd->callback([a] { run_plan(*a); });
}
}  // namespace exatrain::cli
