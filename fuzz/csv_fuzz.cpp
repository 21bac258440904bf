// The CSV reader of `exatrain validate` (src/plan/validate.cpp): RFC-4180 fields, then every row
// turned into a planner case and predicted, and the report formatted.
#include <string>

#include "harness.hpp"
#include "plan/validate.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path =
      exatrain::fuzz::write_scratch("runs.csv", std::string(reinterpret_cast<const char*>(data), size));
  exatrain::fuzz::expect_clear_errors([&] {
    const exatrain::plan::ValidationReport rep = exatrain::plan::validate_runs(path);
    (void)exatrain::plan::format_report(rep, true);
  });
  return 0;
}
