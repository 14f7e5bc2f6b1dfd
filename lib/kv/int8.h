// K/V element type int8: symmetric int8 with an f32 scale per row (KvCache and PagedKvCache
// quantize each token of each K/V head with quantize_int8: scale = max|x| / 127), or per head or
// tensor as the caller passes them. The value computed with is float(q) * scale, rounded to f32
// (see kv/elem.h for the two parts of a type file).
#ifndef CPUATTN_KV_INT8_H_
#define CPUATTN_KV_INT8_H_

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace cpuattn::detail {

template <>
struct ElemOf<DType::i8> {
  using type = std::int8_t;
};
template <>
struct ElemTraits<std::int8_t> {
  static constexpr DType kDType = DType::i8;
  static constexpr bool kScaled = true;
  static constexpr NativeDot kNative = NativeDot::int16_pairs;
  static CPUATTN_ALWAYS_INLINE float ToFloat(std::int8_t x) { return static_cast<float>(x); }
  // Quantization (quantize_row, kv/elem.h): the largest magnitude stored, and y = x / scale
  // rounded to nearest even and clamped to it (y finite).
  static constexpr float kMaxStored = 127.0f;
  static CPUATTN_ALWAYS_INLINE std::int8_t Quantize(float y) {
    return static_cast<std::int8_t>(std::clamp(std::nearbyint(y), -kMaxStored, kMaxStored));
  }
};

}  // namespace cpuattn::detail

#endif  // CPUATTN_KV_INT8_H_

#ifdef CPUATTN_KV_TARGET_PART
CPUATTN_NAMESPACE_BEGIN

// Sign-extended to int32, then converted (exact).
template <class O>
CPUATTN_ALWAYS_INLINE typename O::V LoadWide(const std::int8_t* p) {
#if CPUATTN_SIMD_BITS == 512
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return O::FromRaw(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)));
#elif CPUATTN_SIMD_BITS == 256
  const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  return O::FromRaw(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)));
#elif CPUATTN_SIMD_BITS == 128
  std::int32_t four;
  std::memcpy(&four, p, 4);
  return O::FromRaw(_mm_cvtepi32_ps(_mm_cvtepi8_epi32(_mm_cvtsi32_si128(four))));
#else
  return WidenViaMemory<O>(p);
#endif
}

CPUATTN_NAMESPACE_END
#endif  // CPUATTN_KV_TARGET_PART
