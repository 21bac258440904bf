// The TOML library: toml11 3.7 (Debian's libtoml11-dev), behind a guard. Every TOML text exatrain
// reads from a user goes through parse_toml, which refuses before toml11 sees it what toml11 3.7
// mishandles (each found by fuzzing, docs/security.md "The TOML parser"):
//   - invalid UTF-8 (toml11 reads past the end of a literal string that ends inside a multi-byte
//     sequence: a heap-buffer-overflow);
//   - nesting of arrays and inline tables deeper than kMaxTomlDepth (toml11 recurses once per
//     level: ~5,900 levels overflow the stack);
//   - integers outside int64 (toml11 clamps 2^64-1 to 2^63-1 without a word).
// toml++ 3.3 (libtomlplusplus-dev) was the alternative; our fuzzer found undefined behaviour in
// it within seconds (a generated Unicode table reaches __builtin_unreachable for ordinary
// characters such as U+00E9 where whitespace may appear; a reachable assertion in parse_key), so
// exatrain stays with guarded toml11. toml_text is the writer every TOML value exatrain prints
// goes through.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>

#include <toml.hpp>

namespace exatrain {

// A job file nests two levels; the guard allows this many.
inline constexpr int kMaxTomlDepth = 32;

// The guard alone: "" when `text` is valid UTF-8, nests at most kMaxTomlDepth arrays and inline
// tables, and writes no integer outside int64 (outside strings and comments); else the problem,
// with its line and column ("3:14: ...").
std::string toml_guard_problem(std::string_view text);

// Parses TOML text after the guard; any problem is an exatrain::Error "SOURCE: not valid TOML: ...".
toml::value parse_toml(std::string_view text, const std::string& source);

// The TOML text of one value, so that parsing it gives the same value back: toml11's writer for
// strings (a single-line basic string with escapes), integers, booleans and arrays; a float as
// the shortest digits that read back as the same double (toml11 writes 17 digits:
// 0.00059999999999999995 for 6e-4).
std::string toml_text(const toml::value& value);

}  // namespace exatrain
