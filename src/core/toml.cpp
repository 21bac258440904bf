#include "core/toml.hpp"

#include <charconv>
#include <cmath>
#include <limits>
#include <sstream>

#include <fmt/format.h>

#include "core/check.hpp"

namespace exatrain {

namespace {

// Length of the valid UTF-8 sequence at s[i] (no overlong forms, no surrogates, <= U+10FFFF),
// or 0. Hand-written: the guard must judge the bytes before any TOML library touches them.
size_t utf8_length(std::string_view s, size_t i) {
  const unsigned char c = static_cast<unsigned char>(s[i]);
  const size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
  if (len == 0 || i + len > s.size()) return 0;
  uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
  for (size_t k = 1; k < len; k++) {
    const unsigned char d = static_cast<unsigned char>(s[i + k]);
    if ((d & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (d & 0x3F);
  }
  static const uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < kMin[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return len;
}

// TOML's integer forms (decimal with an optional sign, 0x, 0o, 0b; single underscores between
// digits): whether `tok` is one, and if so whether it fits int64.
bool integer_token(std::string_view tok, bool* fits) {
  std::string digits;
  int base = 10;
  bool negative = false;
  size_t i = 0;
  if (!tok.empty() && (tok[0] == '+' || tok[0] == '-')) negative = tok[0] == '-', i = 1;
  if (tok.size() > i + 2 && tok[i] == '0' && (tok[i + 1] == 'x' || tok[i + 1] == 'o' || tok[i + 1] == 'b')) {
    if (i == 1) return false;  // TOML: no sign on 0x/0o/0b
    base = tok[i + 1] == 'x' ? 16 : tok[i + 1] == 'o' ? 8 : 2;
    i += 2;
  }
  for (; i < tok.size(); i++) {
    const char c = tok[i];
    const bool digit = base == 16 ? std::isxdigit(static_cast<unsigned char>(c)) != 0
                                  : c >= '0' && c < char('0' + std::min(base, 10));
    if (digit) digits += c;
    else if (c != '_') return false;
  }
  if (digits.empty()) return false;
  if (negative) digits.insert(digits.begin(), '-');
  int64_t v;
  const auto r = std::from_chars(digits.data(), digits.data() + digits.size(), v, base);
  *fits = r.ec == std::errc() && r.ptr == digits.data() + digits.size();
  return true;
}

// Skips the string starting at s[i] (basic "..." or literal '...', single- or multi-line);
// returns the index after it (s.size() when unterminated: toml11 then reports it).
size_t skip_string(std::string_view s, size_t i) {
  const char q = s[i];
  const bool multi = s.substr(i, 3) == std::string(3, q);
  for (size_t j = i + (multi ? 3 : 1); j < s.size(); j++) {
    if (q == '"' && s[j] == '\\') {
      j++;
      continue;
    }
    if (!multi && s[j] == '\n') return j;
    if (multi ? s.substr(j, 3) == std::string(3, q) : s[j] == q) {
      // A multi-line string may end in up to two more quotes ("""a"""" is a + one quote).
      size_t end = j + (multi ? 3 : 1);
      while (multi && end < s.size() && s[end] == q && end < j + 5) end++;
      return end;
    }
  }
  return s.size();
}

}  // namespace

std::string toml_guard_problem(std::string_view s) {
  size_t line = 1, line_start = 0;
  auto at = [&](size_t i) { return fmt::format("{}:{}", line, i - line_start + 1); };
  for (size_t i = 0; i < s.size();) {
    const size_t n = utf8_length(s, i);
    if (n == 0) return fmt::format("{}: invalid UTF-8 (byte 0x{:02x}); TOML files are UTF-8", at(i), uint8_t(s[i]));
    if (s[i] == '\n') line++, line_start = i + 1;
    i += n;
  }
  line = 1, line_start = 0;
  int depth = 0;
  for (size_t i = 0; i < s.size();) {
    const char c = s[i];
    if (c == '\n') {
      line++, line_start = ++i;
    } else if (c == '#') {
      while (i < s.size() && s[i] != '\n') i++;
    } else if (c == '"' || c == '\'') {
      const size_t end = skip_string(s, i);
      for (size_t k = i; k < end; k++)
        if (s[k] == '\n') line++, line_start = k + 1;
      i = end;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxTomlDepth)
        return fmt::format("{}: arrays and inline tables nested deeper than {} levels", at(i), kMaxTomlDepth);
      i++;
    } else if (c == ']' || c == '}') {
      depth = std::max(0, depth - 1);
      i++;
    } else if (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '+' || c == '-') {
      size_t j = i;
      while (j < s.size() && (std::isalnum(static_cast<unsigned char>(s[j])) || s[j] == '_' || s[j] == '+' ||
                              s[j] == '-' || s[j] == '.' || s[j] == ':'))
        j++;
      bool fits = true;
      if (integer_token(s.substr(i, j - i), &fits) && !fits)
        return fmt::format("{}: the integer {} is outside the 64-bit range of TOML integers (-2^63 .. 2^63-1); "
                           "refused, not clamped", at(i), s.substr(i, std::min<size_t>(j - i, 40)));
      i = j;
    } else {
      i++;
    }
  }
  return "";
}

toml::value parse_toml(std::string_view text, const std::string& source) {
  if (std::string problem = toml_guard_problem(text); !problem.empty())
    EXA_FAIL("{}:{}: not valid TOML: {}", source, problem.substr(0, problem.find(": ")),
             problem.substr(problem.find(": ") + 2));
  std::istringstream is{std::string(text)};
  try {
    return toml::parse(is, source);
  } catch (const std::exception& e) {
    EXA_FAIL("{}: not valid TOML: {}", source, e.what());
  }
}

std::string toml_text(const toml::value& value) {
  if (value.is_floating() && std::isfinite(value.as_floating())) {
    std::string s = fmt::format("{}", value.as_floating());  // shortest round-trip digits
    if (s.find_first_of(".eE") == std::string::npos) s += ".0";
    return s;
  }
  // Unlimited width: a string stays one line (a basic string, whatever kind it was read as),
  // with every control character escaped.
  std::string s = value.is_string() ? toml::format(toml::value(value.as_string().str), std::numeric_limits<std::size_t>::max())
                                    : toml::format(value, std::numeric_limits<std::size_t>::max());
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

}  // namespace exatrain
