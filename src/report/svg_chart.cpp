#include "report/svg_chart.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include <fmt/format.h>

namespace exatrain::report {

std::vector<double> nice_ticks(double lo, double hi, int target) {
  // A metrics file is untrusted input (fuzz/metrics_fuzz.cpp): values near DBL_MAX, a span that
  // overflows or a range near the resolution of a double (a tick index over 1e15) get the two ends
  // as ticks instead of a step that is zero or infinite, or ticks that round to the same value.
  if (!std::isfinite(lo) || !std::isfinite(hi)) return {};
  if (!(hi > lo)) hi = lo + 1;
  const double raw = (hi - lo) / std::max(1, target);
  if (!std::isfinite(raw) || !(raw > 0)) return {lo, hi};
  double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * mag >= raw) { step = m * mag; break; }
  const double first = std::ceil(lo / step - 1e-9);
  const double count = std::floor(hi / step + 1e-9) - first + 1;  // ~target..2*target when sane
  if (!(step > 0) || !std::isfinite(first) || std::fabs(first) > 1e15 || !(count >= 0 && count <= 1000))
    return {lo, hi};
  std::vector<double> ticks;
  // Integer multiples of the step (no running sum, so no drift).
  for (double k = first; k * step <= hi + step * 1e-9; k += 1) ticks.push_back(k * step);
  return ticks;
}

std::string svg_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '&') out += "&amp;";
    else out += c;
  }
  return out;
}

namespace {
std::string label(double v) { return fmt::format("{:.4g}", v); }
}  // namespace

std::string chart_group(const Chart& chart, double x0, double y0, double w, double h) {
  const double left = 70, right = 150, top = 30, bottom = 45;  // margins for labels and legend
  const double pw = w - left - right, ph = h - top - bottom;
  double xmin = std::numeric_limits<double>::infinity(), xmax = -xmin, ymin = xmin, ymax = -xmin;
  auto ty = [&](double y) { return chart.log_y ? std::log10(y) : y; };
  auto tx = [&](double x) { return chart.log_x ? std::log10(x) : x; };
  // A point is drawn when both coordinates are finite (and > 0 on a log axis).
  auto drawn = [&](const Series& s, size_t i) {
    return std::isfinite(s.xs[i]) && std::isfinite(s.ys[i]) && !(chart.log_y && s.ys[i] <= 0) &&
           !(chart.log_x && s.xs[i] <= 0);
  };
  for (const auto& s : chart.series)
    for (size_t i = 0; i < s.xs.size(); ++i) {
      if (!drawn(s, i)) continue;
      xmin = std::min(xmin, tx(s.xs[i])), xmax = std::max(xmax, tx(s.xs[i]));
      ymin = std::min(ymin, ty(s.ys[i])), ymax = std::max(ymax, ty(s.ys[i]));
    }
  std::string g = fmt::format("<g transform=\"translate({},{})\">\n", x0, y0);
  g += fmt::format("<text x=\"{}\" y=\"18\" font-size=\"15\" font-weight=\"bold\">{}</text>\n", left,
                   svg_escape(chart.title));
  if (!std::isfinite(xmin)) return g + "<text x=\"80\" y=\"80\">no data</text>\n</g>\n";
  if (xmax == xmin) xmax = xmin + 1;
  if (ymax == ymin) ymax = ymin + 1, ymin -= 1;
  double pad = 0.05 * (ymax - ymin);
  ymin -= pad, ymax += pad;
  auto px = [&](double x) { return left + (tx(x) - xmin) / (xmax - xmin) * pw; };
  auto pxt = [&](double t) { return left + (t - xmin) / (xmax - xmin) * pw; };
  auto py = [&](double y) { return top + ph - (ty(y) - ymin) / (ymax - ymin) * ph; };
  auto pyt = [&](double t) { return top + ph - (t - ymin) / (ymax - ymin) * ph; };

  g += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#444\"/>\n",
                   left, top, pw, ph);
  std::vector<double> xticks = nice_ticks(xmin, xmax);
  if (chart.log_x && std::floor(xmax) - std::ceil(xmin) >= 1) {  // whole decades
    xticks.clear();
    for (double t = std::ceil(xmin); t <= std::floor(xmax); t += 1) xticks.push_back(t);
  }
  for (double t : xticks)
    g += fmt::format("<line x1=\"{0}\" x2=\"{0}\" y1=\"{1}\" y2=\"{2}\" stroke=\"#ddd\"/>"
                     "<text x=\"{0}\" y=\"{3}\" font-size=\"11\" text-anchor=\"middle\">{4}</text>\n",
                     pxt(t), top, top + ph, top + ph + 15, label(chart.log_x ? std::pow(10, t) : t));
  for (double t : nice_ticks(ymin, ymax))
    g += fmt::format("<line x1=\"{0}\" x2=\"{1}\" y1=\"{2}\" y2=\"{2}\" stroke=\"#ddd\"/>"
                     "<text x=\"{3}\" y=\"{4}\" font-size=\"11\" text-anchor=\"end\">{5}</text>\n",
                     left, left + pw, pyt(t), left - 5, pyt(t) + 4, label(chart.log_y ? std::pow(10, t) : t));
  g += fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"12\" text-anchor=\"middle\">{}</text>\n",
                   left + pw / 2, h - 8, svg_escape(chart.x_label));
  g += fmt::format("<text x=\"14\" y=\"{0}\" font-size=\"12\" text-anchor=\"middle\" "
                   "transform=\"rotate(-90 14 {0})\">{1}</text>\n", top + ph / 2, svg_escape(chart.y_label));
  int row = 0;
  for (const auto& s : chart.series) {
    std::string pts;
    for (size_t i = 0; i < s.xs.size(); ++i) {
      if (!drawn(s, i)) continue;
      pts += fmt::format("{:.1f},{:.1f} ", px(s.xs[i]), py(s.ys[i]));
      if (s.markers)
        g += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3\" fill=\"{}\"/>\n", px(s.xs[i]), py(s.ys[i]), s.color);
    }
    const std::string dash = s.dash.empty() ? "" : fmt::format(" stroke-dasharray=\"{}\"", s.dash);
    g += fmt::format("<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"1.5\"{} points=\"{}\"/>\n", s.color,
                     dash, pts);
    double ly = top + 10 + 18 * row++;
    g += fmt::format("<line x1=\"{0}\" x2=\"{1}\" y1=\"{2}\" y2=\"{2}\" stroke=\"{3}\" stroke-width=\"3\"{7}/>"
                     "<text x=\"{4}\" y=\"{5}\" font-size=\"12\">{6}</text>\n",
                     left + pw + 10, left + pw + 30, ly, s.color, left + pw + 35, ly + 4, svg_escape(s.name), dash);
  }
  return g + "</g>\n";
}

std::string svg_document(const std::vector<Chart>& charts, double width, double chart_height) {
  double height = chart_height * charts.size();
  std::string doc = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
      "font-family=\"sans-serif\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n", width, height);
  for (size_t i = 0; i < charts.size(); ++i) doc += chart_group(charts[i], 0, i * chart_height, width, chart_height);
  return doc + "</svg>\n";
}

}  // namespace exatrain::report
