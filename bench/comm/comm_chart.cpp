// Draws the benchmark's charts with the report room's SVG chart code (report/svg_chart.hpp):
//   comm_chart SPEC.json OUT.svg
// SPEC: {"charts": [{"title", "x_label", "y_label", "log_x", "log_y",
//                    "series": [{"name", "color", "xs", "ys", "markers", "dash"}]}], "height": 300}
// The Python scripts of bench/comm/ write the spec from their measurements.
#include <cstdio>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/fileio.hpp"
#include "report/svg_chart.hpp"

using namespace exatrain::report;

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: comm_chart SPEC.json OUT.svg\n");
    return 2;
  }
  std::ifstream in(argv[1]);
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json spec = nlohmann::json::parse(text.str());
  std::vector<Chart> charts;
  for (const auto& c : spec.at("charts")) {
    Chart chart;
    chart.title = c.value("title", "");
    chart.x_label = c.value("x_label", "");
    chart.y_label = c.value("y_label", "");
    chart.log_x = c.value("log_x", false);
    chart.log_y = c.value("log_y", false);
    for (const auto& s : c.at("series"))
      chart.series.push_back({s.value("name", ""), s.value("color", "#000"), s.at("xs").get<std::vector<double>>(),
                              s.at("ys").get<std::vector<double>>(), s.value("markers", false), s.value("dash", "")});
    charts.push_back(chart);
  }
  exatrain::write_file_atomic(argv[2], svg_document(charts, spec.value("width", 900.0), spec.value("height", 320.0)));
  return 0;
}
