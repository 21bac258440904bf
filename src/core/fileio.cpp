#include "core/fileio.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

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

std::string read_file_bytes(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  EXA_SYSCHECK(fd >= 0, "cannot open {}", path);
  std::string out;
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
    out.append(buf, size_t(n));
  }
  ::close(fd);
  return out;
}

uint64_t file_size_or_throw(const std::string& path) {
  struct stat st;
  EXA_SYSCHECK(::stat(path.c_str(), &st) == 0, "cannot stat {}", path);
  return uint64_t(st.st_size);
}

MappedFile::MappedFile(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  EXA_SYSCHECK(fd >= 0, "cannot open {}", path);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    EXA_FAIL("cannot stat {}: {}", path, std::strerror(err));
  }
  size_ = uint64_t(st.st_size);
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

LineReader::LineReader(const std::string& path) : path_(path) {
  const char* tool = ends_with(path, ".xz") ? "xz" : ends_with(path, ".gz") ? "gzip" : nullptr;
  if (tool) {
    // Check the file first: the decompressor's own message would not reach the user clearly.
    EXA_SYSCHECK(::access(path.c_str(), R_OK) == 0, "cannot read input {}", path);
    std::string cmd = fmt::format("{} -dc -- {}", tool, shell_quote(path));
    file_ = ::popen(cmd.c_str(), "r");
    EXA_SYSCHECK(file_ != nullptr, "cannot start `{}` for {}", cmd, path);
    piped_ = true;
  } else {
    file_ = std::fopen(path.c_str(), "rb");
    EXA_SYSCHECK(file_ != nullptr, "cannot open input {}", path);
  }
}

LineReader::~LineReader() {
  if (file_) piped_ ? ::pclose(file_) : std::fclose(file_);
  std::free(buf_);
}

bool LineReader::next(std::string& line) {
  EXA_CHECK(file_ != nullptr, "read from {} after its end", path_);
  errno = 0;
  ssize_t n = ::getline(&buf_, &cap_, file_);
  if (n < 0) {
    EXA_SYSCHECK(!std::ferror(file_), "cannot read input {}", path_);
    FILE* f = file_;
    file_ = nullptr;
    if (piped_) {
      int status = ::pclose(f);
      EXA_CHECK(status == 0, "decompressing {} failed (exit status {}); is the file complete?",
                path_, WIFEXITED(status) ? WEXITSTATUS(status) : status);
    } else {
      std::fclose(f);
    }
    return false;
  }
  bytes_read_ += uint64_t(n);
  if (n > 0 && buf_[n - 1] == '\n') n--;
  line.assign(buf_, size_t(n));
  return true;
}

}  // namespace exatrain
