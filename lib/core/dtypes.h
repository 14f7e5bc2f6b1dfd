// Scalar conversions between float32 and the reduced-precision storage types (bfloat16, IEEE
// binary16, symmetric int8), and the element tags the kernels are templated on. These are the
// definitions: every SIMD conversion in lib/simd/widen-inl.h must give the same bits, and the
// tests compare them lane by lane.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/inline.h"
#include "cpuattn/cpuattn.h"

namespace cpuattn::detail {

// Element tags. bf16 and f16 are stored as their 16-bit patterns.
struct Bf16 {
  std::uint16_t bits;
};
struct F16 {
  std::uint16_t bits;
};

CPUATTN_ALWAYS_INLINE float bits_to_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
CPUATTN_ALWAYS_INLINE std::uint32_t float_to_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// bf16 -> f32 is exact: the bf16 bits are the top half of the f32.
CPUATTN_ALWAYS_INLINE float bf16_to_f32(std::uint16_t h) {
  return bits_to_float(static_cast<std::uint32_t>(h) << 16);
}

// f32 -> bf16, round to nearest even; NaN stays a (quiet) NaN, overflow rounds to +-inf as IEEE
// rounding does (the largest finite bf16 is 0x7f7f = 3.3895e38).
CPUATTN_ALWAYS_INLINE std::uint16_t f32_to_bf16(float f) {
  const std::uint32_t u = float_to_bits(f);
  if (std::isnan(f)) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);
  const std::uint32_t rounded = u + 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(rounded >> 16);
}

// f16 -> f32 is exact (binary16 subnormals become normal f32).
CPUATTN_ALWAYS_INLINE float f16_to_f32(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  const std::uint32_t man = h & 0x3ffu;
  if (exp == 0x1f) return bits_to_float(sign | 0x7f800000u | (man << 13));  // inf / NaN
  if (exp != 0) return bits_to_float(sign | ((exp + 112) << 23) | (man << 13));
  // zero or subnormal: man * 2^-24, exact in f32
  const float mag = static_cast<float>(man) * 5.9604644775390625e-08f;
  return sign ? -mag : mag;
}

// f32 -> f16, round to nearest even, overflow to +-inf, gradual underflow; as vcvtps2ph with
// rounding mode 0 (_MM_FROUND_TO_NEAREST_INT).
CPUATTN_ALWAYS_INLINE std::uint16_t f32_to_f16(float f) {
  const std::uint32_t u = float_to_bits(f);
  const auto sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
  if (a >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // >= 65520: inf
  if (a < 0x38800000u) {
    // Below the smallest normal f16 (2^-14): round a * 2^24 to an integer, ties to even.
    const float scaled = bits_to_float(a) * 16777216.0f;  // exact (power of two)
    return static_cast<std::uint16_t>(sign | static_cast<std::uint16_t>(std::nearbyint(scaled)));
  }
  // Normal: rebias the exponent, round the 13 dropped mantissa bits to nearest even (a carry into
  // the exponent is the correct result).
  const std::uint32_t r = a - 0x38000000u;  // exponent 127 -> 15
  const std::uint32_t rounded = r + 0xfffu + ((r >> 13) & 1u);
  return static_cast<std::uint16_t>(sign | (rounded >> 13));
}

// Symmetric int8 quantization of one row (one token of one K/V head): scale = max|x| / 127,
// q = round-to-nearest-even(x / scale) in [-127, 127]; a row of zeros gets scale 0. The value a
// kernel computes with is float(q) * scale, rounded to f32 (dequantize()).
CPUATTN_ALWAYS_INLINE float dequantize(std::int8_t q, float scale) {
  return static_cast<float>(q) * scale;
}

CPUATTN_ALWAYS_INLINE float to_float(float x) { return x; }
CPUATTN_ALWAYS_INLINE float to_float(Bf16 x) { return bf16_to_f32(x.bits); }
CPUATTN_ALWAYS_INLINE float to_float(F16 x) { return f16_to_f32(x.bits); }
CPUATTN_ALWAYS_INLINE float to_float(std::int8_t x) { return static_cast<float>(x); }

// Calls f(T{}) with the element tag of a float storage dtype: f32, bf16, f16 or i8.
template <class F>
CPUATTN_ALWAYS_INLINE decltype(auto) with_elem(DType t, F&& f) {
  switch (t) {
    case DType::bf16:
      return f(Bf16{});
    case DType::f16:
      return f(F16{});
    case DType::i8:
      return f(std::int8_t{});
    default:
      return f(float{});
  }
}

// One element of a tensor of dtype `t` at `base[offset]`, as float (int8 needs its scale).
CPUATTN_ALWAYS_INLINE float load_as_float(const void* base, DType t, std::int64_t offset) {
  switch (t) {
    case DType::bf16:
      return bf16_to_f32(static_cast<const std::uint16_t*>(base)[offset]);
    case DType::f16:
      return f16_to_f32(static_cast<const std::uint16_t*>(base)[offset]);
    case DType::i8:
      return static_cast<float>(static_cast<const std::int8_t*>(base)[offset]);
    case DType::f64:
      return static_cast<float>(static_cast<const double*>(base)[offset]);
    default:
      return static_cast<const float*>(base)[offset];
  }
}

// Stores `value` (rounded to nearest even) into a float output of dtype f32, bf16, f16 or f64.
CPUATTN_ALWAYS_INLINE void store_float(void* base, DType t, std::int64_t offset, float value) {
  switch (t) {
    case DType::bf16:
      static_cast<std::uint16_t*>(base)[offset] = f32_to_bf16(value);
      break;
    case DType::f16:
      static_cast<std::uint16_t*>(base)[offset] = f32_to_f16(value);
      break;
    case DType::f64:
      static_cast<double*>(base)[offset] = value;
      break;
    default:
      static_cast<float*>(base)[offset] = value;
      break;
  }
}

}  // namespace cpuattn::detail
