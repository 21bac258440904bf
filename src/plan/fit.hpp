// Fitting the time model's few constants to measured steps: the one fitter behind `exatrain
// validate` (the shipped fit and its leave-one-source-out check) and `exatrain calibrate` (the
// constants of a user's own machine from its runs). Pure: predictions only.
//
// The objective is the mean over groups of each group's mean absolute percentage error of the
// step time, so that each group (a published source; one run of a user's) weighs the same however
// many rows it has, plus a prior's term where the fit has one (Prior below). The search is
// coordinate descent with golden-section line searches in log space, within each constant's bounds,
// from a given start, then, each sweep, line searches along the sweep's net move (Powell's step) and
// along each pair of constants moved together both ways (the objective's kinks stall one-constant
// moves in narrow valleys); at most 40 sweeps: deterministic and derivative-free (the model has
// max() terms).
#pragma once
#include <string>
#include <vector>

#include "job/job.hpp"
#include "plan/plan.hpp"
#include "plan/predict.hpp"

namespace exatrain::plan {

// One measured step as the planner sees it.
struct MeasuredRun {
  std::string group;  // the unit the objective weighs equally: a source, or one run
  std::string label;  // for messages: "row 12", a run directory
  ModelSpec model;
  MachineSpec machine;
  Plan plan;          // valid (plan_error empty)
  double step_s = 0;  // measured seconds per step
};

// The runs' predicted step times with `cal`.
std::vector<double> predict_runs(const std::vector<MeasuredRun>& runs, const Calibration& cal);
// Mean over groups of the group's mean |predicted / measured - 1|, in percent.
double group_mape_pct(const std::vector<MeasuredRun>& runs, const std::vector<double>& predicted);
double mape_pct(const std::vector<MeasuredRun>& runs, const std::vector<double>& predicted);

// Bounds of a constant: device fractions in [0.05, 1], the multipliers (network, attention) in
// [0.05, 4], times in microseconds in [0.01, 1e4], other global constants within 1/20 and 20 times
// the start.
struct Bounds { double lo, hi; };
Bounds constant_bounds(const std::string& name, double start);

// A prior on the logarithms of the fitted constants, for fits to a few runs (`exatrain calibrate`).
// The objective becomes
//   group MAPE + 100 · noise / groups · Σ_j huber(ln(c_j / center_j) / sd_j),
//   huber(z) = z² / 2 for |z| <= 1, |z| - 1/2 beyond:
// near its center the negative log posterior of relative errors that are Laplace-distributed with
// mean `noise` under a Gaussian prior of width sd (in the MAPE's units), so a constant leaves its
// center only as far as the runs' evidence outweighs the prior. Beyond one width the prior pulls no
// harder: 100 noise / (groups sd) per unit of ln c, against the runs' 100 x (the constant's mean
// share of their steps) when they all agree, so runs that agree move a constant as far as they say
// where its share of their steps exceeds noise / (groups sd): at calibrate's defaults and three
// runs 21% for sustained on A100 and Hopper devices (a machine far from the catalog is recovered),
// 1.2% for every other constant and device. With three
// runs a fit without it chases their noise: the mean absolute error of three runs is flat between
// them. Empty sd_log: no prior (validate's fits, over hundreds
// of rows). docs/planner.md "Calibrating to your machine" has the widths' sources and the study.
struct Prior {
  std::vector<double> center;  // per constant: its value before the fit
  std::vector<double> sd_log;  // per constant: its prior standard deviation, in log units
  double noise = 0;            // the model's mean |relative error| on a calibrated machine (fraction)
};
// The prior's term of the objective at `cal`, in percentage points (0 without a prior).
double prior_penalty_pct(const Prior& prior, const std::vector<std::string>& constants, const Calibration& cal,
                         size_t groups);

// What fit_constants minimises, at `cal`: group_mape_pct of the runs' predictions plus `prior`'s term
// over `constants` (per group of the runs), in percentage points.
double fit_objective_pct(const std::vector<MeasuredRun>& runs, const Calibration& cal,
                         const std::vector<std::string>& constants, const Prior& prior = {});

struct FitResult {
  Calibration cal;                     // start with the fitted constants set
  std::vector<std::string> constants;  // what was fitted
  double objective_pct = 0;            // group_mape_pct at the optimum, plus the prior's term (if any)
  std::vector<double> predicted;       // per run, with cal
  int sweeps = 0;                      // sweeps run
  bool converged = false;              // a sweep gained under the tolerance (false: stopped at max_sweeps)
};
// Minimises group_mape_pct (plus `prior`'s term, if it has one) over `constants` (names of
// Calibration::set) from `start`, in at most `max_sweeps` sweeps (each: every constant in turn, then
// the sweep's net move and the pairs).
FitResult fit_constants(const std::vector<MeasuredRun>& runs, const Calibration& start,
                        const std::vector<std::string>& constants, int max_sweeps = 40, const Prior& prior = {});

// Sensitivities s[i][j] = d log(step_i) / d log(constant_j) of each run's predicted step to each
// constant, by a 2% step of the constant (up, or down where up would leave its bounds).
std::vector<std::vector<double>> sensitivities(const std::vector<MeasuredRun>& runs, const Calibration& cal,
                                               const std::vector<std::string>& constants);

// Why these runs cannot determine these constants, or "" when they can: fewer runs than
// constants; a constant no run's step time depends on; two or more whose effects on these runs
// cannot be told apart (the columns of d log(step) / d log(constant) over the runs are nearly
// dependent). Each reason says which constants and what kind of run would separate them.
std::string undetermined(const std::vector<MeasuredRun>& runs, const Calibration& cal,
                         const std::vector<std::string>& constants);

}  // namespace exatrain::plan
