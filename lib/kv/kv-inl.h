// The per-target part of every K/V element type (kv/elem.h): LoadWide<O> for each, compiled once
// per SIMD target. Include after a provider header (simd/hwy_ops-inl.h or simd/xsimd_ops-inl.h).
#if defined(CPUATTN_KV_KV_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef CPUATTN_KV_KV_INL_H_
#undef CPUATTN_KV_KV_INL_H_
#else
#define CPUATTN_KV_KV_INL_H_
#endif

#if CPUATTN_SIMD_BITS > 0
#include <immintrin.h>
#endif

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kv/elem.h"
#include "simd/target_namespace.h"

CPUATTN_NAMESPACE_BEGIN

// kLanes elements through memory, with the scalar conversion (the definition): the portable
// targets, and conversions a width lacks.
template <class O, class T>
CPUATTN_ALWAYS_INLINE typename O::V WidenViaMemory(const T* p) {
  alignas(64) float tmp[O::kLanes];
  for (int i = 0; i < O::kLanes; ++i) tmp[i] = detail::ElemTraits<T>::ToFloat(p[i]);
  return O::Load(tmp);
}

CPUATTN_NAMESPACE_END

// Each type file's per-target part, once for this target.
#define CPUATTN_KV_TARGET_PART
#include "kv/bf16.h"
#include "kv/f16.h"
#include "kv/f32.h"
#include "kv/fp8_e4m3.h"
#include "kv/int8.h"
#undef CPUATTN_KV_TARGET_PART

CPUATTN_NAMESPACE_BEGIN

// C vectors of consecutive elements. Fp8E4M3Lo widens two vectors at a time for less than
// twice one (its LoadWidePair); the other types one vector after the other.
template <class O, int C, class T>
CPUATTN_ALWAYS_INLINE void LoadWideN(const T* p, typename O::V (&v)[C]) {
  int j = 0;
  if constexpr (std::is_same_v<T, detail::Fp8E4M3Lo>) {
    CPUATTN_UNROLL(16)
    for (; j + 1 < C; j += 2) LoadWidePair<O>(p + j * O::kLanes, v[j], v[j + 1]);
  }
  CPUATTN_UNROLL(32)
  for (; j < C; ++j) v[j] = LoadWide<O>(p + j * O::kLanes);
}

CPUATTN_NAMESPACE_END

#endif  // CPUATTN_KV_KV_INL_H_
