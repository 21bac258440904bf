#include "report/figures.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "core/check.hpp"
#include "report/svg_chart.hpp"

namespace exatrain::report {

const char* palette(int i) {
  static const char* kTab10[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                 "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
  return kTab10[((i % 10) + 10) % 10];
}

namespace {
constexpr double kCharW = 6.6;  // width of one character at font-size 11 (sans-serif, average)
std::string num(double v) { return fmt::format("{:.4g}", v); }
std::string svg_open(double w, double h) {
  return fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
      "font-family=\"sans-serif\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n", w, h);
}
// The legend: a square of colour palette(i) and its name per item, left to right from x0,
// wrapping before x_max; `y` is the first row's baseline and is left below the last row.
std::string legend_rows(const std::vector<std::pair<int, std::string>>& items, double x0, double x_max, double& y) {
  std::string g;
  double x = x0;
  for (const auto& [colour, name] : items) {
    const double w = 14 + kCharW * double(name.size()) + 14;
    if (x > x0 && x + w > x_max) x = x0, y += 16;
    g += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"10\" height=\"10\" fill=\"{}\"/>"
                     "<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"11\">{}</text>\n",
                     x, y - 9, palette(colour), x + 14, y, svg_escape(name));
    x += w;
  }
  y += 16;
  return g;
}
// Vertical grid lines with tick labels under a plot area [x0, x0 + pw] x [y0, y1].
std::string x_axis(double lo, double hi, double x0, double pw, double y0, double y1) {
  std::string g;
  for (double t : nice_ticks(lo, hi)) {
    if (t < lo - 1e-12 || t > hi + 1e-12) continue;
    const double x = x0 + (t - lo) / (hi - lo) * pw;
    g += fmt::format("<line x1=\"{0:.1f}\" x2=\"{0:.1f}\" y1=\"{1:.1f}\" y2=\"{2:.1f}\" stroke=\"#ddd\"/>"
                     "<text x=\"{0:.1f}\" y=\"{3:.1f}\" font-size=\"11\" text-anchor=\"middle\">{4}</text>\n",
                     x, y0, y1, y1 + 14, num(t));
  }
  return g;
}

void check_panel(const BarPanel& p) {
  for (const Bar& b : p.bars) {
    EXA_CHECK(b.values.size() == p.parts.size(), "bar chart '{}': bar '{}' has {} values for {} parts", p.title,
              b.label, b.values.size(), p.parts.size());
    for (double v : b.values)
      EXA_CHECK(std::isfinite(v) && v >= 0, "bar chart '{}': bar '{}' has the value {} (expected finite, >= 0)",
                p.title, b.label, v);
  }
}

// The left margin that fits every bar label of every panel, and the right one for the notes.
struct BarLayout {
  double width = 0, left = 0, right = 0;
};
BarLayout bar_layout(const std::vector<BarPanel>& panels, double width) {
  size_t label_chars = 4, note_chars = 4;
  for (const BarPanel& p : panels)
    for (const Bar& b : p.bars) label_chars = std::max(label_chars, b.label.size()), note_chars = std::max(note_chars, b.note.size());
  BarLayout l;
  l.left = 16 + kCharW * double(label_chars);
  l.right = 16 + kCharW * double(note_chars);
  l.width = std::max(width, l.left + 420 + l.right);  // at least 420 px of bars
  return l;
}

// One panel as a <g> at height y0; returns its height through `height`.
std::string bar_panel_group(const BarPanel& p, const BarLayout& l, double y0, double& height) {
  const double row = 24, gap = 8, bottom = 44, left = l.left, pw = l.width - l.left - l.right;
  double xmax = p.limit;
  for (const Bar& b : p.bars) {
    double sum = 0;
    for (double v : b.values) sum += v;
    xmax = std::max(xmax, sum);
  }
  if (!(xmax > 0)) xmax = 1;
  xmax *= 1.04;
  auto px = [&](double v) { return left + v / xmax * pw; };

  std::string g = fmt::format("<g transform=\"translate(0,{})\">\n", y0);
  g += fmt::format("<text x=\"10\" y=\"18\" font-size=\"15\" font-weight=\"bold\">{}</text>\n", svg_escape(p.title));
  std::vector<std::pair<int, std::string>> legend;
  for (size_t i = 0; i < p.parts.size(); ++i)
    if (std::any_of(p.bars.begin(), p.bars.end(), [&](const Bar& b) { return b.values[i] > 0; }))
      legend.emplace_back(int(i), p.parts[i]);
  double top = 40;
  g += legend_rows(legend, 10, l.width - 10, top);
  if (p.limit > 0) {  // the limit's key: a dashed line and its label, under the legend
    g += fmt::format("<line x1=\"10\" x2=\"30\" y1=\"{0:.1f}\" y2=\"{0:.1f}\" stroke=\"#000\" stroke-dasharray=\"5 3\"/>"
                     "<text x=\"36\" y=\"{1:.1f}\" font-size=\"11\">{2}</text>\n", top - 4, top, svg_escape(p.limit_label));
    top += 16;
  }
  top += 6;
  const double plot_bottom = top + double(p.bars.size()) * (row + gap);
  height = plot_bottom + bottom;
  g += x_axis(0, xmax, left, pw, top - 4, plot_bottom);
  for (size_t k = 0; k < p.bars.size(); ++k) {
    const Bar& b = p.bars[k];
    const double y = top + double(k) * (row + gap);
    g += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"11\" text-anchor=\"end\">{}</text>\n", left - 6,
                     y + row / 2 + 4, svg_escape(b.label));
    double x = 0;
    for (size_t i = 0; i < b.values.size(); ++i) {
      if (b.values[i] <= 0) continue;
      g += fmt::format("<rect x=\"{:.2f}\" y=\"{:.1f}\" width=\"{:.2f}\" height=\"{}\" fill=\"{}\">"
                       "<title>{}: {}</title></rect>\n",
                       px(x), y, px(x + b.values[i]) - px(x), row, palette(int(i)), svg_escape(p.parts[i]),
                       num(b.values[i]));
      x += b.values[i];
    }
    g += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"11\">{}</text>\n", px(x) + 5, y + row / 2 + 4,
                     svg_escape(b.note));
  }
  if (p.limit > 0)
    g += fmt::format("<line x1=\"{0:.1f}\" x2=\"{0:.1f}\" y1=\"{1:.1f}\" y2=\"{2:.1f}\" stroke=\"#000\" "
                     "stroke-dasharray=\"5 3\"/>\n", px(p.limit), top - 4, plot_bottom);
  g += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"12\" text-anchor=\"middle\">{}</text>\n",
                   left + pw / 2, plot_bottom + 32, svg_escape(p.unit));
  return g + "</g>\n";
}
}  // namespace

