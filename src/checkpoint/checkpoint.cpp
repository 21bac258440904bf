#include "checkpoint/checkpoint.hpp"

#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/check.hpp"
#include "core/fileio.hpp"
#include "core/sha256.hpp"

namespace exatrain::checkpoint {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

void write_durable(const std::string& path, std::string_view bytes, FileEntry* entry) {
  OutputFile out(path);
  out.write(bytes.data(), bytes.size());
  out.sync_and_close();
  if (entry) *entry = {out.bytes_written(), out.sha256_of_appended()};
}

void check_file_name(const std::string& file) {
  EXA_CHECK(!file.empty() && file.find('/') == std::string::npos && file[0] != '.' &&
                file != kManifestName && file != kCompleteName,
            "checkpoint: bad file name \"{}\" (plain names only; manifest.json and COMPLETE are "
            "reserved)", file);
}

// Parses step_NNNNNNNN; -1 when the name is not a checkpoint directory's.
int64_t parse_step(const std::string& name) {
  if (name.size() <= 5 || name.compare(0, 5, "step_") != 0) return -1;
  int64_t step = 0;
  for (size_t i = 5; i < name.size(); i++) {
    if (name[i] < '0' || name[i] > '9') return -1;
    step = step * 10 + (name[i] - '0');
  }
  return step;
}

}  // namespace

std::string checkpoint_dir_name(int64_t step) { return fmt::format("step_{:08d}", step); }

CheckpointWriter::CheckpointWriter(const std::string& root, int64_t step)
    : root_(root), step_(step) {
  EXA_CHECK(step >= 0, "checkpoint: step {} is negative", step);
  std::error_code ec;
  fs::create_directories(root, ec);
  EXA_CHECK(!ec, "cannot create checkpoint directory {}: {}", root, ec.message());
  final_dir_ = (fs::path(root) / checkpoint_dir_name(step)).string();
  temp_dir_ = (fs::path(root) / fmt::format(".tmp-{}-{}", checkpoint_dir_name(step), ::getpid()))
                  .string();
  fs::remove_all(temp_dir_, ec);  // a leftover of a crashed save by a process with our pid
  fs::create_directory(temp_dir_, ec);
  EXA_CHECK(!ec, "cannot create {}: {}", temp_dir_, ec.message());
}

CheckpointWriter::~CheckpointWriter() {
  if (!committed_) {
    std::error_code ec;
    fs::remove_all(temp_dir_, ec);  // best effort: never throw from a destructor
  }
}

void CheckpointWriter::add_safetensors(const std::string& file, const SafetensorsWriter& tensors) {
  check_file_name(file);
  std::string path = (fs::path(temp_dir_) / file).string();
  OutputFile out(path);
  tensors.write(out);
  out.sync_and_close();
  files_[file] = {out.bytes_written(), out.sha256_of_appended()};
}

void CheckpointWriter::add_blob(const std::string& file, std::string_view bytes) {
  check_file_name(file);
  write_durable((fs::path(temp_dir_) / file).string(), bytes, &files_[file]);
}

void CheckpointWriter::add_written_file(const std::string& file, const FileEntry& entry) {
  check_file_name(file);
  std::string path = (fs::path(temp_dir_) / file).string();
  uint64_t size = file_size_or_throw(path);
  EXA_CHECK(size == entry.bytes, "checkpoint file {}: {} bytes on disk, {} announced", path, size,
            entry.bytes);
  files_[file] = entry;
}

std::string CheckpointWriter::commit(int64_t keep_last) {
  EXA_CHECK(!committed_, "checkpoint {} committed twice", final_dir_);
  json manifest = {{"format", "exatrain-checkpoint"}, {"version", 1}, {"step", step_}};
  manifest["files"] = json::object();
  for (const auto& [name, e] : files_) {
    manifest["files"][name] = {{"bytes", e.bytes}, {"sha256", e.sha256}};
  }
  std::string manifest_text = manifest.dump(2) + "\n";
  write_durable((fs::path(temp_dir_) / kManifestName).string(), manifest_text, nullptr);
  json complete = {{"step", step_}, {"manifest_sha256", sha256_hex(manifest_text)}};
  write_durable((fs::path(temp_dir_) / kCompleteName).string(), complete.dump() + "\n", nullptr);
  fsync_directory(temp_dir_);

  // Saving a step that already exists (e.g. after a resume): move the old one aside first, so
  // that a complete copy exists at every moment.
  std::string aside;
  if (fs::exists(final_dir_)) {
    aside = (fs::path(root_) / fmt::format(".old-{}-{}", checkpoint_dir_name(step_), ::getpid()))
                .string();
    std::error_code ec;
    fs::remove_all(aside, ec);
    EXA_SYSCHECK(::rename(final_dir_.c_str(), aside.c_str()) == 0, "cannot rename {} to {}",
                 final_dir_, aside);
  }
  EXA_SYSCHECK(::rename(temp_dir_.c_str(), final_dir_.c_str()) == 0, "cannot rename {} to {}",
               temp_dir_, final_dir_);
  committed_ = true;
  fsync_directory(root_);
  std::error_code ec;
  if (!aside.empty()) fs::remove_all(aside, ec);

  // Keep keep_last complete checkpoints: this one and the newest others (this one is kept even
  // when it is not the newest, e.g. after resuming from an older step); drop leftovers of
  // crashed saves.
  if (keep_last > 0) {
    std::vector<CheckpointRef> others;
    for (const auto& c : list_checkpoints(root_)) {
      if (c.step != step_) others.push_back(c);
    }
    size_t keep_others = size_t(keep_last - 1);
    for (size_t i = 0; i + keep_others < others.size(); i++) fs::remove_all(others[i].dir, ec);
  }
  for (const auto& entry : fs::directory_iterator(root_, ec)) {
    std::string name = entry.path().filename().string();
    bool ours = name.find(fmt::format("-{}", ::getpid())) != std::string::npos;
    if ((name.rfind(".tmp-step_", 0) == 0 || name.rfind(".old-step_", 0) == 0) && !ours) {
      fs::remove_all(entry.path(), ec);
    }
  }
  return final_dir_;
}

