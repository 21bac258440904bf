// Error handling shared by every room: one exception type whose message carries file:line,
// and checking macros for conditions and system calls (llm.c style: nothing fails silently).
//
// Owns (room core/): Error and the EXA_CHECK / EXA_SYSCHECK / EXA_FAIL macros, checked durable file
// I/O (fileio.hpp), SHA-256, where data files are found (paths.hpp), splitmix64. May use: no other
// room (the bottom of the graph: fmt, OpenSSL's libcrypto and the C++ and POSIX libraries only).
#pragma once
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace exatrain {

// Thrown for every user-facing error (bad job file, corrupt checkpoint, ...). The message names
// the file, key or value and what was expected; the CLI prints it and exits non-zero.
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

[[noreturn]] inline void fail_at(const char* file, int line, const std::string& msg) {
  throw Error(fmt::format("{} ({}:{})", msg, file, line));
}

}  // namespace exatrain

// EXA_CHECK(cond, "fmt {}", args...): throws exatrain::Error with file:line when cond is false.
#define EXA_CHECK(cond, ...)                                                       \
  do {                                                                             \
    if (!(cond)) ::exatrain::fail_at(__FILE__, __LINE__, fmt::format(__VA_ARGS__)); \
  } while (0)

// EXA_FAIL("fmt {}", args...): unconditional error.
#define EXA_FAIL(...) ::exatrain::fail_at(__FILE__, __LINE__, fmt::format(__VA_ARGS__))

// EXA_SYSCHECK(expr, "what"): for system calls returning -1 (or nullptr) on failure; adds errno.
#define EXA_SYSCHECK(ok, ...)                                                          \
  do {                                                                                 \
    if (!(ok)) {                                                                       \
      int exa_errno_ = errno;                                                          \
      ::exatrain::fail_at(__FILE__, __LINE__,                                          \
                          fmt::format(__VA_ARGS__) + ": " + std::strerror(exa_errno_)); \
    }                                                                                  \
  } while (0)
