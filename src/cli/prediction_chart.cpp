#include "cli/prediction_chart.hpp"

#include <algorithm>
#include <filesystem>

#include <fmt/format.h>

#include "core/fileio.hpp"

namespace exatrain::cli {
namespace {
// Keys of obj[section] over every prediction: `order` first (those present), then the rest.
std::vector<std::string> parts_of(const std::vector<LabelledPrediction>& preds, const char* section,
                                  std::vector<std::string> order, const char* skip) {
  std::vector<std::string> extra;
  for (const auto& p : preds)
    if (p.error.empty())
      for (const auto& [key, v] : p.pred[section].items())
        if (key != skip && std::find(order.begin(), order.end(), key) == order.end() &&
            std::find(extra.begin(), extra.end(), key) == extra.end())
          extra.push_back(key);
  order.insert(order.end(), extra.begin(), extra.end());
  return order;
}
double value_of(const LabelledPrediction& p, const char* section, const std::string& part) {
  if (!p.error.empty()) return 0;
  return p.pred[section].value(part, 0.0);
}
bool all_zero(const std::vector<LabelledPrediction>& preds, const char* section, const std::string& part) {
  return std::all_of(preds.begin(), preds.end(), [&](const auto& p) { return value_of(p, section, part) == 0; });
}
}  // namespace

std::vector<std::string> time_parts(const std::vector<LabelledPrediction>& preds) {
  return parts_of(preds, "breakdown_s",
                  {"compute", "tp_comm", "cp_comm", "pp_comm", "pp_bubble", "dp_comm", "optimizer", "other"}, "");
}
std::vector<std::string> memory_parts(const std::vector<LabelledPrediction>& preds) {
  return parts_of(preds, "memory_gib_per_gpu", {"params", "grads", "optimizer", "activations", "buffers"}, "total");
}

std::vector<report::BarPanel> prediction_panels(const std::vector<LabelledPrediction>& preds,
                                                const std::string& title) {
  report::BarPanel time{title + ": time per step (exposed)", "seconds per step", time_parts(preds), {}, 0, ""};
  report::BarPanel mem{title + ": memory per GPU (most loaded pipeline rank)", "GiB per GPU", memory_parts(preds),
                       {}, 0, ""};
  double device = -1;
  bool one_device = true;
  for (const auto& p : preds) {
    report::Bar t{p.label, {}, {}}, m{p.label, {}, {}};
    for (const auto& part : time.parts) t.values.push_back(value_of(p, "breakdown_s", part));
    for (const auto& part : mem.parts) m.values.push_back(value_of(p, "memory_gib_per_gpu", part));
    if (!p.error.empty()) {
      t.note = m.note = "not a valid plan";
    } else {
      t.note = fmt::format("{:.4g} s, MFU {:.1f}%", p.pred["step_time_s"].get<double>(),
                           100 * p.pred["mfu"].get<double>());
      m.note = fmt::format("{:.3g} GiB{}", p.pred["memory_gib_per_gpu"]["total"].get<double>(),
                           p.pred["fits"].get<bool>() ? "" : ", does not fit");
      const double d = p.pred.value("device_memory_gib", 0.0);
      if (device >= 0 && d != device) one_device = false;
      device = d;
    }
    time.bars.push_back(t), mem.bars.push_back(m);
  }
  if (one_device && device > 0) mem.limit = device, mem.limit_label = fmt::format("device {:.4g} GiB", device);
  return {time, mem};
}

std::string prediction_tables(const std::vector<LabelledPrediction>& preds, const std::string& label_header) {
  size_t w = label_header.size();
  for (const auto& p : preds) w = std::max(w, p.label.size());
  std::string out = fmt::format("time per step (s, exposed)\n  {:<{}} {:>10} {:>6}", label_header, w, "step", "MFU%");
  const auto tp = time_parts(preds), mp = memory_parts(preds);
  for (const auto& part : tp)
    if (!all_zero(preds, "breakdown_s", part)) out += fmt::format(" {:>10}", part);
  out += "\n";
  for (const auto& p : preds) {
    out += fmt::format("  {:<{}}", p.label, w);
    if (!p.error.empty()) { out += fmt::format(" not a valid plan: {}\n", p.error); continue; }
    out += fmt::format(" {:>10.4g} {:>6.1f}", p.pred["step_time_s"].get<double>(), 100 * p.pred["mfu"].get<double>());
    for (const auto& part : tp)
      if (!all_zero(preds, "breakdown_s", part)) out += fmt::format(" {:>10.4g}", value_of(p, "breakdown_s", part));
    out += "\n";
  }
  out += fmt::format("memory per GPU (GiB, most loaded pipeline rank)\n  {:<{}}", label_header, w);
  for (const auto& part : mp)
    if (!all_zero(preds, "memory_gib_per_gpu", part)) out += fmt::format(" {:>11}", part);
  out += fmt::format(" {:>9} {:>9} {:>5}\n", "total", "device", "fits");
  for (const auto& p : preds) {
    if (!p.error.empty()) continue;
    out += fmt::format("  {:<{}}", p.label, w);
    for (const auto& part : mp)
      if (!all_zero(preds, "memory_gib_per_gpu", part))
        out += fmt::format(" {:>11.4g}", value_of(p, "memory_gib_per_gpu", part));
    out += fmt::format(" {:>9.4g} {:>9.4g} {:>5}\n", p.pred["memory_gib_per_gpu"]["total"].get<double>(),
                       p.pred.value("device_memory_gib", 0.0), p.pred["fits"].get<bool>() ? "yes" : "no");
  }
  return out;
}

void write_figure(const std::string& path, const std::string& svg) {
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  std::error_code ec;
  if (!dir.empty()) std::filesystem::create_directories(dir, ec);  // a failure shows in the write
  write_file_atomic(path, svg);
}

void write_prediction_svg(const std::vector<LabelledPrediction>& preds, const std::string& title,
                          const std::string& path) {
  write_figure(path, report::bar_panels_svg(prediction_panels(preds, title)));
}

}  // namespace exatrain::cli
