// The metrics reader of `exatrain report` (src/report/metrics.cpp) and what report does with the
// records: the summary, the SVG charts, measured vs predicted (no job.toml here: it says why).
#include <string>

#include "harness.hpp"
#include "report/metrics.hpp"
#include "report/report.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  exatrain::fuzz::write_scratch("metrics.jsonl", std::string(reinterpret_cast<const char*>(data), size));
  exatrain::fuzz::expect_clear_errors([&] {
    const exatrain::report::RunSummary s = exatrain::report::write_report(exatrain::fuzz::scratch_dir());
    (void)exatrain::report::format_summary(s, exatrain::fuzz::scratch_dir());
  });
  return 0;
}
