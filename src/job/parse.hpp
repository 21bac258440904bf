// Reading a job file (../shared/contracts/job-file.md) into a validated Job.
//
// Order of precedence, lowest first: built-in defaults < the section's `preset` file
// (models/NAME.toml for [model], catalog/clusters/NAME.toml for [machine]) < the job file's keys
// < `--set section.key=value` overrides. Every problem (unknown key, wrong type, out-of-range value,
// impossible shape) is collected and reported together in one exatrain::Error, one line each,
// naming where the value came from, the key, the value and what was expected.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "job/job.hpp"

namespace exatrain {

// Checks a command adds to the file's own (e.g. `train`: one rank, fp32): they see the job as
// parsed and append one line per problem, reported together with the file's problems.
using JobCheck = std::function<void(const Job&, std::vector<std::string>& errors)>;

// A job file (and a preset file) is at most this large: a job is a few hundred bytes.
inline constexpr uint64_t kMaxJobFileBytes = uint64_t(1) << 20;

// Reads and validates the job file at `path`; `sets` are "section.key=value" overrides.
Job load_job(const std::string& path, const std::vector<std::string>& sets = {}, const JobCheck& extra = {});

// The same from TOML text; `source_name` stands for the file in error messages.
Job parse_job(const std::string& toml_text, const std::string& source_name,
              const std::vector<std::string>& sets = {}, const JobCheck& extra = {});

// Where the values of `keys` ("section.key") came from, for a problem that involves them: their
// distinct origins in order (the job file, a preset file, "--set section.key=value"), joined with
// " and "; the job file when every key has its default. E.g. "job.toml and --set model.heads=7".
std::string job_origin(const Job& job, const std::vector<std::string>& keys);

// The resolved job as TOML (every key explicit; "auto" for unresolved parallel fields), each
// value written by the TOML library. Parsing this text again gives the same Job (same_settings;
// the fuzzer checks it for every accepted job): checkpoints store it.
std::string job_to_toml(const Job& job);

// a and b describe the same run: every section equal, apart from what parsing records about the
// text (source, origins, the names of the presets applied, whether vocab was omitted).
bool same_settings(const Job& a, const Job& b);

}  // namespace exatrain
