#include "report/report.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <map>

#include <fmt/format.h>

#include "core/check.hpp"
#include "job/parse.hpp"
#include "plan/calibrate.hpp"
#include "plan/plan.hpp"
#include "plan/predict.hpp"
#include "plan/resolve.hpp"
#include "report/metrics.hpp"
#include "report/svg_chart.hpp"

namespace exatrain::report {
namespace {
double median(std::vector<double> v) {
  if (v.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
bool is_step(const nlohmann::json& r) { return r.contains("step") && r.contains("loss"); }
bool is_eval(const nlohmann::json& r) { return r.contains("step") && r.contains("val_loss"); }

// A run's job.toml with the trainer's defaults for what it leaves open (docs/job-file.md), as the
// planner's plan of what this trainer ran: its framework behaviours, whatever the job plans
// (plan::as_run_here; measured_vs_predicted says where they differ).
std::pair<Job, plan::Plan> job_and_plan(const std::string& run_dir) {
  Job job = load_job(run_dir + "/job.toml");
  ParallelSpec& p = job.parallel;
  for (auto* d : {&p.tp, &p.pp, &p.cp, &p.vp, &p.micro_batch}) if (!*d) *d = 1;
  if (!p.dp) p.dp = p.gpus / (*p.tp * *p.pp * *p.cp);
  if (!p.zero) p.zero = 0;
  if (!p.recompute) p.recompute = Recompute::none;
  if (!p.seq_parallel) p.seq_parallel = false;
  if (!p.schedule) p.schedule = Schedule::one_f_one_b;
  return {job, plan::as_run_here(plan::resolve_plan(job))};
}

// The planner's prediction of the run's own job with `cal` (the shipped constants, or those of the
// calibration file `calibration` names); `why` gets the reason when the job cannot be predicted (an
// unknown device among them). A calibration of another device than the job's is an Error: the user
// named it, so it is their mistake to hear about, not a job the planner cannot predict
// (measured_vs_predicted reads the file itself first, so that an unreadable one is an Error whatever
// the job).
plan::Prediction predict_run(const std::string& run_dir, const std::string& calibration, const plan::Calibration& cal,
                             std::string& why) {
  plan::Prediction pred;
  std::string device;
  try {
    auto [job, p] = job_and_plan(run_dir);
    // A machine that cannot carry this plan's traffic (e.g. no [machine] in the job: bandwidth 0)
    // gives no prediction, with the reason, rather than an infinite one.
    plan::check_machine_for_plan(job.machine, p, run_dir + "/job.toml");
    pred = plan::predict(job.model, job.machine, p, cal);
    device = job.machine.device;
  } catch (const std::exception& e) {
    why = e.what();
    return {};
  }
  // After the prediction, which has looked the device up: a job on an unknown one has said so above.
  if (!calibration.empty()) plan::check_calibration_device(calibration, device);
  return pred;
}

// The framework behaviours the run's job plans and this trainer does not run (the defaults
// included): the prediction above has this trainer's (job_and_plan).
std::vector<std::string> not_run_here(const std::string& run_dir) {
  auto [job, p] = job_and_plan(run_dir);
  return plan::framework_not_run_here(job, p, /*set_only=*/false);
}

// Seconds per step over the steps after the first (which includes warm-up).
std::vector<double> step_seconds(const std::vector<nlohmann::json>& records) {
  std::vector<double> out;
  int64_t n = 0;
  for (const auto& r : records)
    if (is_step(r) && n++ > 0 && r.contains("seconds")) out.push_back(r["seconds"].get<double>());
  return out;
}
}  // namespace

plan::MeasuredRun measured_run(const std::string& run_dir) {
  const std::vector<double> steps = step_seconds(read_metrics(run_dir + "/metrics.jsonl"));
  EXA_CHECK(!steps.empty(), "{}/metrics.jsonl has no timed training step after the first (expected lines with \"step\", "
            "\"loss\" and \"seconds\"; the first step is warm-up and not used)", run_dir);
  auto [job, p] = job_and_plan(run_dir);
  plan::check_machine_for_plan(job.machine, p, run_dir + "/job.toml");
  plan::MeasuredRun r;
  r.group = r.label = run_dir;
  r.model = job.model, r.machine = job.machine, r.plan = p;
  r.step_s = median(steps);
  return r;
}

RunSummary summarize(const std::vector<nlohmann::json>& records) {
  RunSummary s;
  s.best_val_loss = std::numeric_limits<double>::quiet_NaN();
  std::vector<double> tps, mfu;
  for (const auto& r : records) {
    if (is_step(r)) {
      double loss = r["loss"].get<double>();
      if (s.steps == 0) s.first_loss = loss;
      s.last_loss = loss;
      ++s.steps;
      // The first step includes warm-up (page faults, thread start): leave it out of medians.
      if (s.steps > 1 && r.contains("tokens_per_s")) tps.push_back(r["tokens_per_s"].get<double>());
      if (s.steps > 1 && r.contains("mfu")) mfu.push_back(r["mfu"].get<double>());
    }
    if (r.contains("skipped_steps") && r["skipped_steps"].is_number_integer() && r.contains("loss_scale") &&
        r["loss_scale"].is_number()) {  // fp16 loss scaling (train/trainer.hpp metrics_json)
      if (s.skipped_steps < 0) s.first_loss_scale = r["loss_scale"].get<double>();
      s.skipped_steps = r["skipped_steps"].get<int64_t>();
      s.last_loss_scale = r["loss_scale"].get<double>();
    }
    if (is_eval(r)) {
      double v = r["val_loss"].get<double>();
      if (!(v >= s.best_val_loss)) s.best_val_loss = v, s.best_val_step = r["step"].get<int64_t>();
    }
  }
  s.median_tokens_per_s = median(tps);
  s.median_mfu = median(mfu);
  return s;
}

std::string measured_vs_predicted(const std::vector<nlohmann::json>& records, const std::string& run_dir,
                                  const std::string& calibration) {
  static const char* kParts[] = {"compute", "tp_comm", "cp_comm", "pp_comm", "pp_bubble", "dp_comm", "optimizer", "other"};
  // First, whatever the run holds: a calibration file that cannot be read is an Error.
  const plan::Calibration cal = calibration.empty() ? plan::default_calibration() : plan::load_calibration(calibration);
  // Measured: per step, the slowest rank's seconds in each part; then the median over steps.
  std::map<std::string, std::vector<double>> parts;
  std::vector<double> step_s;
  int64_t n = 0;
  for (const auto& r : records) {
    if (!is_step(r) || n++ == 0) continue;  // the first step includes warm-up
    if (r.contains("seconds")) step_s.push_back(r["seconds"].get<double>());
    if (r.contains("breakdown_s_per_rank"))
      for (const char* part : kParts) {
        double worst = 0;
        for (const auto& rank : r["breakdown_s_per_rank"]) worst = std::max(worst, rank.value(part, 0.0));
        parts[part].push_back(worst);
      }
  }
  if (step_s.empty()) return "";
  std::string why;
  const plan::Prediction pred = predict_run(run_dir, calibration, cal, why);
  const std::vector<std::string> differs = why.empty() ? not_run_here(run_dir) : std::vector<std::string>{};
  std::string out = fmt::format("  measured vs predicted (median s per step; prediction: `exatrain predict{}` of this "
                                "run's job{})\n", calibration.empty() ? "" : " --calibration " + calibration,
                                differs.empty() ? "" : ", as this trainer ran it (below)");
  out += fmt::format("    {:<10} {:>10} {:>10}\n", "part", "measured", "predicted");
  auto row = [&](const char* name, double measured, double predicted) {
    out += fmt::format("    {:<10} {:>10.4f} {:>10}\n", name, measured,
                       why.empty() ? fmt::format("{:.4f}", predicted) : "-");
  };
  const plan::Breakdown& b = pred.breakdown;
  const double predicted[] = {b.compute, b.tp_comm, b.cp_comm, b.pp_comm, b.pp_bubble, b.dp_comm, b.optimizer, b.other};
  for (size_t i = 0; i < std::size(kParts); ++i)
    if (parts.count(kParts[i])) row(kParts[i], median(parts[kParts[i]]), predicted[i]);
  row("step", median(step_s), pred.step_time_s);
  if (!why.empty()) out += fmt::format("    (no prediction: {})\n", why);
  for (const std::string& line : differs)
    out += fmt::format("    (predicted as this trainer ran it, not as planned: {})\n", line);
  return out;
}

RunSummary write_report(const std::string& run_dir, const std::string& calibration) {
  std::vector<nlohmann::json> records = read_metrics(run_dir + "/metrics.jsonl");
  RunSummary s = summarize(records);
  EXA_CHECK(s.steps > 0, "{}/metrics.jsonl has no training-step records (expected lines with \"step\" and "
                         "\"loss\")", run_dir);
  Series loss{"train loss", "#1f77b4", {}, {}, false, ""}, val{"val loss", "#d62728", {}, {}, true, ""};
  Series tps{"tokens/s", "#2ca02c", {}, {}, false, ""}, mfu{"MFU %", "#9467bd", {}, {}, false, ""};
  for (const auto& r : records) {
    if (is_step(r)) {
      double step = r["step"].get<double>();
      loss.xs.push_back(step), loss.ys.push_back(r["loss"].get<double>());
      if (r.contains("tokens_per_s")) tps.xs.push_back(step), tps.ys.push_back(r["tokens_per_s"].get<double>());
      if (r.contains("mfu")) mfu.xs.push_back(step), mfu.ys.push_back(100.0 * r["mfu"].get<double>());
    }
    if (is_eval(r)) val.xs.push_back(r["step"].get<double>()), val.ys.push_back(r["val_loss"].get<double>());
  }
  std::vector<Chart> charts;
  charts.push_back(Chart{"Loss", "step", "cross-entropy (nats)", {loss, val}, false});
  charts.push_back(Chart{"Throughput", "step", "tokens per second", {tps}, false});
  if (!mfu.xs.empty()) charts.push_back(Chart{"Model FLOPs utilisation", "step", "MFU (%)", {mfu}, false});
  std::string svg = svg_document(charts);

  // Written under a temporary name and renamed, so a reader never sees half a file.
  s.comparison = measured_vs_predicted(records, run_dir, calibration);
  s.svg_path = run_dir + "/report.svg";
  std::string tmp = s.svg_path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    EXA_CHECK(out.good(), "cannot write '{}'", tmp);
    out << svg;
    out.flush();
    EXA_CHECK(out.good(), "cannot write '{}' (disk full?)", tmp);
  }
  EXA_SYSCHECK(std::rename(tmp.c_str(), s.svg_path.c_str()) == 0, "cannot rename '{}' to '{}'", tmp, s.svg_path);
  return s;
}

std::string format_summary(const RunSummary& s, const std::string& run_dir) {
  std::string out = fmt::format("run {}\n", run_dir);
  out += fmt::format("  steps             {}\n", s.steps);
  out += fmt::format("  train loss        {:.4f} -> {:.4f}\n", s.first_loss, s.last_loss);
  if (s.skipped_steps >= 0)
    out += fmt::format("  skipped steps     {} (fp16 gradient overflows; loss scale {} -> {})\n", s.skipped_steps,
                       s.first_loss_scale, s.last_loss_scale);
  if (std::isfinite(s.best_val_loss))
    out += fmt::format("  best val loss     {:.4f} (step {})\n", s.best_val_loss, s.best_val_step);
  else
    out += "  best val loss     (no evaluation records)\n";
  if (std::isfinite(s.median_tokens_per_s))
    out += fmt::format("  tokens/s (median) {:.1f}\n", s.median_tokens_per_s);
  if (std::isfinite(s.median_mfu)) out += fmt::format("  MFU (median)      {:.1f}%\n", 100 * s.median_mfu);
  out += s.comparison;
  if (!s.svg_path.empty()) out += fmt::format("  plot              {}\n", s.svg_path);
  return out;
}

}  // namespace exatrain::report