CheckpointReader::CheckpointReader(const std::string& dir, Verify verify) : dir_(dir) {
  EXA_CHECK(fs::is_directory(dir), "checkpoint {} does not exist or is not a directory", dir);
  std::string complete_path = path_of(kCompleteName);
  EXA_CHECK(fs::exists(complete_path),
            "checkpoint {} is incomplete: no {} marker (the save was interrupted)", dir,
            kCompleteName);
  std::string manifest_text = read_file_bytes(path_of(kManifestName));
  json complete, manifest;
  try {
    complete = json::parse(read_file_bytes(complete_path));
    manifest = json::parse(manifest_text);
  } catch (const json::exception& e) {
    EXA_FAIL("checkpoint {}: {} or {} is not valid JSON: {}", dir, kCompleteName, kManifestName,
             e.what());
  }
  std::string manifest_sum = sha256_hex(manifest_text);
  EXA_CHECK(complete.value("manifest_sha256", "") == manifest_sum,
            "checkpoint {}: {} is corrupted (sha256 {} but {} records {})", dir, kManifestName,
            manifest_sum, kCompleteName, complete.value("manifest_sha256", "?"));
  try {
    EXA_CHECK(manifest.at("format") == "exatrain-checkpoint" && manifest.at("version") == 1,
              "checkpoint {}: {} has format {} version {}, expected exatrain-checkpoint 1", dir,
              kManifestName, manifest.at("format").dump(), manifest.at("version").dump());
    step_ = manifest.at("step");
    for (const auto& [name, e] : manifest.at("files").items()) {
      files_[name] = {e.at("bytes").get<uint64_t>(), e.at("sha256").get<std::string>()};
    }
  } catch (const json::exception& e) {
    EXA_FAIL("checkpoint {}: malformed {}: {}", dir, kManifestName, e.what());
  }
  for (const auto& [name, e] : files_) {
    std::string path = path_of(name);
    EXA_CHECK(fs::exists(path), "checkpoint file {} is missing", path);
    uint64_t size = file_size_or_throw(path);
    EXA_CHECK(size == e.bytes, "checkpoint file {} is truncated or damaged: {} bytes on disk, the "
              "manifest expects {}", path, size, e.bytes);
    if (verify == Verify::sizes) continue;
    std::string sum = sha256_file(path);
    EXA_CHECK(sum == e.sha256, "checkpoint file {} is corrupted: sha256 {} but the manifest "
              "says {}", path, sum, e.sha256);
  }
}

std::string CheckpointReader::path_of(const std::string& file) const {
  return (fs::path(dir_) / file).string();
}

std::string CheckpointReader::blob(const std::string& file) const {
  EXA_CHECK(has(file), "checkpoint {} has no file {}", dir_, file);
  return read_file_bytes(path_of(file));
}

std::unique_ptr<SafetensorsReader> CheckpointReader::safetensors(const std::string& file) const {
  EXA_CHECK(has(file), "checkpoint {} has no file {}", dir_, file);
  return std::make_unique<SafetensorsReader>(path_of(file));
}

std::vector<CheckpointRef> list_checkpoints(const std::string& root) {
  std::vector<CheckpointRef> out;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return out;
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    int64_t step = parse_step(entry.path().filename().string());
    if (step >= 0 && fs::exists(entry.path() / kCompleteName)) {
      out.push_back({entry.path().string(), step});
    }
  }
  std::sort(out.begin(), out.end(),
            [](const CheckpointRef& a, const CheckpointRef& b) { return a.step < b.step; });
  return out;
}

std::optional<CheckpointRef> find_latest_valid(const std::string& root, std::FILE* log) {
  std::error_code ec;
  std::vector<std::string> candidates;
  if (fs::is_directory(root, ec)) {
    for (const auto& entry : fs::directory_iterator(root, ec)) {
      if (parse_step(entry.path().filename().string()) >= 0) {
        candidates.push_back(entry.path().string());
      }
    }
  }
  // Newest first; a directory without COMPLETE is reported by the reader and skipped.
  std::sort(candidates.begin(), candidates.end(), [](const std::string& a, const std::string& b) {
    return parse_step(fs::path(a).filename().string()) > parse_step(fs::path(b).filename().string());
  });
  for (const std::string& dir : candidates) {
    try {
      CheckpointReader reader(dir);
      return CheckpointRef{dir, reader.step()};
    } catch (const Error& e) {
      if (log) std::fprintf(log, "exatrain: warning: skipping checkpoint: %s\n", e.what());
    }
  }
  return std::nullopt;
}

std::optional<CheckpointRef> resolve_resume(const std::string& resume, const std::string& root,
                                            std::FILE* log) {
  if (resume.empty() || resume == "none") return std::nullopt;
  if (resume == "auto") {
    auto found = find_latest_valid(root, log);
    if (!found && log) {
      std::fprintf(log,
                   "\n"
                   "************************************************************************\n"
                   "exatrain: WARNING: --resume auto found NO complete checkpoint in %s\n"
                   "exatrain: WARNING: starting from step 0 with freshly initialised weights\n"
                   "************************************************************************\n\n",
                   root.c_str());
    }
    return found;
  }
  CheckpointReader reader(resume);  // throws with the reason when it does not verify
  return CheckpointRef{resume, reader.step()};
}

}  // namespace exatrain::checkpoint
