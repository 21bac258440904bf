// What the job-file tests of this folder share: the error text of parsing a job, and a substring test.
#pragma once
#include <string>
#include <vector>

#include "job/parse.hpp"
#include "../test_util/error_of.hpp"

namespace exatrain::job_test {
// The error text of parsing `text` (as job.toml, with the --set overrides `sets`), or "" when it parsed.
inline std::string parse_error(const std::string& text, const std::vector<std::string>& sets = {}) {
  return error_of([&] { parse_job(text, "job.toml", sets); });
}
inline bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }
}  // namespace exatrain::job_test
