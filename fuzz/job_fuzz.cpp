// The job-file parser (src/job/parse.cpp) on arbitrary text, with the round-trip property: every
// accepted job, written by job_to_toml, parses back to the same job, and its text is a fixed point.
// An input whose first line is "--set section.key=value" also goes through that override.
#include <string>
#include <vector>

#include "harness.hpp"
#include "job/parse.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> sets;
  if (text.rfind("--set ", 0) == 0) {
    const size_t nl = text.find('\n');
    sets.push_back(text.substr(6, nl == std::string::npos ? std::string::npos : nl - 6));
    text = nl == std::string::npos ? "" : text.substr(nl + 1);
  }
  exatrain::fuzz::expect_clear_errors([&] {
    const exatrain::Job job = exatrain::parse_job(text, "fuzz.toml", sets);
    const std::string written = exatrain::job_to_toml(job);
    exatrain::Job back;
    try {
      back = exatrain::parse_job(written, "written.toml");
    } catch (const exatrain::Error& e) {
      exatrain::fuzz::require(false, std::string("job_to_toml wrote a job that does not parse: ") + e.what() +
                                         "\n" + written);
    }
    exatrain::fuzz::require(exatrain::same_settings(job, back), "parse(write(job)) != job:\n" + written);
    exatrain::fuzz::require(exatrain::job_to_toml(back) == written, "write(parse(write(job))) != write(job)");
  });
  return 0;
}
