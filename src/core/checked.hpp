// Overflow-checked integer arithmetic for the sizes, counts and offsets that readers take from
// files (docs/security.md): a product or sum that does not fit is reported, never wrapped. The
// readers check every such value before they allocate, map or copy anything with it.
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

namespace exatrain {

// a * b, a + b, or nullopt when the exact result does not fit the type.
inline std::optional<uint64_t> mul_u64(uint64_t a, uint64_t b) {
  uint64_t r;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}
inline std::optional<uint64_t> add_u64(uint64_t a, uint64_t b) {
  uint64_t r;
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}
inline std::optional<int64_t> mul_i64(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}
inline std::optional<int64_t> add_i64(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}

// The element count of a shape: nullopt when a dimension is negative or the product exceeds
// `max` (default: what an int64 holds). An empty shape (a scalar) has one element.
inline std::optional<int64_t> checked_numel(const std::vector<int64_t>& shape, int64_t max = INT64_MAX) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return std::nullopt;
    auto p = mul_i64(n, d);
    if (!p || *p > max) return std::nullopt;
    n = *p;
  }
  return n;
}

}  // namespace exatrain
