// K/V (and Q, out) element type f16: IEEE binary16 stored as its 16-bit pattern (see kv/elem.h
// for the two parts of a type file).
#ifndef CPUATTN_KV_F16_H_
#define CPUATTN_KV_F16_H_

#include <cmath>
#include <cstdint>

namespace cpuattn::detail {

struct F16 {
  std::uint16_t bits;
};

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

template <>
struct ElemOf<DType::f16> {
  using type = F16;
};
template <>
struct ElemTraits<F16> {
  static constexpr DType kDType = DType::f16;
  static constexpr bool kScaled = false;
  static constexpr NativeDot kNative = NativeDot::none;
  static CPUATTN_ALWAYS_INLINE float ToFloat(F16 x) { return f16_to_f32(x.bits); }
};

}  // namespace cpuattn::detail

#endif  // CPUATTN_KV_F16_H_

#ifdef CPUATTN_KV_TARGET_PART
CPUATTN_NAMESPACE_BEGIN

// vcvtph2ps (F16C) on AVX2 and AVX-512; SSE4 has no F16C.
template <class O>
CPUATTN_ALWAYS_INLINE typename O::V LoadWide(const detail::F16* p) {
#if CPUATTN_SIMD_BITS == 512
  return O::FromRaw(_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))));
#elif CPUATTN_SIMD_BITS == 256
  return O::FromRaw(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
#else
  return WidenViaMemory<O>(p);
#endif
}

CPUATTN_NAMESPACE_END
#endif  // CPUATTN_KV_TARGET_PART
