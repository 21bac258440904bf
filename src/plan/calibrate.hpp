// A machine's few constants from its measured steps (`exatrain calibrate`), and the calibration
// file `predict`, `plan` and `validate` read with --calibration FILE (docs/planner.md
// "Calibrating to your machine").
//
// The constants are the device's `sustained` (compute), `attention` (the fused attention kernel's
// rate), `network` (collectives) and `bw_efficiency` (element-wise work): plan::Calibration's
// device constants, for the one device the runs ran on. Without --fit, `calibrate` fits
// sustained, adds attention where the runs determine it (plan/fit.hpp undetermined(), and one run
// more than constants so that leave-one-out is defined) and its share of their steps differs by 10
// points or more, then network and bw_efficiency one at a time while one lowers the leave-one-out
// error by 0.1 point or more; a --fit list the runs cannot determine is refused with the reason.
// Every fit (and every leave-one-out fold) has a prior around the starting constants
// (CalibrationPrior below): three runs are too few to fit two constants on their own.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "catalog/device.hpp"
#include "plan/fit.hpp"
#include "plan/predict.hpp"

namespace exatrain::plan {

// The prior calibrate's fits start from (plan/fit.hpp Prior): each constant's value before the fit
// (the shipped constants, or --calibration's or --cal's, as the predictions use them) is its center.
// Its width in log units: 0.06 for `sustained` on a device whose family's `sustained` was fitted to
// published runs (catalog `sustained_fitted`: A100, Hopper), the root mean square of how far each
// published cluster's own `sustained` (fitted on all its rows, calibrate's automatic choice, no
// prior) lies from the one fitted without its source (docs/planner.md "Calibrating to your
// machine"); 1.0 (a factor e: the runs decide) for every other constant and device. `attention`
// moves by ±0.34 between clusters of one source, so the catalog cannot place it, and a width taken
// from other sources than a cluster's own made three-run calibrations worse; `bw_efficiency` and
// `network` are fitted by one cluster and none.
// `noise` is the model's mean relative error on a calibrated machine: 0.037, the median over the
// clusters of the error left after fitting all of a cluster's rows. --prior overrides widths and
// noise; `on` false gives plain fits (--prior off).
struct CalibrationPrior {
  bool on = true;
  std::map<std::string, double> sd_log;  // short names: overrides of the widths above
  double noise = 0.037;
  // The width of the prior of `short_name` (sustained, ...) on `device`.
  double sd(const std::string& short_name, const Device& device) const;
  // The fit.hpp Prior of `constants` (qualified names of one device) around `base`; empty when off.
  Prior of(const Calibration& base, const std::vector<std::string>& constants, const Device& device) const;
  // In --prior's syntax ("sustained=0.06,...,noise=0.037", or "off"), for the report and the file.
  std::string describe(const Device& device) const;
};
// calibrate's --prior: "" (the defaults), "off", or comma-separated NAME=VALUE with NAME a machine constant (its
// width, > 0, log units) or `noise` (a fraction, in (0, 1)), each once; Error naming the option, the
// item and what is wrong with it.
CalibrationPrior parse_prior(const std::string& text);

struct CalibrateResult {
  std::string device;                  // the runs' device
  std::vector<std::string> constants;  // fitted, qualified ("h100-sxm.sustained")
  Calibration cal;                     // the base calibration with them set
  std::vector<double> before, fitted, left_out;  // per run: shipped, fit, leave-one-out predictions
  double before_mape_pct = 0, fit_mape_pct = 0, loo_mape_pct = -1;  // loo: -1 with one run
  std::string choice;  // how the constants were chosen (auto), for the report
  std::string prior;   // CalibrationPrior::describe, for the report and the file
  bool converged = true;  // false: the fit stopped at its sweep cap (fit.hpp FitResult), the report says so
  // Not empty where a fitted constant ended at a bound of its range (plan/fit.hpp constant_bounds)
  // and the runs pull it past that bound (the fit's objective still falls toward it there): which
  // constant, and what to check. Every machine constant is a rate (a larger one makes a step faster).
  std::string at_bound;
};

// Fits `fit` (short names: sustained, attention, network, bw_efficiency; empty: automatic) for the device of
// `runs` (all on one device, else Error listing them), from `base`. Each run is its own group.
CalibrateResult calibrate(std::vector<MeasuredRun> runs, const Calibration& base, const std::vector<std::string>& fit,
                          const CalibrationPrior& prior = {});

// The calibration file: [calibration] what it was fitted on and its errors, [device.NAME] the
// constants.
std::string calibration_toml(const CalibrateResult& r, const std::vector<MeasuredRun>& runs);
// Reads a calibration file into a copy of `base`; Error naming the file and key on a bad one.
Calibration load_calibration(const std::string& path, const Calibration& base = default_calibration());
// The devices a calibration file gives constants for (its [device.NAME] tables).
std::vector<std::string> calibration_devices(const std::string& path);
// For predict/plan: Error when the file has constants for devices and none is `device` or its
// family (a calibration of another machine would silently change nothing).
void check_calibration_device(const std::string& path, const std::string& device);
// The constants a job on `device` is predicted with: the shipped ones for an empty `path`, else the
// file's (load_calibration), refused for another device (check_calibration_device).
Calibration calibration_for(const std::string& path, const std::string& device);

// The published-runs CSV (bench/validation/published_runs.csv format) as measured runs: the usable
// rows with a measured step; `skipped` gets "row N: reason" for the others.
std::vector<MeasuredRun> measured_runs_from_csv(const std::string& path, std::vector<std::string>& skipped);

}  // namespace exatrain::plan
