// A small SVG line chart (axes with "nice" ticks, several series, a legend).
// Hand-written: the output is ~100 lines of SVG text, and no Debian C++ package draws plots
// without pulling in a GUI toolkit; SVG opens in any browser.
#pragma once
#include <string>
#include <vector>

namespace exatrain::report {

struct Series {
  std::string name;
  std::string color;       // any SVG colour, e.g. "#1f77b4"
  std::vector<double> xs;  // same length as ys
  std::vector<double> ys;
  bool markers = false;    // draw dots (e.g. sparse validation points) besides the line
  std::string dash;        // SVG stroke-dasharray, e.g. "6 3"; empty = solid (runs drawn over each other)
};

struct Chart {
  std::string title, x_label, y_label;
  std::vector<Series> series;
  bool log_y = false;
  bool log_x = false;  // e.g. bytes sent, which span decades between compressors
};

// Text for SVG: <, > and & escaped (also used by figures.hpp).
std::string svg_escape(const std::string& s);

// Ticks at 1, 2 or 5 times a power of ten covering [lo, hi], about `target` of them.
std::vector<double> nice_ticks(double lo, double hi, int target = 6);

// One chart as an SVG <g> group placed at (x0, y0) of size w x h.
std::string chart_group(const Chart& chart, double x0, double y0, double w, double h);

// A complete SVG document with the charts stacked vertically.
std::string svg_document(const std::vector<Chart>& charts, double width = 820, double chart_height = 300);

}  // namespace exatrain::report
