// Typed fields of JSON that came from a file (manifests, safetensors headers, trainer state): an
// integer must be a JSON integer (not a float such as 1e300, not a string) inside the range the
// reader states, a string must be a string. Errors name where the value is, the value and what
// was expected; nothing is converted with a cast that could wrap or overflow.
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "core/check.hpp"

namespace exatrain {

// The value as it appears in an error message, cut to a readable length.
inline std::string json_shown(const nlohmann::json& v) {
  std::string s = v.dump(-1, ' ', true, nlohmann::json::error_handler_t::replace);
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

// `what` names the value, e.g. "ckpt/manifest.json: \"step\"".
inline uint64_t json_to_uint(const nlohmann::json& v, const std::string& what, uint64_t lo = 0,
                             uint64_t hi = UINT64_MAX) {
  uint64_t x = 0;
  bool ok = false;
  if (v.is_number_unsigned()) {
    x = v.get<uint64_t>();
    ok = true;
  } else if (v.is_number_integer() && v.get<int64_t>() >= 0) {
    x = uint64_t(v.get<int64_t>());
    ok = true;
  }
  EXA_CHECK(ok && x >= lo && x <= hi, "{} = {}: expected an integer in [{}, {}]", what, json_shown(v), lo, hi);
  return x;
}

inline int64_t json_to_int(const nlohmann::json& v, const std::string& what, int64_t lo, int64_t hi) {
  int64_t x = 0;
  bool ok = false;
  if (v.is_number_unsigned()) {
    ok = v.get<uint64_t>() <= uint64_t(INT64_MAX);
    if (ok) x = int64_t(v.get<uint64_t>());
  } else if (v.is_number_integer()) {
    x = v.get<int64_t>();
    ok = true;
  }
  EXA_CHECK(ok && x >= lo && x <= hi, "{} = {}: expected an integer in [{}, {}]", what, json_shown(v), lo, hi);
  return x;
}

inline std::string json_to_string(const nlohmann::json& v, const std::string& what) {
  EXA_CHECK(v.is_string(), "{} = {}: expected a string", what, json_shown(v));
  return v.get<std::string>();
}

// The member `key` of object `obj` (which must be an object and have it).
inline const nlohmann::json& json_member(const nlohmann::json& obj, const std::string& key, const std::string& where) {
  EXA_CHECK(obj.is_object(), "{}: expected a JSON object, got {}", where, json_shown(obj));
  auto it = obj.find(key);
  EXA_CHECK(it != obj.end(), "{}: has no \"{}\"", where, key);
  return *it;
}

// A SHA-256 in hex, as sha256sum prints it: 64 lowercase hex digits.
inline std::string json_to_sha256(const nlohmann::json& v, const std::string& what) {
  std::string s = json_to_string(v, what);
  bool ok = s.size() == 64;
  for (char c : s) ok = ok && ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'));
  EXA_CHECK(ok, "{} = {}: expected a SHA-256 (64 lowercase hex digits)", what, json_shown(v));
  return s;
}

}  // namespace exatrain
