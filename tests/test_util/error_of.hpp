// The message of the exatrain::Error that f() throws, or "" when it throws none: what the
// bad-input tests compare against the expected text.
#pragma once
#include <string>

#include "core/check.hpp"

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const exatrain::Error& e) {
    return e.what();
  }
  return "";
}
