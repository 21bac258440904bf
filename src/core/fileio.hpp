// Checked file I/O shared by data/ and checkpoint/: every system call is checked and every error
// names the file. Durable writes (fsync of the file, then of its directory) and atomic replace
// (temporary name + rename) live here so data shards and checkpoints follow one protocol.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/sha256.hpp"

namespace exatrain {

// A file being written. Keeps a running SHA-256 of the bytes appended with write() (not of
// bytes placed with pwrite(), which is for headers patched in place: hash those yourself).
class OutputFile {
 public:
  // create: creates or truncates; existing: opens a file that exists for writing in place (e.g. a
  // checkpoint file every rank writes its slices of with pwrite).
  enum class Open { create, existing };
  explicit OutputFile(const std::string& path, Open how = Open::create);
  ~OutputFile();                                 // closes; never throws
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  void write(const void* data, size_t bytes);               // appends, all or throws
  void pwrite(const void* data, size_t bytes, uint64_t offset);
  void sync_and_close();                                    // fsync then close, checked
  uint64_t bytes_written() const { return bytes_written_; }
  std::string sha256_of_appended() { return hash_.hex_digest(); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t bytes_written_ = 0;
  Sha256 hash_;
};

// Test hook: after `bytes` more bytes have been written through OutputFile (all files
// together, write and pwrite), every write fails with ENOSPC, as on a full disk. Negative = off
// (the default).
void inject_write_failure_after(int64_t bytes);

// fsync a directory so that the names created or renamed in it survive a crash.
void fsync_directory(const std::string& dir);

// Writes `bytes` to `path` durably and atomically: `path.tmp`, fsync, rename, fsync of the dir.
void write_file_atomic(const std::string& path, std::string_view bytes);

// Opens `path` read-only, refusing anything but a regular file (or a link to one): a FIFO, a
// device, a socket or a directory is an error naming the file and what it is, and the open
// never blocks (O_NONBLOCK, cleared afterwards), so a FIFO planted in place of a checkpoint or
// dataset file cannot hang a reader. Returns the descriptor; *size gets the file's size.
int open_regular_file(const std::string& path, uint64_t* size = nullptr);

// The whole file; a file larger than `max_bytes` is refused before anything is read (the
// limit a reader states for a small metadata file: a job file, a manifest, a JSON state).
std::string read_file_bytes(const std::string& path, uint64_t max_bytes = UINT64_MAX);
// The size of a regular file (stat; a FIFO, device or directory is an error naming it).
uint64_t file_size_or_throw(const std::string& path);

// A name a manifest may list for a file inside its own directory: non-empty, at most 255 bytes,
// no '/', not "." or "..", no control character (NUL, newline, ...). Anything else could
// reach outside the directory or cut the name short.
bool is_plain_file_name(std::string_view name);

// Creates the directory `path` (and its parents) and checks that it is a writable directory.
// `what` names where the path came from (e.g. "job.toml: [train] run_dir", "export --out"):
// every error says it, the path and the system's reason.
void make_directories(const std::string& path, const std::string& what);

// A read-only memory map of a whole file (size 0 is allowed: data() is then nullptr).
// An open file descriptor, closed when it goes: a constructor that throws after opening a file
// (a reader refusing a corrupt header) leaks nothing (fuzz/safetensors_fuzz.cpp ran out of
// descriptors after 20,000 refused files before this).
class UniqueFd {
 public:
  explicit UniqueFd(int fd = -1) : fd_(fd) {}
  ~UniqueFd();
  UniqueFd(UniqueFd&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  UniqueFd& operator=(UniqueFd&& o) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_ = -1;
};

class MappedFile {
 public:
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
};

// Reads a text file line by line without loading it: plain files directly, `.xz` and `.gz`
// through the system decompressor (xz -dc / gzip -dc), so inputs can exceed memory. A line
// longer than `max_piece_bytes` comes in pieces of at most that many bytes (cut between UTF-8
// characters), so memory stays bounded by the piece, not by the longest line of the input.
class LineReader {
 public:
  static constexpr size_t kDefaultMaxPiece = size_t(1) << 20;  // 1 MiB
  explicit LineReader(const std::string& path, size_t max_piece_bytes = kDefaultMaxPiece);
  ~LineReader();
  LineReader(const LineReader&) = delete;
  LineReader& operator=(const LineReader&) = delete;
  // The next piece of a line, without its '\n' (a trailing '\r' is kept: bytes are not
  // altered). *line_end tells whether the piece ends its line (false: more of it follows).
  // Returns false at the end; throws if the decompressor failed.
  bool next(std::string& piece, bool* line_end);
  // The next whole line, for inputs whose lines are known to be short (pieces joined).
  bool next(std::string& line);
  uint64_t bytes_read() const { return bytes_read_; }  // decompressed bytes so far
  bool compressed() const { return piped_; }

 private:
  bool fill();  // more bytes into buf_; false at the end of the input
  std::string path_;
  FILE* file_ = nullptr;
  bool piped_ = false;
  size_t max_piece_;
  std::vector<char> buf_;
  size_t begin_ = 0, end_ = 0;  // unread bytes of buf_
  std::string carry_;           // an incomplete UTF-8 character cut off the previous piece
  bool at_eof_ = false;
  bool mid_line_ = false;       // the last piece did not end its line
  uint64_t bytes_read_ = 0;
};

}  // namespace exatrain
