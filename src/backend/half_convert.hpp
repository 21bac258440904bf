// Scalar conversions between float32 and the 16-bit float formats of Backend::Half, shared by the
// CPU backend and the CUDA kernels (host + device under nvcc) so that both give the same bits.
// bf16 = the upper 16 bits of a float32; f16 = IEEE 754 binary16 (5 exponent bits, 10 mantissa
// bits, bias 15, subnormals below 2^-14). float32 -> 16 bits rounds to nearest, ties to even;
// a NaN stays a (quiet) NaN with its sign; 16 bits -> float32 is exact.
#pragma once
#include <cstdint>
#include <cstring>

#ifdef __CUDACC__
#define EXA_HOST_DEVICE __host__ __device__
#else
#define EXA_HOST_DEVICE
#endif

namespace exatrain::half_convert {

EXA_HOST_DEVICE inline uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
EXA_HOST_DEVICE inline float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

EXA_HOST_DEVICE inline uint16_t f32_to_bf16(float f) {
  uint32_t u = bits_of(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);  // NaN: keep it quiet
  u += 0x7fffu + ((u >> 16) & 1u);                                            // ties to even
  return uint16_t(u >> 16);
}
EXA_HOST_DEVICE inline float bf16_to_f32(uint16_t h) { return float_of(uint32_t(h) << 16); }

EXA_HOST_DEVICE inline uint16_t f32_to_f16(float f) {
  const uint32_t u = bits_of(f), sign = (u >> 16) & 0x8000u, ax = u & 0x7fffffffu;
  if (ax > 0x7f800000u) return uint16_t(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));  // NaN
  if (ax >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // >= 65520 (tie above 65504): inf
  if (ax < 0x38800000u) {
    // |f| < 2^-14: a subnormal q * 2^-24. |f| = mant * 2^(E-150) (E = the biased exponent, mant the
    // 24-bit significand), so |f| / 2^-24 = mant >> (126 - E), rounded here on the dropped bits
    // (ties to even; no dependence on the FPU's rounding mode). q = 1024 is 2^-14, the smallest normal.
    if (ax < 0x33000000u) return uint16_t(sign);  // |f| < 2^-25: 0 (2^-25 itself is the tie, even = 0)
    const uint32_t mant = (ax & 0x7fffffu) | 0x800000u;
    const int s = 126 - int(ax >> 23);  // 14 .. 24
    uint32_t q = mant >> s;
    const uint32_t rem = mant & ((1u << s) - 1u), half = 1u << (s - 1);
    if (rem > half || (rem == half && (q & 1u))) q++;
    return uint16_t(sign | q);
  }
  uint32_t h = ((((ax >> 23) - 127 + 15) << 10) | ((ax >> 13) & 0x3ffu));
  const uint32_t rem = ax & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;  // a carry into the exponent is right
  return uint16_t(sign | h);
}

EXA_HOST_DEVICE inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0) {  // zero or subnormal: m * 2^-24, exact in float32
    const float v = float(m) * 5.9604644775390625e-08f;
    return float_of(bits_of(v) | sign);
  }
  if (e == 31) return float_of(sign | 0x7f800000u | (m << 13));  // inf / NaN
  return float_of(sign | ((e - 15 + 127) << 23) | (m << 13));
}

}  // namespace exatrain::half_convert
