// Checkpoint directories (docs/checkpoints.md): written atomically, verified on load.
//
//   CHECKPOINTS_ROOT/                 (e.g. RUN_DIR/checkpoints)
//     step_00000100/
//       model.safetensors, optimizer.safetensors, trainer_state.json, job.toml, ... (the trainer's)
//       manifest.json                 {"step": 100, "files": {NAME: {"bytes", "sha256"}}}
//       COMPLETE                      written last: {"step": 100, "manifest_sha256": ...}
//
// Save protocol: every file goes into a hidden temporary directory (.tmp-step_..-PID), each
// fsynced; then manifest.json, then COMPLETE, both fsynced; the temporary directory is fsynced,
// renamed to step_NNNNNNNN and the root fsynced. Only then are older checkpoints pruned (keep
// the last K). A failure at any point leaves earlier checkpoints untouched and removes the
// temporary directory. Load verifies COMPLETE, the manifest and every file's size and SHA-256.
//
// Owns (room checkpoint/): this directory protocol, the safetensors format (safetensors.hpp) and
// `export` (export.hpp), on host bytes; the training checkpoint's tensors are train/checkpoint_io's.
// May use: core/, job/.
#pragma once
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "checkpoint/safetensors.hpp"

namespace exatrain::checkpoint {

inline constexpr const char* kManifestName = "manifest.json";
inline constexpr const char* kCompleteName = "COMPLETE";
// The largest step a checkpoint may record: [train] steps' own limit (2^40).
inline constexpr int64_t kMaxStep = int64_t(1) << 40;
// manifest.json and COMPLETE are small JSON files (a few hundred bytes per listed file).
inline constexpr uint64_t kMaxManifestBytes = uint64_t(16) << 20;

struct FileEntry {
  uint64_t bytes = 0;
  std::string sha256;
};

class CheckpointWriter {
 public:
  // Starts a checkpoint of `step` under `root` (created if needed).
  CheckpointWriter(const std::string& root, int64_t step);
  ~CheckpointWriter();  // an uncommitted checkpoint's temporary directory is removed
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Where files go until commit (other ranks may write theirs here and add_written_file them).
  const std::string& temp_dir() const { return temp_dir_; }
  void add_safetensors(const std::string& file, const SafetensorsWriter& tensors);
  // Opaque bytes: optimizer state, RNG state, data cursor JSON, the job file text, ...
  void add_blob(const std::string& file, std::string_view bytes);
  // A file already written (and fsynced) into temp_dir() by someone else, e.g. another rank.
  void add_written_file(const std::string& file, const FileEntry& entry);
  // Publishes the checkpoint, then prunes to `keep_last` complete checkpoints: this one and the
  // newest others (<= 0: keep all). Returns its directory.
  std::string commit(int64_t keep_last);

 private:
  std::string root_, temp_dir_, final_dir_;
  int64_t step_;
  std::map<std::string, FileEntry> files_;
  bool committed_ = false;
};

// What the reader checks of every file listed in the manifest: its size and SHA-256 (reads the
// whole file once), or its size only, for a checkpoint whose checksums another process (e.g. rank
// 0 of a distributed job) has just verified, so that N ranks do not read it N times.
enum class Verify { checksums, sizes };

// A verified checkpoint (the constructor checks COMPLETE, manifest and every file). What it
// trusts and checks (docs/security.md): COMPLETE and manifest.json are regular files of at most
// kMaxManifestBytes; the steps of COMPLETE, the manifest and the directory name agree and lie in
// [0, kMaxStep]; every listed name is a plain file name inside the directory (never a path);
// every listed file is a regular file of the listed size and SHA-256.
class CheckpointReader {
 public:
  explicit CheckpointReader(const std::string& dir, Verify verify = Verify::checksums);
  const std::string& dir() const { return dir_; }
  int64_t step() const { return step_; }
  const std::map<std::string, FileEntry>& files() const { return files_; }
  bool has(const std::string& file) const { return files_.count(file) > 0; }
  // The bytes of a listed file; a file larger than `max_bytes` is refused unread.
  std::string blob(const std::string& file, uint64_t max_bytes = UINT64_MAX) const;
  std::unique_ptr<SafetensorsReader> safetensors(const std::string& file) const;

 private:
  std::string path_of(const std::string& file) const;
  void read_manifest(const nlohmann::json& manifest, const nlohmann::json& complete);
  std::string dir_;
  int64_t step_ = 0;
  std::map<std::string, FileEntry> files_;
};

struct CheckpointRef {
  std::string dir;
  int64_t step = 0;
};

// Complete checkpoints under root (named step_N, with COMPLETE), oldest first; unverified.
std::vector<CheckpointRef> list_checkpoints(const std::string& root);

// The newest checkpoint that verifies completely. Checkpoints that fail (incomplete, corrupt)
// are skipped, each with a warning line on `log` naming the problem; with `move_aside` each
// skipped one newer than the result is also renamed step_N.incomplete (no COMPLETE marker) or
// step_N.damaged (anything else), so that a later save of that step cannot overwrite what it
// holds. nullopt when none.
std::optional<CheckpointRef> find_latest_valid(const std::string& root, std::FILE* log,
                                               bool move_aside = false);

// The start of a run, before it resumes or saves: leftovers of interrupted saves under `root`
// are dealt with, one line on `log` each. Temporary directories (.tmp-step_*; never complete)
// are removed; a complete checkpoint that a save had moved aside to replace it (.old-step_N-PID)
// is put back when step_N is missing, and removed otherwise. Nothing else is touched.
void recover_checkpoint_root(const std::string& root, std::FILE* log);

// `--resume` semantics, after recover_checkpoint_root: "" or "none" = start fresh; "auto" = the
// newest valid checkpoint under root (find_latest_valid with move_aside), or, when there is
// none, a loud warning on `log` and nullopt; anything else is a checkpoint directory, which
// must verify (an error otherwise).
std::optional<CheckpointRef> resolve_resume(const std::string& resume, const std::string& root,
                                            std::FILE* log);

// Renames `dir` to dir + suffix (or dir + suffix + ".N" when that exists); returns the new path.
std::string move_aside(const std::string& dir, const std::string& suffix);

std::string checkpoint_dir_name(int64_t step);  // "step_00000100"

}  // namespace exatrain::checkpoint
