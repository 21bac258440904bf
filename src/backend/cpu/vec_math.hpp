// Vectorisable exp/tanh/sigmoid for the CPU kernels. Hand-written because glibc's vector math
// (libmvec) is only used by GCC under -ffast-math, which this project does not use; the scalar
// libm calls made gelu, softmax and cross-entropy a visible share of a training step.
// exp: Cody-Waite range reduction + the Cephes expf polynomial (max error ~2 ulp on the
// clamped range [-87.3, 88.7]), branch-free so loops over it vectorise.
#pragma once
#include <bit>
#include <cmath>
#include <cstdint>

namespace exatrain::vm {

inline float exp(float x) {
  // Plain comparisons and the 1.5*2^23 rounding trick instead of fmin/fmax/floor: GCC 12 does
  // not vectorise those libm calls without -ffast-math.
  x = x < -87.3f ? -87.3f : x;
  x = x > 88.7f ? 88.7f : x;
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round to nearest
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;  // x - n*ln2, in two parts
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float e = p * r * r + r + 1.0f;
  const int32_t bits = (int32_t(n) + 127) << 23;  // 2^n
  return e * std::bit_cast<float>(bits);
}

inline float sigmoid(float x) { return 1.0f / (1.0f + exp(-x)); }

// tanh(x) = 1 - 2 / (exp(2x) + 1): exact limits at +-inf, absolute error ~1e-7 near 0.
inline float tanh(float x) { return 1.0f - 2.0f / (exp(2.0f * x) + 1.0f); }

}  // namespace exatrain::vm
