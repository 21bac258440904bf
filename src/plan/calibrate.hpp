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
#pragma once
#include <string>
#include <vector>

#include "plan/fit.hpp"
#include "plan/predict.hpp"

namespace exatrain::plan {

struct CalibrateResult {
  std::string device;                  // the runs' device
  std::vector<std::string> constants;  // fitted, qualified ("h100-sxm.sustained")
  Calibration cal;                     // the base calibration with them set
  std::vector<double> before, fitted, left_out;  // per run: shipped, fit, leave-one-out predictions
  double before_mape_pct = 0, fit_mape_pct = 0, loo_mape_pct = -1;  // loo: -1 with one run
  std::string choice;  // how the constants were chosen (auto), for the report
  bool converged = true;  // false: the fit stopped at its sweep cap (fit.hpp FitResult), the report says so
};

// Fits `fit` (short names: sustained, attention, network, bw_efficiency; empty: automatic) for the device of
// `runs` (all on one device, else Error listing them), from `base`. Each run is its own group.
CalibrateResult calibrate(std::vector<MeasuredRun> runs, const Calibration& base, const std::vector<std::string>& fit);

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

// The published-runs CSV (bench/validation/published_runs.csv format) as measured runs: the usable
// rows with a measured step; `skipped` gets "row N: reason" for the others.
std::vector<MeasuredRun> measured_runs_from_csv(const std::string& path, std::vector<std::string>& skipped);

}  // namespace exatrain::plan
