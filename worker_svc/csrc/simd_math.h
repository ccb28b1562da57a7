// Scalar helpers that the compiler vectorises, shared by the CPU kernels (csrc/*.cpp).
#pragma once
#include <torch/extension.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace stepserve {

inline float to_float(float x) { return x; }

// bfloat16 -> float32 is a 16-bit shift, written so that the compiler vectorises it
// (c10::BFloat16's own operator is scalar).
inline float to_float(c10::BFloat16 x) {
  uint16_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float out;
  std::memcpy(&out, &wide, sizeof out);
  return out;
}

inline float to_float(c10::Half x) { return static_cast<float>(x); }
inline float to_float(double x) { return static_cast<float>(x); }

// exp(x) for x <= 0 (scores minus their maximum), vectorisable: x = n ln2 + r, |r| <= ln2 / 2,
// exp(r) by Cephes' expf polynomial (about 1 ulp), 2^n built in the exponent bits. Inputs
// below -87 (weights under 1e-38 beside the maximum's 1) are clamped there.
inline float exp_nonpositive(float x) {
  x = std::max(x, -87.f);
  float n = x * 1.44269504088896341f;
  n = (n + 12582912.f) - 12582912.f;  // round to nearest (1.5 * 2^23)
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.f;
  const uint32_t bits = static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23;
  float two_n;
  std::memcpy(&two_n, &bits, sizeof two_n);
  return p * two_n;
}

}  // namespace stepserve
