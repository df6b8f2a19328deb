#pragma once
// Storage types for IEEE fp16 (`ember::half`) and bfloat16 (`ember::bfloat16`). Both hold 16 raw
// bits and convert to and from float in software with round-to-nearest-even, so they work in any
// C++20 compiler; CUDA kernels reinterpret the same bits as __half / __nv_bfloat16.
#include <bit>
#include <cstdint>
#include <ostream>

#include "ember/core/macros.hpp"

namespace ember {

namespace detail {
EMBER_HD inline uint32_t float_bits(float f) { return std::bit_cast<uint32_t>(f); }
EMBER_HD inline float bits_float(uint32_t u) { return std::bit_cast<float>(u); }

EMBER_HD inline uint16_t float_to_half_bits(float f) {
  uint32_t x = float_bits(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or nan
    return static_cast<uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
  }
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (abs < 0x38800000u) {  // subnormal half (or zero): value = m * 2^-24
    // Adding 0.5f aligns the mantissa so that float rounding does round-to-nearest-even for us.
    float a = bits_float(abs) + 0.5f;
    return static_cast<uint16_t>(sign | (float_bits(a) - 0x3f000000u));
  }
  uint32_t mant_odd = (abs >> 13) & 1u;
  abs += 0xc8000fffu + mant_odd;  // rebias exponent (-112 << 23) and round to nearest even
  return static_cast<uint16_t>(sign | (abs >> 13));
}

EMBER_HD inline float half_bits_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return bits_float(sign | 0x7f800000u | (mant << 13));
  if (exp == 0) {
    float v = static_cast<float>(mant) * 5.9604644775390625e-8f;  // 2^-24
    return sign ? -v : v;
  }
  return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

EMBER_HD inline uint16_t float_to_bf16_bits(float f) {
  uint32_t x = float_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet nan
  x += 0x7fffu + ((x >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>(x >> 16);
}
EMBER_HD inline float bf16_bits_to_float(uint16_t b) { return bits_float(static_cast<uint32_t>(b) << 16); }

// What half and bfloat16 share: 16 raw bits, converted from and to float by the format's ToBits
// and ToFloat (Self: the type itself, which from_bits returns).
template <class Self, uint16_t (*ToBits)(float), float (*ToFloat)(uint16_t)>
struct Float16Storage {
  uint16_t bits = 0;
  Float16Storage() = default;
  EMBER_HD Float16Storage(float f) : bits(ToBits(f)) {}
  EMBER_HD explicit Float16Storage(double d) : Float16Storage(static_cast<float>(d)) {}
  EMBER_HD explicit Float16Storage(int i) : Float16Storage(static_cast<float>(i)) {}
  EMBER_HD operator float() const { return ToFloat(bits); }
  EMBER_HD static Self from_bits(uint16_t b) {
    Self h;
    h.bits = b;
    return h;
  }
};
}  // namespace detail

struct half : detail::Float16Storage<half, detail::float_to_half_bits, detail::half_bits_to_float> {
  using Float16Storage::Float16Storage;
};

struct bfloat16 : detail::Float16Storage<bfloat16, detail::float_to_bf16_bits, detail::bf16_bits_to_float> {
  using Float16Storage::Float16Storage;
};

inline std::ostream& operator<<(std::ostream& os, half h) { return os << static_cast<float>(h); }
inline std::ostream& operator<<(std::ostream& os, bfloat16 h) { return os << static_cast<float>(h); }

}  // namespace ember
