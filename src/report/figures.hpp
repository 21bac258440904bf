// Figures beyond the line chart (svg_chart.hpp): stacked horizontal bars (a prediction's time and
// memory breakdown, one bar per plan) and a timeline of boxes per row (a pipeline schedule).
// Hand-written SVG text for the same reason as svg_chart.hpp. This room knows nothing of plans or
// schedules: the caller (cli/) turns those into bars and boxes.
#pragma once
#include <string>
#include <vector>

namespace exatrain::report {

// One bar of a BarPanel: values[i] is the length of part i (the panel's parts), stacked left to
// right; `note` is printed after the bar (e.g. "2.67 s", "does not fit").
struct Bar {
  std::string label;
  std::vector<double> values;
  std::string note;
};

struct BarPanel {
  std::string title, unit;         // unit: the x axis ("s per step", "GiB per GPU")
  std::vector<std::string> parts;  // stacking order = legend order; a part that is 0 in every bar is left out of the legend
  std::vector<Bar> bars;           // top to bottom
  double limit = 0;                // > 0: a dashed vertical line at this value (e.g. device memory)
  std::string limit_label;
};

// Every panel stacked vertically in one SVG document. Throws Error when a bar's values do not
// match its panel's parts or a value is negative or not finite.
std::string bar_panels_svg(const std::vector<BarPanel>& panels, double width = 960);

// A timeline: one row per lane (e.g. a pipeline rank), boxes [start, end) in time units.
struct TimelineBox {
  double start = 0, end = 0;
  std::string label;  // drawn inside the box when it is wide enough
  int color = 0;      // index into the chart's legend
};
struct TimelineChart {
  std::string title, x_label;
  std::vector<std::string> lanes;                 // row names, top to bottom
  std::vector<std::vector<TimelineBox>> boxes;    // [lane]
  std::vector<std::string> legend;                // colour i's meaning
};

// Throws Error when boxes and lanes differ in number, a box ends before it starts, or a colour
// has no legend entry.
std::string timeline_svg(const TimelineChart& chart, double width = 960);

// Colour i of the figures' palette (matplotlib's tab10, repeating).
const char* palette(int i);

}  // namespace exatrain::report
