#include "core/fileio.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "core/check.hpp"

namespace exatrain {

namespace {
std::atomic<int64_t> g_fail_after{-1};  // bytes left before injected ENOSPC; -1 = off

// Returns how many of `bytes` may be written before the injected failure (all when off).
size_t allowed_by_injection(size_t bytes) {
  int64_t left = g_fail_after.load();
  if (left < 0) return bytes;
  size_t allowed = std::min<size_t>(bytes, size_t(left));
  g_fail_after.store(left - int64_t(allowed));
  return allowed;
}
}  // namespace

void inject_write_failure_after(int64_t bytes) { g_fail_after.store(bytes); }

OutputFile::OutputFile(const std::string& path, Open how) : path_(path) {
  if (how == Open::existing) {
    fd_ = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
    EXA_SYSCHECK(fd_ >= 0, "cannot open {} for writing", path);
    return;
  }
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  EXA_SYSCHECK(fd_ >= 0, "cannot create {}", path);
}

OutputFile::~OutputFile() {
  if (fd_ >= 0) ::close(fd_);
}

void OutputFile::write(const void* data, size_t bytes) {
  EXA_CHECK(fd_ >= 0, "write to {} after it was closed", path_);
  hash_.update(data, bytes);
  const char* p = static_cast<const char*>(data);
  size_t left = bytes;
  while (left > 0) {
    size_t chunk = allowed_by_injection(left);
    if (chunk == 0) {
      errno = ENOSPC;
      EXA_SYSCHECK(false, "cannot write {} ({} bytes written so far)", path_, bytes_written_);
    }
    ssize_t n = ::write(fd_, p, chunk);
    if (n < 0 && errno == EINTR) continue;
    EXA_SYSCHECK(n >= 0, "cannot write {} ({} bytes written so far)", path_, bytes_written_);
    p += n;
    left -= size_t(n);
    bytes_written_ += uint64_t(n);
  }
}

void OutputFile::pwrite(const void* data, size_t bytes, uint64_t offset) {
  EXA_CHECK(fd_ >= 0, "write to {} after it was closed", path_);
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const size_t chunk = allowed_by_injection(bytes);
    if (chunk == 0) {
      errno = ENOSPC;
      EXA_SYSCHECK(false, "cannot write {} at offset {}", path_, offset);
    }
    ssize_t n = ::pwrite(fd_, p, chunk, off_t(offset));
    if (n < 0 && errno == EINTR) continue;
    EXA_SYSCHECK(n >= 0, "cannot write {} at offset {}", path_, offset);
    p += n;
    bytes -= size_t(n);
    offset += uint64_t(n);
  }
}

void OutputFile::sync_and_close() {
  EXA_CHECK(fd_ >= 0, "{} closed twice", path_);
  EXA_SYSCHECK(::fsync(fd_) == 0, "cannot fsync {}", path_);
  int fd = fd_;
  fd_ = -1;
  EXA_SYSCHECK(::close(fd) == 0, "cannot close {}", path_);
}

void fsync_directory(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  EXA_SYSCHECK(fd >= 0, "cannot open directory {}", dir);
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  errno = err;
  EXA_SYSCHECK(rc == 0, "cannot fsync directory {}", dir);
}

void write_file_atomic(const std::string& path, std::string_view bytes) {
  std::string tmp = path + ".tmp";
  {
    OutputFile out(tmp);
    try {
      out.write(bytes.data(), bytes.size());
      out.sync_and_close();
    } catch (...) {
      ::unlink(tmp.c_str());
      throw;
    }
  }
  EXA_SYSCHECK(::rename(tmp.c_str(), path.c_str()) == 0, "cannot rename {} to {}", tmp, path);
  std::string dir = std::filesystem::path(path).parent_path().string();
  fsync_directory(dir.empty() ? "." : dir);
}

namespace {
const char* file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}
}  // namespace

int open_regular_file(const std::string& path, uint64_t* size) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever.
  int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  EXA_SYSCHECK(fd >= 0, "cannot open {}", path);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    EXA_FAIL("cannot stat {}: {}", path, std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    EXA_FAIL("{} is {}, expected a regular file", path, file_kind(st.st_mode));
  }
  int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
    int err = errno;
    ::close(fd);
    EXA_FAIL("cannot set {} to blocking reads: {}", path, std::strerror(err));
  }
  if (size) *size = uint64_t(st.st_size);
  return fd;
}

std::string read_file_bytes(const std::string& path, uint64_t max_bytes) {
  uint64_t size = 0;
  int fd = open_regular_file(path, &size);
  if (size > max_bytes) {
    ::close(fd);
    EXA_FAIL("{} is {} bytes, more than the {} bytes expected of it", path, size, max_bytes);
  }
  std::string out;
  out.reserve(size_t(size));
  char buf[1 << 16];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      ::close(fd);
      EXA_FAIL("cannot read {}: {}", path, std::strerror(err));
    }
    if (n == 0) break;
    if (out.size() + size_t(n) > max_bytes) {  // grew while being read
      ::close(fd);
      EXA_FAIL("{} is more than the {} bytes expected of it", path, max_bytes);
    }
    out.append(buf, size_t(n));
  }
  ::close(fd);
  return out;
}

void make_directories(const std::string& path, const std::string& what) {
  EXA_CHECK(!path.empty(), "{} is empty: expected the path of a directory to write into", what);
  std::error_code ec;
  EXA_CHECK(!std::filesystem::exists(path, ec) || std::filesystem::is_directory(path, ec),
            "{} = \"{}\" exists but is not a directory", what, path);
  std::filesystem::create_directories(path, ec);
  EXA_CHECK(!ec, "{} = \"{}\": cannot create the directory: {}", what, path, ec.message());
  EXA_CHECK(std::filesystem::is_directory(path, ec), "{} = \"{}\" exists but is not a directory", what,
            path);
  EXA_SYSCHECK(::access(path.c_str(), W_OK | X_OK) == 0, "{} = \"{}\": the directory is not writable", what,
               path);
}

