// Vectorisable exp/tanh/sigmoid for the CPU kernels. Hand-written because glibc's vector math
// (libmvec) is only used by GCC under -ffast-math, which this project does not use; the scalar
// libm calls made gelu, softmax and cross-entropy a visible share of a training step.
// exp: Cody-Waite range reduction + the Cephes expf polynomial; relative error 8e-8 (about
// 1 ulp) measured on the clamped range [-87.3, 88.72], < 4 ulp asserted in the tests.
// Branch-free so that loops over it vectorise.
#pragma once
#include <bit>
#include <cmath>
#include <cstdint>

namespace exatrain::vm {

inline float exp(float x) {
  // Plain comparisons and the 1.5*2^23 rounding trick instead of fmin/fmax/floor: GCC 12 does
  // not vectorise those libm calls without -ffast-math.
  x = x < -87.3f ? -87.3f : x;
  x = x > 88.72f ? 88.72f : x;
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round to nearest
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;  // x - n*ln2, in two parts
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float e = p * r * r + r + 1.0f;
  // 2^n as 2^n1 * 2^n2 with n1 = floor(n/2): each factor is a normal float for every n in
  // [-126, 128], where a single 2^n would overflow the exponent field at n = 128.
  const int32_t ni = int32_t(n);
  const int32_t n1 = ni >> 1, n2 = ni - n1;
  return e * std::bit_cast<float>((n1 + 127) << 23) * std::bit_cast<float>((n2 + 127) << 23);
}

inline float sigmoid(float x) { return 1.0f / (1.0f + exp(-x)); }

// tanh(x) = 1 - 2 / (exp(2x) + 1): exact limits at +-inf, absolute error ~1e-7 near 0.
inline float tanh(float x) { return 1.0f - 2.0f / (exp(2.0f * x) + 1.0f); }

}  // namespace exatrain::vm
