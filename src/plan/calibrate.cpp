#include "plan/calibrate.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <map>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "catalog/device.hpp"
#include "core/check.hpp"
#include "core/fileio.hpp"
#include "core/toml.hpp"
#include "plan/validate.hpp"

namespace exatrain::plan {

namespace {

std::vector<std::string> qualified(const std::string& device, const std::vector<std::string>& names) {
  std::vector<std::string> out;
  for (const auto& n : names) out.push_back(device + "." + n);
  return out;
}

// network and bw_efficiency are added only when they lower the leave-one-out MAPE by this many
// points: less is the noise of the search and of a few runs.
constexpr double kMinLooGainPct = 0.1;
// Attention is told from sustained only where its share of the step differs between the runs by
// this much: on runs of one sequence length (shares a few points apart) a fit of both trades one
// against the other on the runs' noise (docs/planner.md's study).
constexpr double kMinAttentionSpread = 0.10;

// How far apart the runs' shares of attention in their steps are: attention's share of a step is
// -d log(step) / d log(attention) (plan/fit.hpp sensitivities); the spread is max - min over the
// runs (the sign drops out).
double attention_share_spread(const std::vector<MeasuredRun>& runs, const Calibration& base, const std::string& device) {
  double lo = 1e300, hi = -1e300;
  for (const std::vector<double>& row : sensitivities(runs, base, {device + ".attention"}))
    lo = std::min(lo, row[0]), hi = std::max(hi, row[0]);
  return hi - lo;
}

// Each run predicted by the constants fitted on the other runs. Where the constants were chosen
// automatically, each fold applies the choice's attention rule (attention only where the fold's
// attention shares differ by kMinAttentionSpread or more); a constant list the user gave (--fit) is
// kept. Then, where the fold cannot determine all of them, it fits the longest prefix it can
// (sustained kept first); the base constants where it cannot determine even one.
std::vector<double> leave_one_out(const std::vector<MeasuredRun>& runs, const Calibration& base,
                                  const std::vector<std::string>& constants, const std::string& device,
                                  bool automatic, const CalibrationPrior& prior) {
  std::vector<double> out(runs.size());
  for (size_t i = 0; i < runs.size(); ++i) {
    std::vector<MeasuredRun> rest = runs;
    rest.erase(rest.begin() + long(i));
    std::vector<std::string> c = constants;
    std::stable_partition(c.begin(), c.end(), [&](const std::string& n) { return n == device + ".sustained"; });
    if (const auto a = std::find(c.begin(), c.end(), device + ".attention");
        automatic && a != c.end() && attention_share_spread(rest, base, device) < kMinAttentionSpread)
      c.erase(a);
    while (!c.empty() && !undetermined(rest, base, c).empty()) c.pop_back();
    const Calibration fold = c.empty() ? base : fit_constants(rest, base, c, 40, prior.of(base, c, find_device(device))).cal;
    out[i] = predict_runs({runs[i]}, fold)[0];
  }
  return out;
}

// Why `trial` cannot be fitted from `runs` ("" when it can): leave-one-out needs a run more than
// constants, and the runs must determine them (plan/fit.hpp undetermined).
std::string cannot_fit(const std::vector<MeasuredRun>& runs, const Calibration& base, const std::string& device,
                       const std::vector<std::string>& trial) {
  if (runs.size() < trial.size() + 1)
    return fmt::format("{} runs (fitting {} constants needs {})", runs.size(), trial.size(), trial.size() + 1);
  return undetermined(runs, base, qualified(device, trial));
}

// Automatic choice: sustained; then attention, where the runs determine it and its share of their
// steps differs by kMinAttentionSpread or more (it is what separates a machine's runs of different
// sequence lengths: docs/planner.md "Calibrating to your machine");
// then, one at a time, whichever of network and bw_efficiency lowers the leave-one-out MAPE most,
// while one lowers it by kMinLooGainPct points or more (a constant that only fits the noise of a
// few runs does not predict a run left out better). Each constant left out is named in `why` with
// the reason. Attention is not put to the leave-one-out test: with three runs the leave-one-out
// figure is itself too noisy to judge it (docs/planner.md's study, both ways). `left_out` gets
// the chosen constants' leave-one-out predictions (computed here for the choice; none with one run).
std::vector<std::string> choose(const std::vector<MeasuredRun>& runs, const Calibration& base, const std::string& device,
                                const CalibrationPrior& prior, std::string& why, std::vector<double>& left_out) {
  std::vector<std::string> chosen = {"sustained"};
  std::map<std::string, std::string> reason;  // for each constant left out
  if (std::string r = cannot_fit(runs, base, device, {"sustained", "attention"}); !r.empty())
    reason["attention"] = r;
  else if (const double spread = attention_share_spread(runs, base, device); spread < kMinAttentionSpread)
    reason["attention"] = fmt::format("attention's share of these runs' steps differs by {:.1f} points between them, "
                                      "under the {:.0f} that tell it from sustained; add runs of other sequence lengths",
                                      100 * spread, 100 * kMinAttentionSpread);
  else
    chosen.push_back("attention");
  auto loo = [&](const std::vector<std::string>& c) { return leave_one_out(runs, base, qualified(device, c), device, true, prior); };
  left_out = runs.size() >= 2 ? loo(chosen) : std::vector<double>{};
  double chosen_loo = runs.size() >= 2 ? mape_pct(runs, left_out) : 0;
  for (bool added = true; added;) {
    added = false;
    std::vector<std::string> best;
    std::vector<double> best_left_out;
    double best_loo = chosen_loo;
    for (const char* extra : {"network", "bw_efficiency"}) {
      if (std::find(chosen.begin(), chosen.end(), extra) != chosen.end()) continue;
      std::vector<std::string> trial = chosen;
      trial.push_back(extra);
      if (std::string r = cannot_fit(runs, base, device, trial); !r.empty()) {
        reason[extra] = r;
        continue;
      }
      std::vector<double> trial_left_out = loo(trial);
      const double l = mape_pct(runs, trial_left_out);
      reason[extra] = fmt::format("it does not lower the leave-one-out MAPE by {} points ({:.2f}% with it, {:.2f}% "
                                  "without)", kMinLooGainPct, l, chosen_loo);
      if (l < best_loo - kMinLooGainPct) best_loo = l, best = trial, best_left_out = std::move(trial_left_out);
    }
    if (!best.empty()) chosen = best, chosen_loo = best_loo, left_out = std::move(best_left_out), added = true;
  }
  for (const char* name : {"attention", "network", "bw_efficiency"})
    if (std::find(chosen.begin(), chosen.end(), name) == chosen.end())
      why += fmt::format("{} not fitted: {}; ", name, reason[name]);
  if (!why.empty()) why.erase(why.size() - 2);
  return chosen;
}

// CalibrateResult::at_bound: the fitted constants that end within 1e-3 in log of a bound of their
// range (the fit's line searches stop within 2e-4) where the objective still falls toward the bound:
// at the bound itself it is lower than 0.01% inside it, so the runs pull the constant past it (an
// optimum just inside the bound, which the fit found, is not that). The objective is the fit's
// (plan/fit.hpp fit_objective_pct). What to check, for each. "" where none is pulled.
// Every machine constant is a rate: at the upper bound the runs ran faster than the constants allow.
std::string bound_note(const std::vector<MeasuredRun>& runs, const CalibrateResult& r, const Calibration& base,
                       const Prior& prior) {
  auto objective = [&](const Calibration& c) { return fit_objective_pct(runs, c, r.constants, prior); };
  double mean = 0;  // mean signed error of the fitted predictions (> 0: the runs ran faster), for the message
  for (size_t i = 0; i < runs.size(); ++i) mean += (r.fitted[i] / runs[i].step_s - 1) / double(runs.size());
  const bool local = r.device.rfind("cpu-local", 0) == 0;  // this machine: its rates are `profile`'s
  std::string note;
  for (const std::string& c : r.constants) {
    const Bounds b = constant_bounds(c, base.get(c));
    const double v = r.cal.get(c);
    const bool upper = std::abs(std::log(v / b.hi)) < 1e-3, lower = std::abs(std::log(v / b.lo)) < 1e-3;
    if (!upper && !lower) continue;
    Calibration at = r.cal, inside = r.cal;
    at.set(c, upper ? b.hi : b.lo);
    inside.set(c, upper ? b.hi * (1 - 1e-4) : b.lo * (1 + 1e-4));
    if (objective(at) >= objective(inside)) continue;  // not pulled past the bound
    const bool network = c.ends_with(".network");
    const std::string rates = network ? "the bandwidths it scales (the runs' [machine])"
                                      : local ? "the rates it scales (what `exatrain profile` measured on this machine, "
                                                "or the catalog's entry)"
                                              : fmt::format("the rates it scales (the catalog's figures for {})", r.device);
    note += upper ? fmt::format("{} = {:.4g} is at its upper bound {:.4g}, and the runs pull it higher (predicted "
                                "{:+.1f}% on average): {} are below what the runs reached{}, or another part of their "
                                "steps is over-predicted (compare `exatrain report`'s parts); ", c, v, b.hi, 100 * mean,
                                rates, local && !network ? " (run `exatrain profile`)" : "")
                  : fmt::format("{} = {:.4g} is at its lower bound {:.4g}, and the runs pull it lower (predicted "
                                "{:+.1f}% on average): check that they ran on the device their jobs name, or what else "
                                "ran on it; ", c, v, b.lo, 100 * mean);
  }
  if (!note.empty()) note.erase(note.size() - 2);
  return note;
}

}  // namespace

double CalibrationPrior::sd(const std::string& short_name, const Device& device) const {
  if (const auto it = sd_log.find(short_name); it != sd_log.end()) return it->second;
  return device.sustained_fitted && short_name == "sustained" ? 0.06 : 1.0;
}

Prior CalibrationPrior::of(const Calibration& base, const std::vector<std::string>& constants,
                           const Device& device) const {
  Prior p;
  if (!on) return p;
  p.noise = noise;
  for (const std::string& c : constants) {
    p.center.push_back(base.get(c));
    p.sd_log.push_back(sd(c.substr(c.rfind('.') + 1), device));
  }
  return p;
}

std::string CalibrationPrior::describe(const Device& device) const {
  if (!on) return "off";
  std::string s;
  // {}: the shortest text that reads back as the same double, so the file's prior is exact.
  for (const std::string& n : device_constant_names()) s += fmt::format("{}={},", n, sd(n, device));
  return s + fmt::format("noise={}", noise);
}

namespace {
// One NAME=VALUE item of --prior: a known name, a finite number with nothing around it; "" when it is
// one, else what is wrong with it.
std::string prior_item_error(const std::string& item, const std::string& key, size_t eq, double& value) {
  const auto& names = device_constant_names();
  if (item.empty()) return "an empty item";
  if (eq == std::string::npos || eq + 1 == item.size()) return "not NAME=VALUE";
  if (key.empty()) return "an empty name";
  if (key == "off") return "'off' stands alone";
  if (key != "noise" && std::find(names.begin(), names.end(), key) == names.end())
    return fmt::format("'{}' is neither a machine constant nor noise", key);
  const std::string text = item.substr(eq + 1);
  size_t used = 0;
  try {
    if (!std::isspace(static_cast<unsigned char>(text[0]))) value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || !std::isfinite(value) || value <= 0) return fmt::format("'{}' is not a number > 0", text);
  if (key == "noise" && value >= 1) return "noise is a fraction (the mean relative error), < 1";
  return "";
}
}  // namespace

CalibrationPrior parse_prior(const std::string& text) {
  CalibrationPrior p;
  if (text.empty()) return p;
  if (text == "off") {
    p.on = false;
    return p;
  }
  std::set<std::string> seen;
  for (size_t start = 0; start <= text.size();) {
    const size_t comma = std::min(text.find(',', start), text.size());
    const std::string item = text.substr(start, comma - start);
    const size_t eq = item.find('=');
    const std::string key = item.substr(0, eq);
    double value = 0;
    std::string why = prior_item_error(item, key, eq, value);
    if (why.empty() && !seen.insert(key).second) why = fmt::format("{} is given twice", key);
    if (!why.empty())
      throw Error(fmt::format("--prior {}: item '{}': {}; expected 'off' or comma-separated NAME=VALUE with NAME one "
                              "of {}, noise", text, item, why, fmt::join(device_constant_names(), ", ")));
    if (key == "noise") p.noise = value;
    else p.sd_log[key] = value;
    start = comma + 1;
  }
  return p;
}

CalibrateResult calibrate(std::vector<MeasuredRun> runs, const Calibration& base, const std::vector<std::string>& fit,
                          const CalibrationPrior& prior) {
  EXA_CHECK(!runs.empty(), "no measured runs to calibrate from");
  std::set<std::string> devices;
  for (const MeasuredRun& r : runs) devices.insert(r.machine.device);
  if (devices.size() > 1)
    throw Error(fmt::format("the runs ran on {} devices ({}): a calibration describes one machine; calibrate each "
                            "device's runs separately", devices.size(), fmt::join(devices, ", ")));
  for (MeasuredRun& r : runs) r.group = r.label;  // every run weighs the same
  CalibrateResult out;
  out.device = *devices.begin();
  for (const auto& n : fit)
    if (std::find(device_constant_names().begin(), device_constant_names().end(), n) == device_constant_names().end())
      throw Error(fmt::format("--fit {}: not a machine constant; expected some of {}", n, fmt::join(device_constant_names(), ", ")));
  std::vector<std::string> names = fit;
  if (names.empty()) {
    names = choose(runs, base, out.device, prior, out.choice, out.left_out);
  } else if (const std::string reason = undetermined(runs, base, qualified(out.device, names)); !reason.empty()) {
    throw Error(fmt::format("cannot calibrate {} from these runs: {}", fmt::join(qualified(out.device, names), ", "), reason));
  }
  if (fit.empty() && names.size() == 1)
    if (const std::string reason = undetermined(runs, base, qualified(out.device, names)); !reason.empty())
      throw Error(fmt::format("cannot calibrate {} from these runs: {}", out.device + ".sustained", reason));
  out.constants = qualified(out.device, names);
  out.before = predict_runs(runs, base);
  out.before_mape_pct = mape_pct(runs, out.before);
  out.prior = prior.describe(find_device(out.device));
  const FitResult all = fit_constants(runs, base, out.constants, 40, prior.of(base, out.constants, find_device(out.device)));
  out.cal = all.cal, out.fitted = all.predicted, out.fit_mape_pct = mape_pct(runs, all.predicted);
  out.converged = all.converged;
  out.at_bound = bound_note(runs, out, base, prior.of(base, out.constants, find_device(out.device)));
  if (runs.size() >= 2) {
    if (!fit.empty()) out.left_out = leave_one_out(runs, base, out.constants, out.device, false, prior);
    out.loo_mape_pct = mape_pct(runs, out.left_out);
  }
  return out;
}

std::string calibration_toml(const CalibrateResult& r, const std::vector<MeasuredRun>& runs) {
  std::time_t t = std::time(nullptr);
  char when[32];
  std::strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  std::string s = fmt::format("# The constants of {} fitted to {} measured step{} by `exatrain calibrate` ({}).\n"
                              "# Use: exatrain predict|plan|validate ... --calibration THIS_FILE (docs/planner.md).\n",
                              r.device, runs.size(), runs.size() == 1 ? "" : "s", when);
  toml::array inputs;
  for (const MeasuredRun& m : runs) inputs.push_back(toml::value(m.label));
  s += fmt::format("[calibration]\ndevice = {}\nruns = {}\nshipped_mape_pct = {:.3f}\nfit_mape_pct = {:.3f}\n",
                   toml_text(toml::value(r.device)), runs.size(), r.before_mape_pct, r.fit_mape_pct);
  if (r.loo_mape_pct >= 0) s += fmt::format("leave_one_out_mape_pct = {:.3f}\n", r.loo_mape_pct);
  s += fmt::format("prior = {}\n", toml_text(toml::value(r.prior)));
  s += fmt::format("inputs = {}\n", toml_text(toml::value(inputs)));
  s += fmt::format("\n[device.{}]\n", r.device);
  for (const std::string& c : r.constants)
    s += fmt::format("{} = {:.6g}\n", c.substr(c.rfind('.') + 1), r.cal.get(c));
  return s;
}

namespace {
toml::value read_calibration(const std::string& path) {
  EXA_CHECK(std::filesystem::is_regular_file(path), "calibration file {} not found (write one with `exatrain "
            "calibrate RUN... --out {}`)", path, path);
  return parse_toml(read_file_bytes(path, uint64_t(1) << 20), path);
}
}  // namespace

std::vector<std::string> calibration_devices(const std::string& path) {
  const toml::value root = read_calibration(path);
  std::vector<std::string> out;
  if (root.contains("device") && root.at("device").is_table())
    for (const auto& [name, t] : root.at("device").as_table()) out.push_back(name);
  return out;
}

Calibration load_calibration(const std::string& path, const Calibration& base) {
  const toml::value root = read_calibration(path);
  Calibration cal = base;
  for (const auto& [section, t] : root.as_table()) {
    if (section == "calibration") continue;
    if (section != "device" || !t.is_table())
      throw Error(fmt::format("{}: unexpected [{}]; a calibration file has [calibration] and [device.NAME] tables", path,
                              section));
    for (const auto& [device, consts] : t.as_table()) {
      if (!consts.is_table()) throw Error(fmt::format("{}: [device.{}] must be a table", path, device));
      for (const auto& [key, v] : consts.as_table()) {
        if (std::find(device_constant_names().begin(), device_constant_names().end(), key) == device_constant_names().end())
          throw Error(fmt::format("{}: [device.{}] {}: not a machine constant; expected some of {}", path, device, key,
                                  fmt::join(device_constant_names(), ", ")));
        if (!v.is_floating() && !v.is_integer())
          throw Error(fmt::format("{}: [device.{}] {} = {}: expected a number", path, device, key, toml::format(v)));
        try {
          cal.set(device + "." + key, v.is_floating() ? v.as_floating() : double(v.as_integer()));
        } catch (const Error& e) {
          throw Error(fmt::format("{}: [device.{}] {}: {}", path, device, key, e.what()));
        }
      }
    }
  }
  return cal;
}

void check_calibration_device(const std::string& path, const std::string& device) {
  const std::vector<std::string> devices = calibration_devices(path);
  if (devices.empty()) return;
  const Device& d = find_device(device);
  for (const auto& n : devices)
    if (n == d.name || n == d.family) return;
  throw Error(fmt::format("{} calibrates {}, but this job runs on {}: a calibration describes the machine it was "
                          "fitted on (calibrate this device's runs, or drop --calibration)",
                          path, fmt::join(devices, ", "), device));
}

Calibration calibration_for(const std::string& path, const std::string& device) {
  if (path.empty()) return default_calibration();
  check_calibration_device(path, device);
  return load_calibration(path);
}

std::vector<MeasuredRun> measured_runs_from_csv(const std::string& path, std::vector<std::string>& skipped) {
  std::vector<MeasuredRun> out;
  const std::vector<CsvRow> rows = read_csv(path);
  for (size_t i = 0; i < rows.size(); ++i) {
    const RunCase rc = case_from_row(rows[i], int(i) + 1);
    if (!rc.skip_reason.empty() || rc.memory_only) {
      skipped.push_back(fmt::format("{} row {}: {}", path, i + 1, rc.memory_only ? "no step time" : rc.skip_reason));
      continue;
    }
    out.push_back({rc.source, fmt::format("{} row {}", path, i + 1), rc.model, rc.machine, rc.plan, rc.measured_step_s});
  }
  return out;
}

}  // namespace exatrain::plan
