#include "checkpoint/checkpoint.hpp"

#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/check.hpp"
#include "core/fileio.hpp"
#include "core/json_fields.hpp"
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
    if (step > kMaxStep) return -1;  // not a step any run reaches (and no overflow)
  }
  return step;
}

}  // namespace

std::string checkpoint_dir_name(int64_t step) { return fmt::format("step_{:08d}", step); }

CheckpointWriter::CheckpointWriter(const std::string& root, int64_t step)
    : root_(root), step_(step) {
  EXA_CHECK(step >= 0 && step <= kMaxStep, "checkpoint: step {} is outside [0, {}]", step, kMaxStep);
  make_directories(root, "the checkpoint directory");
  std::error_code ec;
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
  if (fs::exists(final_dir_) && !fs::exists(fs::path(final_dir_) / kCompleteName)) {
    // An incomplete directory of this step (an interrupted save of another process, or one that
    // lost its marker) is kept under another name, never overwritten: it may be all there is.
    const std::string kept = move_aside(final_dir_, ".incomplete");
    fmt::print(stderr, "exatrain: warning: {} had no {} marker; moved aside to {} (kept)\n", final_dir_,
               kCompleteName, kept);
  }
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
  recover_checkpoint_root(root_, nullptr);  // leftovers of crashed saves (ours are gone)
  return final_dir_;
}

CheckpointReader::CheckpointReader(const std::string& dir, Verify verify) : dir_(dir) {
  EXA_CHECK(fs::is_directory(dir), "checkpoint {} does not exist or is not a directory", dir);
  std::string complete_path = path_of(kCompleteName);
  EXA_CHECK(fs::exists(complete_path),
            "checkpoint {} is incomplete: no {} marker (the save was interrupted)", dir,
            kCompleteName);
  // Both are small JSON files; a FIFO or device in their place is refused without blocking.
  std::string manifest_text = read_file_bytes(path_of(kManifestName), kMaxManifestBytes);
  std::string complete_text = read_file_bytes(complete_path, kMaxManifestBytes);
  json complete, manifest;
  try {
    complete = json::parse(complete_text);
    manifest = json::parse(manifest_text);
  } catch (const json::exception& e) {
    EXA_FAIL("checkpoint {}: {} or {} is not valid JSON: {}", dir, kCompleteName, kManifestName,
             e.what());
  }
  EXA_CHECK(complete.is_object() && manifest.is_object(), "checkpoint {}: {} and {} must be JSON objects", dir,
            kCompleteName, kManifestName);
  std::string manifest_sum = sha256_hex(manifest_text);
  EXA_CHECK(complete.value("manifest_sha256", json()) == manifest_sum,
            "checkpoint {}: {} is corrupted (sha256 {} but {} records {})", dir, kManifestName,
            manifest_sum, kCompleteName, json_shown(complete.value("manifest_sha256", json("?"))));
  read_manifest(manifest, complete);
  for (const auto& [name, e] : files_) {
    std::string path = path_of(name);
    EXA_CHECK(fs::exists(path), "checkpoint file {} is missing", path);
    uint64_t size = file_size_or_throw(path);  // a regular file (not a FIFO or device)
    EXA_CHECK(size == e.bytes, "checkpoint file {} is truncated or damaged: {} bytes on disk, the "
              "manifest expects {}", path, size, e.bytes);
    if (verify == Verify::sizes) continue;
    std::string sum = sha256_file(path);
    EXA_CHECK(sum == e.sha256, "checkpoint file {} is corrupted: sha256 {} but the manifest "
              "says {}", path, sum, e.sha256);
  }
}

void CheckpointReader::read_manifest(const json& manifest, const json& complete) {
  const std::string where = fmt::format("checkpoint {}: {}", dir_, kManifestName);
  EXA_CHECK(json_member(manifest, "format", where) == "exatrain-checkpoint" && json_member(manifest, "version", where) == 1,
            "{} has format {} version {}, expected exatrain-checkpoint 1", where,
            json_shown(manifest.at("format")), json_shown(manifest.at("version")));
  step_ = json_to_int(json_member(manifest, "step", where), where + ": \"step\"", 0, kMaxStep);
  const int64_t marked = json_to_int(json_member(complete, "step", dir_ + "/" + kCompleteName),
                                     fmt::format("checkpoint {}: {}: \"step\"", dir_, kCompleteName), 0, kMaxStep);
  EXA_CHECK(marked == step_, "checkpoint {}: {} marks step {} but {} says step {}", dir_, kCompleteName, marked,
            kManifestName, step_);
  // A directory named like a checkpoint must hold that step (a renamed copy would mislead --resume).
  const int64_t named = parse_step(fs::path(dir_).lexically_normal().filename().string());
  EXA_CHECK(named < 0 || named == step_, "checkpoint {}: the directory is named for step {} but {} says step {}",
            dir_, named, kManifestName, step_);
  const json& files = json_member(manifest, "files", where);
  EXA_CHECK(files.is_object(), "{}: \"files\" must be an object {{NAME: {{\"bytes\", \"sha256\"}}}}", where);
  for (const auto& [name, e] : files.items()) {
    // Names come from the file: only plain names inside this directory, never a path.
    EXA_CHECK(is_plain_file_name(name) && name != kManifestName && name != kCompleteName,
              "{}: lists the file {}, expected a plain file name inside the checkpoint (no '/', no control "
              "characters; not {} or {})", where, json_shown(json(name)), kManifestName, kCompleteName);
    const std::string key = fmt::format("{}: \"files\".{}", where, json_shown(json(name)));
    files_[name] = {json_to_uint(json_member(e, "bytes", key), key + ".bytes"),
                    json_to_sha256(json_member(e, "sha256", key), key + ".sha256")};
  }
}

