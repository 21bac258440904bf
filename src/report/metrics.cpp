#include "report/metrics.hpp"

#include <filesystem>
#include <fstream>

#include "core/check.hpp"
#include "core/fileio.hpp"

namespace exatrain::report {

MetricsWriter::MetricsWriter(const std::string& path) : path_(path) {
  file_ = std::fopen(path.c_str(), "a");
  EXA_SYSCHECK(file_ != nullptr, "cannot open metrics file '{}' for appending", path);
}

MetricsWriter::~MetricsWriter() {
  if (file_) std::fclose(file_);
}

void MetricsWriter::write(const nlohmann::json& record) {
  std::string line = record.dump() + "\n";
  EXA_SYSCHECK(std::fwrite(line.data(), 1, line.size(), file_) == line.size(),
               "cannot write metrics file '{}'", path_);
  EXA_SYSCHECK(std::fflush(file_) == 0, "cannot flush metrics file '{}'", path_);
}

std::vector<nlohmann::json> read_metrics(const std::string& path) {
  std::ifstream in(path);
  EXA_CHECK(in.good(), "cannot open metrics file '{}' (expected RUN_DIR/metrics.jsonl written by "
                       "`exatrain train`)", path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) lines.push_back(line);
  std::vector<nlohmann::json> records;
  for (size_t i = 0; i < lines.size(); ++i) {
    try {
      records.push_back(nlohmann::json::parse(lines[i]));
    } catch (const nlohmann::json::parse_error&) {
      if (i + 1 == lines.size()) break;  // a torn last line: the run was killed mid-write
      EXA_FAIL("{}:{}: not a JSON object (metrics.jsonl holds one JSON object per line)", path, i + 1);
    }
  }
  return records;
}

void drop_metrics_after(const std::string& path, int64_t step) {
  if (!std::filesystem::exists(path)) return;
  std::string kept;
  for (const auto& r : read_metrics(path))
    if (r.contains("step") && r["step"].get<int64_t>() <= step) kept += r.dump() + "\n";
  write_file_atomic(path, kept);
}

}  // namespace exatrain::report
