// 16-bit float encodings of gradients on the wire (cluster.compression).
//
//   bf16: the top 16 bits of an IEEE float32 (8-bit exponent, 7-bit
//         mantissa), rounded to nearest, ties to even. Same range as float32,
//         about 3 significant digits. NaN stays NaN.
//   fp16: IEEE 754 binary16 (5-bit exponent, 10-bit mantissa), rounded to
//         nearest, ties to even; magnitudes above 65504 become infinity,
//         below 2^-24 zero (subnormals kept). NaN stays NaN.
// Decoding is exact (every 16-bit value is a float32). Pure functions,
// portable C++ (no F16C instructions needed).
#pragma once

#include <cstdint>
#include <cstring>

namespace shardwild {

inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

inline float BitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

inline uint16_t FloatToBf16(float f) {
  const uint32_t u = FloatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN, kept quiet
  const uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding) >> 16);
}

inline float Bf16ToFloat(uint16_t h) { return BitsFloat(static_cast<uint32_t>(h) << 16); }

inline uint16_t FloatToFp16(float f) {
  const uint32_t u = FloatBits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;  // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // rounds to >= 65520: infinity (and infinity itself)
  if (abs < 0x33000001u) return sign;             // below half the smallest subnormal (2^-25): zero
  const int exp = static_cast<int>(abs >> 23) - 127;
  uint32_t mant = (abs & 0x7fffffu) | 0x800000u;  // 24 bits with the implicit one
  if (exp >= -14) {
    // Normal: keep 11 bits (implicit one + 10), round the 13 dropped bits.
    const uint32_t dropped = mant & 0x1fffu;
    uint32_t kept = mant >> 13;
    if (dropped > 0x1000u || (dropped == 0x1000u && (kept & 1u))) ++kept;
    // kept may carry into 0x800 (2^11): that bumps the exponent, which the
    // addition below does by itself.
    return static_cast<uint16_t>(sign | ((static_cast<uint32_t>(exp + 15) << 10) + (kept - 0x400u)));
  }
  // Subnormal: value = mant * 2^(exp - 23) = m * 2^-24, m = mant >> (-exp - 1).
  const int shift = -exp - 1;  // 14..24
  const uint32_t kept = mant >> shift;
  const uint32_t dropped = mant & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  uint32_t m = kept;
  if (dropped > half || (dropped == half && (kept & 1u))) ++m;  // may become the smallest normal: still right
  return static_cast<uint16_t>(sign | m);
}

inline float Fp16ToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return BitsFloat(sign | 0x7f800000u | (mant << 13));  // inf / NaN
  if (exp != 0) return BitsFloat(sign | ((exp + 112) << 23) | (mant << 13));
  if (mant == 0) return BitsFloat(sign);
  // Subnormal: mant * 2^-24, exactly representable.
  const float v = static_cast<float>(mant) * BitsFloat(0x33800000u);  // 2^-24
  return sign ? -v : v;
}

}  // namespace shardwild
