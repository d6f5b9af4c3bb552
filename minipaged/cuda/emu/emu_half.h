// emu_half.h: a software __half for the CPU harness (cuda_emu.h). On a GPU, __half comes from
// <cuda_fp16.h> (nvcc) or from two PTX instructions (NVRTC, see common.cuh).
//
// IEEE binary16: 1 sign bit, 5 exponent bits (bias 15), 10 mantissa bits; largest finite
// 65504, smallest normal 2^-14, smallest subnormal 2^-24. Conversions round to nearest, ties
// to even, like cvt.rn.f16.f32; tests/test_cuda_cpu.py checks every one of the 65536 halves
// and a million floats against NumPy's float16.
#pragma once

#include <cstdint>
#include <cstring>

struct __half {
  uint16_t __x;
};

inline float __half2float(__half h) {
  const uint32_t sign = (uint32_t)(h.__x & 0x8000u) << 16;
  uint32_t exp = (h.__x >> 10) & 0x1fu;
  uint32_t mant = h.__x & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {  // inf or NaN: keep the payload
    bits = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {  // normal: re-bias the exponent 15 -> 127
    bits = sign | ((exp + 112u) << 23) | (mant << 13);
  } else if (mant == 0) {  // signed zero
    bits = sign;
  } else {  // subnormal half: normalise it, every one is a normal float
    exp = 113;
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      exp--;
    }
    bits = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline __half __float2half(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  const uint16_t sign = (uint16_t)((bits >> 16) & 0x8000u);
  const uint32_t absb = bits & 0x7fffffffu;
  __half h;
  if (absb >= 0x7f800000u) {  // inf, or NaN (kept quiet and non-zero)
    h.__x = sign | (absb > 0x7f800000u ? (uint16_t)(0x7e00u | ((absb >> 13) & 0x3ffu))
                                       : (uint16_t)0x7c00u);
    return h;
  }
  if (absb >= 0x477ff000u) {  // rounds to >= 65520: overflows to inf
    h.__x = sign | 0x7c00u;
    return h;
  }
  if (absb < 0x38800000u) {  // below the smallest normal half (2^-14): subnormal or zero
    if (absb < 0x33000000u) {  // below half of the smallest subnormal (2^-25): rounds to 0
      h.__x = sign;
      return h;
    }
    const uint32_t e = absb >> 23;
    const uint32_t m = (absb & 0x7fffffu) | 0x800000u;  // with the implicit 1
    const uint32_t shift = 126u - e;                      // 14..24 bits to drop
    uint32_t r = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u);
    const uint32_t halfway = 1u << (shift - 1u);
    if (rem > halfway || (rem == halfway && (r & 1u))) r++;
    h.__x = sign | (uint16_t)r;
    return h;
  }
  // normal: drop 13 mantissa bits with round-to-nearest-even; a carry may bump the exponent
  uint32_t r = absb - 0x38000000u;  // re-bias 127 -> 15 (in place, exponent field)
  const uint32_t rem = r & 0x1fffu;
  r >>= 13;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) r++;
  h.__x = sign | (uint16_t)r;
  return h;
}