std::string bar_panels_svg(const std::vector<BarPanel>& panels, double width) {
  for (const BarPanel& p : panels) check_panel(p);
  const BarLayout layout = bar_layout(panels, width);
  std::string body;
  double y = 0;
  for (const BarPanel& p : panels) {
    double h = 0;
    body += bar_panel_group(p, layout, y, h);
    y += h;
  }
  return svg_open(layout.width, y) + body + "</svg>\n";
}

std::string timeline_svg(const TimelineChart& c, double width) {
  EXA_CHECK(c.boxes.size() == c.lanes.size(), "timeline '{}': {} lanes but boxes for {}", c.title, c.lanes.size(),
            c.boxes.size());
  double tmax = 0;
  for (const auto& lane : c.boxes)
    for (const TimelineBox& b : lane) {
      EXA_CHECK(std::isfinite(b.start) && std::isfinite(b.end) && b.end >= b.start && b.start >= 0,
                "timeline '{}': box '{}' spans [{}, {}) (expected 0 <= start <= end)", c.title, b.label, b.start, b.end);
      EXA_CHECK(b.color >= 0 && size_t(b.color) < c.legend.size(), "timeline '{}': box '{}' has colour {} of {}",
                c.title, b.label, b.color, c.legend.size());
      tmax = std::max(tmax, b.end);
    }
  if (!(tmax > 0)) tmax = 1;
  size_t lane_chars = 4;
  for (const std::string& l : c.lanes) lane_chars = std::max(lane_chars, l.size());
  const double left = 16 + kCharW * double(lane_chars), right = 20, row = 26, gap = 6, bottom = 44;
  const double pw = width - left - right;
  std::vector<std::pair<int, std::string>> legend;
  for (size_t i = 0; i < c.legend.size(); ++i) legend.emplace_back(int(i), c.legend[i]);
  double top = 40;
  const std::string legend_svg = legend_rows(legend, 10, width - 10, top);
  top += 6;
  const double plot_bottom = top + double(c.lanes.size()) * (row + gap);
  const double height = plot_bottom + bottom;
  auto px = [&](double t) { return left + t / tmax * pw; };

  std::string g = svg_open(width, height);
  g += fmt::format("<text x=\"10\" y=\"18\" font-size=\"15\" font-weight=\"bold\">{}</text>\n", svg_escape(c.title));
  g += legend_svg;
  g += x_axis(0, tmax, left, pw, top - 4, plot_bottom);
  for (size_t r = 0; r < c.lanes.size(); ++r) {
    const double y = top + double(r) * (row + gap);
    g += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"11\" text-anchor=\"end\">{}</text>\n"
                     "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{}\" fill=\"#f4f4f4\"/>\n",
                     left - 6, y + row / 2 + 4, svg_escape(c.lanes[r]), left, y, pw, row);
    for (const TimelineBox& b : c.boxes[r]) {
      const double x0 = px(b.start), w = px(b.end) - x0;
      g += fmt::format("<rect x=\"{:.2f}\" y=\"{:.1f}\" width=\"{:.2f}\" height=\"{}\" fill=\"{}\" stroke=\"white\">"
                       "<title>{}</title></rect>\n", x0, y, w, row, palette(b.color), svg_escape(b.label));
      if (w >= kCharW * double(b.label.size()) + 2)
        g += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"11\" text-anchor=\"middle\" "
                         "fill=\"white\">{}</text>\n", x0 + w / 2, y + row / 2 + 4, svg_escape(b.label));
    }
  }
  g += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"12\" text-anchor=\"middle\">{}</text>\n",
                   left + pw / 2, plot_bottom + 32, svg_escape(c.x_label));
  return g + "</svg>\n";
}

}  // namespace exatrain::report
