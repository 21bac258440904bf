#include "report/metrics.hpp"

#include <filesystem>
#include <limits>

#include "core/check.hpp"
#include "core/fileio.hpp"
#include "core/json_fields.hpp"

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

namespace {
// A record's fields of known meaning, checked so that every reader of the records (summary, chart,
// measured-vs-predicted) can take them as they are: "step" an integer >= 0, the figures numbers
// (null, as NaN is written, reads as NaN), "breakdown_s_per_rank" an array of objects of numbers.
void check_record(nlohmann::json& r, const std::string& where) {
  EXA_CHECK(r.is_object(), "{}: not a JSON object (metrics.jsonl holds one JSON object per line)", where);
  auto number = [&](nlohmann::json& v, const std::string& key) {
    if (v.is_null()) v = std::numeric_limits<double>::quiet_NaN();
    EXA_CHECK(v.is_number(), "{}: \"{}\" = {}: expected a number", where, key, json_shown(v));
  };
  if (r.contains("step")) json_to_int(r["step"], where + ": \"step\"", 0, int64_t(1) << 62);
  for (const char* key : {"loss", "val_loss", "grad_norm", "lr", "tokens_per_s", "mfu", "seconds"})
    if (r.contains(key)) number(r[key], key);
  if (r.contains("breakdown_s_per_rank")) {
    nlohmann::json& ranks = r["breakdown_s_per_rank"];
    EXA_CHECK(ranks.is_array(), "{}: \"breakdown_s_per_rank\" = {}: expected an array of objects", where,
              json_shown(ranks));
    for (auto& rank : ranks) {
      EXA_CHECK(rank.is_object(), "{}: \"breakdown_s_per_rank\" holds {}: expected objects of numbers", where,
                json_shown(rank));
      for (auto& [part, v] : rank.items()) number(v, "breakdown_s_per_rank." + part);
    }
  }
}
}  // namespace

std::vector<nlohmann::json> read_metrics(const std::string& path) {
  EXA_CHECK(std::filesystem::exists(path), "cannot open metrics file '{}' (expected RUN_DIR/metrics.jsonl written by "
                                           "`exatrain train`)", path);
  // Streamed, a line at most 1 MiB (a record is a few hundred bytes); never a FIFO or device.
  LineReader reader(path);
  std::vector<std::string> lines;
  std::string piece;
  bool line_end = true;
  for (std::string line; reader.next(piece, &line_end);) {
    line += piece;
    EXA_CHECK(line_end, "{}:{}: a line longer than {} bytes: not a metrics record", path, lines.size() + 1,
              LineReader::kDefaultMaxPiece);
    if (!line.empty()) lines.push_back(line);
    line.clear();
  }
  std::vector<nlohmann::json> records;
  for (size_t i = 0; i < lines.size(); ++i) {
    try {
      records.push_back(nlohmann::json::parse(lines[i]));
    } catch (const nlohmann::json::parse_error&) {
      if (i + 1 == lines.size()) break;  // a torn last line: the run was killed mid-write
      EXA_FAIL("{}:{}: not a JSON object (metrics.jsonl holds one JSON object per line)", path, i + 1);
    } catch (const nlohmann::json::exception& e) {  // whole but unreadable, e.g. a number beyond double
      EXA_FAIL("{}:{}: not a metrics record: {}", path, i + 1, e.what());
    }
    check_record(records.back(), fmt::format("{}:{}", path, i + 1));
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