uint64_t file_size_or_throw(const std::string& path) {
  struct stat st;
  EXA_SYSCHECK(::stat(path.c_str(), &st) == 0, "cannot stat {}", path);
  EXA_CHECK(S_ISREG(st.st_mode), "{} is {}, expected a regular file", path, file_kind(st.st_mode));
  return uint64_t(st.st_size);
}

bool is_plain_file_name(std::string_view name) {
  if (name.empty() || name.size() > 255 || name == "." || name == "..") return false;
  for (char c : name)
    if (c == '/' || static_cast<unsigned char>(c) < 0x20 || c == 0x7f) return false;
  return true;
}

UniqueFd::~UniqueFd() {
  if (fd_ >= 0) ::close(fd_);
}

UniqueFd& UniqueFd::operator=(UniqueFd&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}

MappedFile::MappedFile(const std::string& path) : path_(path) {
  int fd = open_regular_file(path, &size_);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
    int err = errno;
    ::close(fd);
    errno = err;
    EXA_SYSCHECK(p != MAP_FAILED, "cannot mmap {} ({} bytes)", path, size_);
    data_ = static_cast<const uint8_t*>(p);
  } else {
    ::close(fd);
  }
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

namespace {
bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += (c == '\'') ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}
}  // namespace

LineReader::LineReader(const std::string& path, size_t max_piece_bytes)
    : path_(path), max_piece_(std::max<size_t>(max_piece_bytes, 8)), buf_(1 << 16) {
  const char* tool = ends_with(path, ".xz") ? "xz" : ends_with(path, ".gz") ? "gzip" : nullptr;
  int fd = open_regular_file(path);  // also before a decompressor: it would block on a FIFO too
  if (tool) {
    ::close(fd);
    std::string cmd = fmt::format("{} -dc -- {}", tool, shell_quote(path));
    file_ = ::popen(cmd.c_str(), "r");
    EXA_SYSCHECK(file_ != nullptr, "cannot start `{}` for {}", cmd, path);
    piped_ = true;
  } else {
    file_ = ::fdopen(fd, "rb");
    if (!file_) {
      int err = errno;
      ::close(fd);
      EXA_FAIL("cannot open input {}: {}", path, std::strerror(err));
    }
  }
}

LineReader::~LineReader() {
  if (file_) piped_ ? ::pclose(file_) : std::fclose(file_);
}

bool LineReader::fill() {
  if (at_eof_) return false;
  EXA_CHECK(file_ != nullptr, "read from {} after its end", path_);
  size_t n = std::fread(buf_.data(), 1, buf_.size(), file_);
  if (n > 0) {
    begin_ = 0, end_ = n;
    return true;
  }
  EXA_SYSCHECK(!std::ferror(file_), "cannot read input {}", path_);
  at_eof_ = true;
  FILE* f = file_;
  file_ = nullptr;
  if (piped_) {
    int status = ::pclose(f);
    EXA_CHECK(status == 0, "decompressing {} failed (exit status {}); is the file complete?", path_,
              WIFEXITED(status) ? WEXITSTATUS(status) : status);
  } else {
    std::fclose(f);
  }
  return false;
}

namespace {
// Bytes at the end of s that start a UTF-8 character whose continuation bytes are missing.
size_t incomplete_utf8_tail(const std::string& s) {
  for (size_t back = 1; back <= 3 && back <= s.size(); back++) {
    unsigned char c = static_cast<unsigned char>(s[s.size() - back]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte: look further back
    size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return len > back ? back : 0;
  }
  return 0;  // not UTF-8 (or complete): cut anywhere
}
}  // namespace

bool LineReader::next(std::string& piece, bool* line_end) {
  piece.swap(carry_);
  carry_.clear();
  bool any = !piece.empty();
  for (;;) {
    if (begin_ == end_ && !fill()) {
      *line_end = true;  // the last line had no '\n' (or ended with the previous piece)
      const bool more = any || mid_line_;
      mid_line_ = false;
      return more;
    }
    any = true;
    const size_t room = max_piece_ - piece.size();
    const size_t avail = end_ - begin_;
    const size_t look = std::min(room, avail);
    const char* start = buf_.data() + begin_;
    if (const void* nl = std::memchr(start, '\n', look)) {
      size_t n = size_t(static_cast<const char*>(nl) - start);
      piece.append(start, n);
      begin_ += n + 1;
      bytes_read_ += n + 1;
      *line_end = true;
      mid_line_ = false;
      return true;
    }
    piece.append(start, look);
    begin_ += look;
    bytes_read_ += look;
    if (piece.size() == max_piece_) {
      // A piece never splits a UTF-8 character: its first bytes move to the next piece.
      if (size_t tail = incomplete_utf8_tail(piece); tail > 0 && tail < piece.size()) {
        carry_.assign(piece.end() - std::ptrdiff_t(tail), piece.end());
        piece.erase(piece.end() - std::ptrdiff_t(tail), piece.end());
      }
      *line_end = false;
      mid_line_ = true;
      return true;
    }
  }
}

bool LineReader::next(std::string& line) {
  bool end = false, any = false;
  line.clear();
  std::string piece;
  while (next(piece, &end)) {
    any = true;
    line += piece;
    if (end) return true;
  }
  return any;
}

}  // namespace exatrain
