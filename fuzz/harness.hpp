// What every fuzz harness shares (fuzz/README in docs/security.md, "Fuzzing"). A harness feeds
// one input to one reader; the reader may accept it or throw exatrain::Error (a clear message),
// and nothing else: a crash, a sanitizer report, a hang, or any other exception (which the CLI
// would print as "internal error") is a finding. Readers that take a path get the input written
// to a file in a private temporary directory.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "core/check.hpp"

namespace exatrain::fuzz {

// A private directory for this process (created once, removed at exit).
const std::string& scratch_dir();
// Writes `bytes` to scratch_dir()/name (replacing it) and returns the path.
std::string write_scratch(const std::string& name, const std::string& bytes);

// Runs f(); exatrain::Error is the expected outcome of bad input. Any other exception aborts
// with its message, so that libFuzzer records the input.
template <class F>
void expect_clear_errors(F&& f) {
  try {
    f();
  } catch (const exatrain::Error&) {
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz: an exception other than exatrain::Error (the CLI's \"internal error\"): %s\n",
                 e.what());
    std::abort();
  }
}

// A property that must hold for every accepted input (e.g. parse(write(job)) == job).
inline void require(bool ok, const std::string& what) {
  if (ok) return;
  std::fprintf(stderr, "fuzz: property violated: %s\n", what.c_str());
  std::abort();
}

}  // namespace exatrain::fuzz
