// Predictions as figures and tables, for `exatrain sweep` and `exatrain plan --svg`: one bar per
// labelled prediction in two panels (the exposed time per step by part, the memory per GPU by
// part, with the device's capacity). Works on the contract's JSON (plan::to_json), so a part the
// planner adds later shows up without a change here.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "report/figures.hpp"

namespace exatrain::cli {

// A labelled prediction (plan::to_json), or a plan that was refused (`error` set, `pred` null).
struct LabelledPrediction {
  std::string label;
  nlohmann::json pred;
  std::string error;
};

// The parts of breakdown_s and memory_gib_per_gpu in the planner's order (then any other key).
std::vector<std::string> time_parts(const std::vector<LabelledPrediction>& preds);
std::vector<std::string> memory_parts(const std::vector<LabelledPrediction>& preds);

std::vector<report::BarPanel> prediction_panels(const std::vector<LabelledPrediction>& preds,
                                                const std::string& title);

// Two text tables (time, memory) with a column per part that is not zero everywhere.
std::string prediction_tables(const std::vector<LabelledPrediction>& preds, const std::string& label_header);

// Writes a figure (atomically: temporary name, then rename), creating its directory if needed.
void write_figure(const std::string& path, const std::string& svg);

// write_figure of the predictions' bars; prints nothing.
void write_prediction_svg(const std::vector<LabelledPrediction>& preds, const std::string& title,
                          const std::string& path);

}  // namespace exatrain::cli
