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

std::string read_file_bytes(const std::string& path);
uint64_t file_size_or_throw(const std::string& path);

// A read-only memory map of a whole file (size 0 is allowed: data() is then nullptr).
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
// through the system decompressor (xz -dc / gzip -dc), so inputs can exceed memory.
class LineReader {
 public:
  explicit LineReader(const std::string& path);
  ~LineReader();
  LineReader(const LineReader&) = delete;
  LineReader& operator=(const LineReader&) = delete;
  // Next line without its '\n' (a trailing '\r' is kept: bytes are not altered).
  // Returns false at the end; throws if the decompressor failed.
  bool next(std::string& line);
  uint64_t bytes_read() const { return bytes_read_; }  // decompressed bytes so far
  bool compressed() const { return piped_; }

 private:
  std::string path_;
  FILE* file_ = nullptr;
  bool piped_ = false;
  char* buf_ = nullptr;
  size_t cap_ = 0;
  uint64_t bytes_read_ = 0;
};

}  // namespace exatrain