std::string CheckpointReader::path_of(const std::string& file) const {
  return (fs::path(dir_) / file).string();
}

std::string CheckpointReader::blob(const std::string& file, uint64_t max_bytes) const {
  EXA_CHECK(has(file), "checkpoint {} has no file {}", dir_, file);
  return read_file_bytes(path_of(file), max_bytes);
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

std::optional<CheckpointRef> find_latest_valid(const std::string& root, std::FILE* log, bool move_aside_rejected) {
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
      if (!move_aside_rejected) continue;
      const bool incomplete = !fs::exists(fs::path(dir) / kCompleteName);
      const std::string kept = move_aside(dir, incomplete ? ".incomplete" : ".damaged");
      if (log) std::fprintf(log, "exatrain: warning: moved %s aside to %s (kept, so that no save overwrites it)\n",
                            dir.c_str(), kept.c_str());
    }
  }
  return std::nullopt;
}

std::string move_aside(const std::string& dir, const std::string& suffix) {
  std::string target = dir + suffix;
  for (int i = 2; fs::exists(target); i++) target = fmt::format("{}{}.{}", dir, suffix, i);
  EXA_SYSCHECK(::rename(dir.c_str(), target.c_str()) == 0, "cannot rename {} to {}", dir, target);
  return target;
}

void recover_checkpoint_root(const std::string& root, std::FILE* log) {
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return;
  std::vector<fs::path> temps, olds;
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(".tmp-step_", 0) == 0) temps.push_back(entry.path());
    if (name.rfind(".old-step_", 0) == 0) olds.push_back(entry.path());
  }
  uint64_t bytes = 0;
  for (const fs::path& t : temps) {
    for (const auto& f : fs::recursive_directory_iterator(t, ec))
      if (f.is_regular_file(ec)) bytes += f.file_size(ec);
    fs::remove_all(t, ec);
    EXA_CHECK(!ec, "cannot remove {}, the temporary directory of an interrupted save: {}", t.string(), ec.message());
  }
  if (!temps.empty() && log)
    std::fprintf(log, "exatrain: removed %zu temporary director%s of interrupted checkpoint saves (%.1f MB) in %s\n",
                 temps.size(), temps.size() == 1 ? "y" : "ies", double(bytes) / 1e6, root.c_str());
  for (const fs::path& o : olds) {
    // ".old-step_00000200-PID": the complete step_00000200 that a save was replacing.
    const std::string name = o.filename().string();
    const std::string step_name = name.substr(5, name.rfind('-') == std::string::npos || name.rfind('-') < 5
                                                     ? std::string::npos : name.rfind('-') - 5);
    const fs::path original = fs::path(root) / step_name;
    if (parse_step(step_name) >= 0 && !fs::exists(original) && fs::exists(o / kCompleteName)) {
      EXA_SYSCHECK(::rename(o.c_str(), original.c_str()) == 0, "cannot rename {} to {}", o.string(), original.string());
      if (log) std::fprintf(log, "exatrain: restored %s from %s (a save that replaced it was interrupted)\n",
                            original.c_str(), o.c_str());
    } else {
      fs::remove_all(o, ec);
      if (log) std::fprintf(log, "exatrain: removed %s, left by an interrupted save\n", o.c_str());
    }
  }
}

std::optional<CheckpointRef> resolve_resume(const std::string& resume, const std::string& root,
                                            std::FILE* log) {
  recover_checkpoint_root(root, log);
  if (resume.empty() || resume == "none") return std::nullopt;
  if (resume == "auto") {
    auto found = find_latest_valid(root, log, /*move_aside=*/true);
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
