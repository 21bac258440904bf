#include "plan/fit.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include <fmt/format.h>

#include "catalog/device.hpp"
#include "core/check.hpp"

namespace exatrain::plan {

namespace {

// The runs with what does not depend on the constants computed once (memory, the device).
struct Prepared {
  const std::vector<MeasuredRun>& runs;
  std::vector<Memory> memory;
  std::vector<const Device*> device;
  explicit Prepared(const std::vector<MeasuredRun>& r) : runs(r) {
    for (const MeasuredRun& run : runs) {
      device.push_back(&find_device(run.machine.device));
      memory.push_back(memory_per_device(run.model, run.plan, *device.back()));  // time does not depend on it
    }
  }
  std::vector<double> predict(const Calibration& cal) const {
    std::vector<double> out(runs.size());
    for (size_t i = 0; i < runs.size(); ++i)
      out[i] = predict_checked(runs[i].model, runs[i].machine, cal.tuned(*device[i]), runs[i].plan, memory[i], cal)
                   .step_time_s;
    return out;
  }
};

// How many groups the runs form (the prior's term is per group, as the MAPE's mean is).
size_t group_count(const std::vector<MeasuredRun>& runs) {
  std::set<std::string> groups;
  for (const MeasuredRun& r : runs) groups.insert(r.group);
  return groups.size();
}

// What the fit minimises: the runs' group MAPE plus the prior's term.
struct Objective {
  const Prepared& prep;
  const std::vector<std::string>& constants;
  const Prior& prior;
  size_t groups;
  double operator()(const Calibration& cal) const {
    return group_mape_pct(prep.runs, prep.predict(cal)) + prior_penalty_pct(prior, constants, cal, groups);
  }
};

}  // namespace

double fit_objective_pct(const std::vector<MeasuredRun>& runs, const Calibration& cal,
                         const std::vector<std::string>& constants, const Prior& prior) {
  return group_mape_pct(runs, predict_runs(runs, cal)) + prior_penalty_pct(prior, constants, cal, group_count(runs));
}

namespace {

// Golden-section search of f over log(x) in [log lo, log hi] (f assumed unimodal there); returns
// the best x seen, never worse than `x0` (the start is evaluated too).
template <class F>
double golden_section(F f, double lo, double hi, double x0, double& best_value) {
  const double g = (std::sqrt(5.0) - 1) / 2;
  double a = std::log(lo), b = std::log(hi);
  double best_x = x0;
  best_value = f(x0);
  double c = b - g * (b - a), d = a + g * (b - a);
  double fc = f(std::exp(c)), fd = f(std::exp(d));
  for (int it = 0; it < 28 && b - a > 2e-4; ++it) {
    if (fc < fd) {
      b = d, d = c, fd = fc;
      c = b - g * (b - a), fc = f(std::exp(c));
    } else {
      a = c, c = d, fc = fd;
      d = a + g * (b - a), fd = f(std::exp(d));
    }
    for (auto [x, v] : {std::pair{c, fc}, std::pair{d, fd}})
      if (v < best_value) best_value = v, best_x = std::exp(x);
  }
  return best_x;
}

// Golden-section search along a direction in log space: x(t) = x * exp(t * dir) for t in
// [-span, 2 span] (each constant clamped to its bounds); `at` becomes the best point found, never
// worse. Returns the objective there.
double line_search(const Objective& objective, const std::vector<std::string>& constants, const std::vector<Bounds>& bounds,
                   const std::vector<double>& dir, double span, Calibration& at, double value_at) {
  std::vector<double> x0;
  for (const std::string& name : constants) x0.push_back(std::log(at.get(name)));
  auto point = [&](double u) {  // u = exp(t)
    Calibration c = at;
    for (size_t j = 0; j < constants.size(); ++j)
      c.set(constants[j], std::clamp(std::exp(x0[j] + std::log(u) * dir[j]), bounds[j].lo, bounds[j].hi));
    return c;
  };
  double value = 0;
  const double u = golden_section([&](double x) { return objective(point(x)); }, std::exp(-span),
                                  std::exp(2 * span), 1.0, value);
  if (value >= value_at) return value_at;
  at = point(u);
  return value;
}

// Directions that move two constants at once, each pair both ways (e_i + e_j, e_i - e_j): where
// the objective, a mean of absolute errors, has a kink along a narrow valley (two constants with
// similar effects, sustained and attention on runs where attention is most of the step), no move
// of one constant alone descends it.
std::vector<std::vector<double>> pair_directions(size_t n) {
  std::vector<std::vector<double>> out;
  for (size_t i = 0; i < n; ++i)
    for (size_t j = i + 1; j < n; ++j)
      for (double sign : {1.0, -1.0}) {
        std::vector<double> d(n, 0);
        d[i] = 1, d[j] = sign;
        out.push_back(d);
      }
  return out;
}

}  // namespace

std::vector<double> predict_runs(const std::vector<MeasuredRun>& runs, const Calibration& cal) {
  return Prepared(runs).predict(cal);
}

double mape_pct(const std::vector<MeasuredRun>& runs, const std::vector<double>& predicted) {
  if (runs.empty()) return 0;
  double sum = 0;
  for (size_t i = 0; i < runs.size(); ++i) sum += std::fabs(predicted[i] / runs[i].step_s - 1);
  return 100 * sum / double(runs.size());
}

double group_mape_pct(const std::vector<MeasuredRun>& runs, const std::vector<double>& predicted) {
  std::map<std::string, std::pair<double, int>> groups;
  for (size_t i = 0; i < runs.size(); ++i) {
    auto& [sum, n] = groups[runs[i].group];
    sum += std::fabs(predicted[i] / runs[i].step_s - 1);
    ++n;
  }
  if (groups.empty()) return 0;
  double total = 0;
  for (const auto& [g, sn] : groups) total += sn.first / sn.second;
  return 100 * total / double(groups.size());
}

Bounds constant_bounds(const std::string& name, double start) {
  const auto dot = name.rfind('.');
  const std::string constant = dot == std::string::npos ? "" : name.substr(dot + 1);
  if (constant == "sustained" || constant == "bw_efficiency") return {0.05, 1.0};
  if (is_multiplier_constant(constant)) return {0.05, 4.0};
  if (name.ends_with("_us")) return {0.01, 1e4};
  if (name == "fragmentation") return {0.001, 0.6};
  return {start / 20, start * 20};
}

namespace {

// One coordinate sweep: a golden-section search of each constant in turn, around its current
// value (a factor 2 each way) or over its whole range on the first sweep. Returns the objective.
double coordinate_sweep(const Objective& objective, const std::vector<std::string>& constants,
                        const std::vector<Bounds>& bounds, bool first, Calibration& cal, double best) {
  for (size_t j = 0; j < constants.size(); ++j) {
    const std::string& name = constants[j];
    const double x0 = cal.get(name);
    const Bounds b = bounds[j];
    const double lo = first ? b.lo : std::max(b.lo, x0 / 2), hi = first ? b.hi : std::min(b.hi, x0 * 2);
    Calibration trial = cal;
    auto f = [&](double x) {
      trial.set(name, std::clamp(x, b.lo, b.hi));
      return objective(trial);
    };
    double value = 0;
    const double x = golden_section(f, lo, hi, x0, value);
    if (value < best) {
      best = value;
      cal.set(name, std::clamp(x, b.lo, b.hi));
    }
  }
  return best;
}

}  // namespace


double prior_penalty_pct(const Prior& prior, const std::vector<std::string>& constants, const Calibration& cal,
                         size_t groups) {
  if (prior.sd_log.empty()) return 0;
  EXA_CHECK(prior.sd_log.size() == constants.size() && prior.center.size() == constants.size() && groups > 0,
            "a prior of {} standard deviations and {} centers for {} constants", prior.sd_log.size(),
            prior.center.size(), constants.size());
  double sum = 0;
  for (size_t j = 0; j < constants.size(); ++j) {
    const double z = std::fabs(std::log(cal.get(constants[j]) / prior.center[j]) / prior.sd_log[j]);
    sum += z <= 1 ? z * z / 2 : z - 0.5;
  }
  return 100 * prior.noise / double(groups) * sum;
}

FitResult fit_constants(const std::vector<MeasuredRun>& runs, const Calibration& start,
                        const std::vector<std::string>& constants, int max_sweeps, const Prior& prior) {
  EXA_CHECK(!runs.empty(), "no measured runs to fit {} to", fmt::join(constants, ", "));
  const Prepared prep(runs);
  const Objective objective{prep, constants, prior, group_count(runs)};
  FitResult out;
  out.cal = start;
  out.constants = constants;
  double best = objective(out.cal);
  std::vector<Bounds> bounds;  // from the start: they do not move with the search
  for (const std::string& name : constants) bounds.push_back(constant_bounds(name, start.get(name)));
  constexpr double kTolerance = 1e-5;  // percentage points of the objective
  for (int sweep = 0; sweep < max_sweeps && !out.converged; ++sweep) {
    const double before = best;
    const Calibration at_start = out.cal;
    best = coordinate_sweep(objective, constants, bounds, sweep == 0, out.cal, best);
    out.sweeps = sweep + 1;
    if (constants.size() == 1) {
      out.converged = before - best < kTolerance;
      continue;
    }
    // Then along the sweep's net move (Powell's direction step) and along the pair directions,
    // every sweep: narrow valleys are not descended one constant at a time, and a slow descent
    // along one is still a descent.
    std::vector<double> move;
    for (const std::string& name : constants) move.push_back(std::log(out.cal.get(name) / at_start.get(name)));
    if (std::any_of(move.begin(), move.end(), [](double m) { return std::fabs(m) > 1e-9; }))
      best = line_search(objective, constants, bounds, move, 1.0, out.cal, best);
    for (const std::vector<double>& d : pair_directions(constants.size()))
      best = line_search(objective, constants, bounds, d, 0.5, out.cal, best);
    out.converged = before - best < kTolerance;
  }
  out.objective_pct = best;
  out.predicted = prep.predict(out.cal);
  return out;
}

namespace {

// Eigen-decomposition of a small symmetric matrix by cyclic Jacobi rotations: eigenvalues on the
// diagonal of `a`, eigenvectors in the columns of `v`.
void jacobi_eigen(std::vector<std::vector<double>>& a, std::vector<std::vector<double>>& v) {
  const size_t n = a.size();
  v.assign(n, std::vector<double>(n, 0));
  for (size_t i = 0; i < n; ++i) v[i][i] = 1;
  for (int sweep = 0; sweep < 60; ++sweep) {
    double off = 0;
    for (size_t p = 0; p < n; ++p)
      for (size_t q = p + 1; q < n; ++q) off += a[p][q] * a[p][q];
    if (off < 1e-24) return;
    for (size_t p = 0; p < n; ++p)
      for (size_t q = p + 1; q < n; ++q) {
        if (std::fabs(a[p][q]) < 1e-300) continue;
        const double theta = (a[q][q] - a[p][p]) / (2 * a[p][q]);
        const double t = (theta >= 0 ? 1 : -1) / (std::fabs(theta) + std::sqrt(theta * theta + 1));
        const double c = 1 / std::sqrt(t * t + 1), s = t * c;
        for (size_t k = 0; k < n; ++k) {  // A <- A J (columns p, q)
          const double akp = a[k][p], akq = a[k][q];
          a[k][p] = c * akp - s * akq, a[k][q] = s * akp + c * akq;
        }
        for (size_t k = 0; k < n; ++k) {  // A <- J^T A (rows p, q)
          const double apk = a[p][k], aqk = a[q][k];
          a[p][k] = c * apk - s * aqk, a[q][k] = s * apk + c * aqk;
        }
        for (size_t k = 0; k < n; ++k) {
          const double vkp = v[k][p], vkq = v[k][q];
          v[k][p] = c * vkp - s * vkq, v[k][q] = s * vkp + c * vkq;
        }
      }
  }
}

// What separates each constant's effect (for the messages).
const char* separating_runs(const std::string& name) {
  if (name.ends_with(".sustained")) return "runs whose steps are mostly GEMMs (large models, large micro-batches)";
  if (name.ends_with(".bw_efficiency")) return "runs with small hidden sizes (element-wise work is a larger share)";
  if (name.ends_with(".network")) return "runs on more nodes or with more tensor/data-parallel traffic";
  if (name.ends_with(".attention"))
    return "runs with fused (flash) attention at several sequence lengths (attention's share of the step differs)";
  return "runs that differ in the term this constant scales";
}

}  // namespace

std::vector<std::vector<double>> sensitivities(const std::vector<MeasuredRun>& runs, const Calibration& cal,
                                               const std::vector<std::string>& constants) {
  const size_t k = constants.size(), n = runs.size();
  const Prepared prep(runs);
  const std::vector<double> base = prep.predict(cal);
  std::vector<std::vector<double>> s(n, std::vector<double>(k));
  for (size_t j = 0; j < k; ++j) {
    Calibration moved = cal;
    const double x = cal.get(constants[j]);
    const Bounds b = constant_bounds(constants[j], x);
    const double step = x * 1.02 <= b.hi ? 1.02 : 1 / 1.02;  // a 2% step, inside the bounds
    moved.set(constants[j], x * step);
    const std::vector<double> p = prep.predict(moved);
    for (size_t i = 0; i < n; ++i) s[i][j] = std::log(p[i] / base[i]) / std::log(step);
  }
  return s;
}

std::string undetermined(const std::vector<MeasuredRun>& runs, const Calibration& cal,
                         const std::vector<std::string>& constants) {
  const size_t k = constants.size(), n = runs.size();
  if (k == 0) return "no constants to fit";
  if (n < k)
    return fmt::format("{} run{} cannot determine {} constants ({}): give at least {} runs, or fit fewer (--fit)", n,
                       n == 1 ? "" : "s", k, fmt::join(constants, ", "), k);
  const std::vector<std::vector<double>> s = sensitivities(runs, cal, constants);
  for (size_t j = 0; j < k; ++j) {
    double norm = 0;
    for (size_t i = 0; i < n; ++i) norm += s[i][j] * s[i][j];
    // Below 1% of a run's step per 100% of the constant on average: the runs do not see it.
    if (std::sqrt(norm / double(n)) < 0.01)
      return fmt::format("the step times of these runs do not depend on {} (a change of it moves them by less than "
                         "1%): it cannot be fitted from them; add {} or leave it out (--fit)",
                         constants[j], separating_runs(constants[j]));
  }
  if (k == 1) return "";
  // Normalised columns; the smallest eigenvalue of their Gram matrix near 0 = dependent effects.
  std::vector<double> norms(k, 0);
  for (size_t j = 0; j < k; ++j) {
    for (size_t i = 0; i < n; ++i) norms[j] += s[i][j] * s[i][j];
    norms[j] = std::sqrt(norms[j]);
  }
  std::vector<std::vector<double>> gram(k, std::vector<double>(k, 0)), vec;
  for (size_t a = 0; a < k; ++a)
    for (size_t b = 0; b < k; ++b)
      for (size_t i = 0; i < n; ++i) gram[a][b] += s[i][a] / norms[a] * s[i][b] / norms[b];
  jacobi_eigen(gram, vec);
  size_t smallest = 0;
  for (size_t j = 1; j < k; ++j)
    if (gram[j][j] < gram[smallest][smallest]) smallest = j;
  // Threshold: the columns' angle. 0.02 = two unit columns at about 8 degrees: a 1% measurement
  // error then moves the fitted pair by tens of percent in opposite directions.
  if (gram[smallest][smallest] > 0.02) return "";
  std::vector<std::string> involved;
  for (size_t j = 0; j < k; ++j)
    if (std::fabs(vec[j][smallest]) > 0.3) involved.push_back(constants[j]);
  std::string separate;
  for (const auto& c : involved) separate += fmt::format("; {}: {}", c, separating_runs(c));
  return fmt::format("these {} runs cannot tell {} apart: each run's step time moves the same way with each of them "
                     "(their effects are {:.0f}% dependent), so a fit would trade one against the other; add runs "
                     "that differ in what they scale{} — or fit fewer constants (--fit)",
                     n, fmt::join(involved, " and "), 100 * (1 - gram[smallest][smallest]), separate);
}

}  // namespace exatrain::plan
