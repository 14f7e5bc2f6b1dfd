// Widening loads of any K/V element type as f32 vectors, for the packers and the streaming units
// (the only places a kernel reads K, V or Q): LoadWide<O> is each type's (kv/<type>.h, through
// kv/kv-inl.h), exact, and tested against the type's scalar conversion; LoadWidePartial reads
// the first n elements. StoreNarrow rounds f32 vectors to bf16 or f16 outputs.
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
#include "kv/kv-inl.h"
#include "simd/target_namespace.h"

CPUATTN_NAMESPACE_BEGIN

// Whether LoadWide<O> of T needs no register beyond its result (f32, bf16, f16, int8): fp8's
// widening keeps masks and a multiplier live across a loop. The decode tiles that fill AVX2's 16
// registers with accumulators, operands and one widened vector take that fill only for these.
template <class T>
inline constexpr bool kWidensInPlace =
    !std::is_same_v<T, detail::Fp8E4M3> && !std::is_same_v<T, detail::Fp8E4M3Lo>;

// The first n < kLanes elements, the other lanes 0 (no element past p + n is read).
template <class O, class T>
CPUATTN_ALWAYS_INLINE typename O::V LoadWidePartial(const T* p, std::int64_t n) {
  alignas(64) T tmp[O::kLanes] = {};
  std::memcpy(tmp, p, static_cast<std::size_t>(n) * sizeof(T));
  return LoadWide<O>(tmp);
}

// Stores the kLanes floats of v as bf16 or f16 at p (round to nearest even, NaN stays NaN):
// the same bits as core/dtypes.h's f32_to_bf16 / f32_to_f16, for the kernels' reduced-precision
// outputs (a scalar conversion per element was slow: docs/performance.md#dm-store-narrow).
template <class O>
CPUATTN_ALWAYS_INLINE void StoreNarrow(typename O::V v, detail::Bf16* p) {
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
CPUATTN_ALWAYS_INLINE void StoreNarrow(typename O::V v, detail::F16* p) {
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
