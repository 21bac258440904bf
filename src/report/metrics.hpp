// RUN_DIR/metrics.jsonl: one JSON object per line (contract: each training step has at least
// step, loss, grad_norm, lr, tokens_per_s, mfu; each evaluation has step and val_loss).
// The writer flushes each line so that a crash loses at most the line being written, and a
// reader tolerates a torn last line (a run killed mid-write) but no corruption elsewhere.
#pragma once
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace exatrain::report {

class MetricsWriter {
 public:
  // Appends to `path` (a resumed run continues the same file).
  explicit MetricsWriter(const std::string& path);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;
  void write(const nlohmann::json& record);

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
};

// Reads every record; a torn final line is skipped, a bad line elsewhere is an error naming
// file and line number.
std::vector<nlohmann::json> read_metrics(const std::string& path);

// A resumed run continues from a checkpoint's step: drops the records of later steps (written
// before a crash, or by a longer earlier run), so the file keeps one record per step. Atomic.
void drop_metrics_after(const std::string& path, int64_t step);

}  // namespace exatrain::report
