// Widening loads: kLanes elements of a storage type (f32, bf16, f16, int8) as one f32 vector, for
// the packers and the streaming decode path (the only places a kernel reads K, V or Q). Exact:
// every bf16, f16 and int8 value is a float32. One instruction sequence per x86 width; the portable
// targets (and f16 on SSE4, which has no F16C) convert through memory with core/dtypes.h, whose
// scalar conversions are the definition the SIMD ones are tested against.
#if defined(CPUATTN_SIMD_WIDEN_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef CPUATTN_SIMD_WIDEN_INL_H_
#undef CPUATTN_SIMD_WIDEN_INL_H_
#else
#define CPUATTN_SIMD_WIDEN_INL_H_
#endif

#if CPUATTN_SIMD_BITS > 0
#include <immintrin.h>
#endif

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "core/dtypes.h"
#include "simd/target_namespace.h"

CPUATTN_NAMESPACE_BEGIN

// Through memory: the portable targets, and conversions a width lacks.
template <class O, class T>
CPUATTN_INLINE typename O::V WidenViaMemory(const T* p) {
  alignas(64) float tmp[O::kLanes];
  for (int i = 0; i < O::kLanes; ++i) {
    if constexpr (std::is_same_v<T, detail::Bf16>) {
      tmp[i] = detail::bf16_to_f32(p[i].bits);
    } else if constexpr (std::is_same_v<T, detail::F16>) {
      tmp[i] = detail::f16_to_f32(p[i].bits);
    } else {
      tmp[i] = static_cast<float>(p[i]);
    }
  }
  return O::Load(tmp);
}

template <class O>
CPUATTN_INLINE typename O::V LoadWide(const float* p) {
  return O::LoadU(p);
}

template <class O>
CPUATTN_INLINE typename O::V LoadWide(const detail::Bf16* p) {
#if CPUATTN_SIMD_BITS == 512
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return O::FromRaw(_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)));
#elif CPUATTN_SIMD_BITS == 256
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return O::FromRaw(_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)));
#elif CPUATTN_SIMD_BITS == 128
  const __m128i h = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  return O::FromRaw(_mm_castsi128_ps(_mm_slli_epi32(_mm_cvtepu16_epi32(h), 16)));
#else
  return WidenViaMemory<O>(p);
#endif
}

template <class O>
CPUATTN_INLINE typename O::V LoadWide(const detail::F16* p) {
#if CPUATTN_SIMD_BITS == 512
  return O::FromRaw(_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))));
#elif CPUATTN_SIMD_BITS == 256
  return O::FromRaw(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
#else
  return WidenViaMemory<O>(p);
#endif
}

template <class O>
CPUATTN_INLINE typename O::V LoadWide(const std::int8_t* p) {
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

// The first n < kLanes elements, the other lanes 0 (no element past p + n is read).
template <class O, class T>
CPUATTN_INLINE typename O::V LoadWidePartial(const T* p, std::int64_t n) {
  alignas(64) T tmp[O::kLanes] = {};
  std::memcpy(tmp, p, static_cast<std::size_t>(n) * sizeof(T));
  return LoadWide<O>(tmp);
}

// Stores the kLanes floats of v as bf16 or f16 at p (round to nearest even, NaN stays NaN):
// the same bits as core/dtypes.h's f32_to_bf16 / f32_to_f16, for the kernels' reduced-precision
// outputs (one scalar conversion per element cost S1 with f16 out 35%).
template <class O>
CPUATTN_INLINE void StoreNarrow(typename O::V v, detail::Bf16* p) {
#if CPUATTN_SIMD_BITS == 512
  const __m512i u = _mm512_castps_si512(O::ToRaw(v));
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r =
      _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(O::ToRaw(v), O::ToRaw(v), _CMP_UNORD_Q);
  r = _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(r));
#else
  alignas(64) float tmp[O::kLanes];
  O::Store(v, tmp);
  for (int i = 0; i < O::kLanes; ++i) p[i].bits = detail::f32_to_bf16(tmp[i]);
#endif
}

template <class O>
CPUATTN_INLINE void StoreNarrow(typename O::V v, detail::F16* p) {
#if CPUATTN_SIMD_BITS == 512
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                      _mm512_cvtps_ph(O::ToRaw(v), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#elif CPUATTN_SIMD_BITS == 256
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                   _mm256_cvtps_ph(O::ToRaw(v), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#else
  alignas(64) float tmp[O::kLanes];
  O::Store(v, tmp);
  for (int i = 0; i < O::kLanes; ++i) p[i].bits = detail::f32_to_f16(tmp[i]);
#endif
}

CPUATTN_NAMESPACE_END

#endif  // CPUATTN_SIMD_WIDEN_INL_H_
