// The job-file parser (src/job/parse.cpp) on arbitrary text, with the round-trip property: every
// accepted job, written by job_to_toml, parses back to the same job, and its text is a fixed point.
// An input whose first line is "--set section.key=value" also goes through that override.
// An accepted job with a resolved [parallel] then goes through what `predict` does (the catalog
// check, the plan's rules, the prediction and rank 0's bytes): the planner's counts must not
// overflow for any job the file's rules accept (UBSan traps on signed overflow).
#include <string>
#include <vector>

#include "cli/job_plan.hpp"
#include "harness.hpp"
#include "job/parse.hpp"
#include "plan/comm.hpp"
#include "plan/predict.hpp"

namespace {
// `exatrain predict JOB` without printing: refused with an Error, or a prediction.
void predict_like_the_cli(const exatrain::Job& job) {
  using namespace exatrain;
  std::vector<std::string> errors;
  cli::check_job_catalog(job, errors);
  if (!errors.empty() || !cli::parallel_is_resolved(job.parallel)) return;
  const plan::Plan p = cli::resolved_plan_of(job, "fuzz.toml");
  (void)plan::bytes_sent_per_step(job.model, p, plan::rank_position(p, 0));
  plan::check_machine_for_plan(job.machine, p, "fuzz.toml");
  (void)plan::predict(job.model, job.machine, p);
}
}  // namespace

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
    predict_like_the_cli(job);
  });
  return 0;
}
