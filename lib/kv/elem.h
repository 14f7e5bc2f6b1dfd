// The K/V element types: one file per type (f32.h, bf16.h, f16.h, int8.h, fp8_e4m3.h), each
// self-contained, and the dispatch over the public list (CPUATTN_DTYPES, cpuattn.h). A type file
// has two parts:
//   scalar      (any unit): the element tag, ElemOf<DType::x> naming it, ElemTraits<T> (its
//               dtype, whether it is scaled, the native dot products it feeds, ToFloat) and the
//               scalar conversions every SIMD one is tested against;
//   per target  (compiled where kv-inl.h includes the file, once per SIMD target):
//               LoadWide<O>(const T*), kLanes elements widened to one f32 vector, exactly.
// docs/architecture.md, "Add a K/V type", lists the files a new type touches.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/inline.h"
#include "cpuattn/cpuattn.h"

namespace cpuattn::detail {

// The native products of the avx512_bf16 unit an element type can feed as stored:
// bf16 pairs (vdpbf16ps) or, sign-extended to int16 pairs, vpdpwssd (int8).
enum class NativeDot : std::uint8_t { none, bf16_pairs, int16_pairs };

// Specialised by each type file: kDType, kScaled, kNative, ToFloat(T) (exact; a scaled type's
// value is ToFloat(x) * scale, rounded to f32); a scaled type also kMaxStored and Quantize(y)
// (quantize_row).
template <class T>
struct ElemTraits;
// The element tag of a K/V dtype (specialised by each type file).
template <DType>
struct ElemOf;

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

}  // namespace cpuattn::detail

#include "kv/bf16.h"
#include "kv/f16.h"
#include "kv/f32.h"
#include "kv/fp8_e4m3.h"
#include "kv/int8.h"

namespace cpuattn::detail {

template <class T>
CPUATTN_ALWAYS_INLINE float to_float(T x) {
  return ElemTraits<T>::ToFloat(x);
}

// Calls f(T{}) with the element tag of a K/V dtype (f32's for any other dtype).
template <class F>
CPUATTN_ALWAYS_INLINE decltype(auto) with_elem(DType t, F&& f) {
#define CPUATTN_ELEM_CASE_tensor(name) \
  case DType::name:                    \
    return f(typename ElemOf<DType::name>::type{});
#define CPUATTN_ELEM_CASE_scaled(name) CPUATTN_ELEM_CASE_tensor(name)
#define CPUATTN_ELEM_CASE_other(name)
#define CPUATTN_ELEM_CASE(name, bytes, long_name, short_name, role) CPUATTN_ELEM_CASE_##role(name)
  switch (t) {
    CPUATTN_DTYPES(CPUATTN_ELEM_CASE)
    default:
      return f(float{});
  }
#undef CPUATTN_ELEM_CASE
#undef CPUATTN_ELEM_CASE_other
#undef CPUATTN_ELEM_CASE_scaled
#undef CPUATTN_ELEM_CASE_tensor
}

// The native products a K/V dtype feeds as stored (NativeDot::none for other dtypes).
NativeDot native_dot(DType t);

// A row of n finite values as a scaled type T, as the caches store it, with the row's own scale
// max|x| / kMaxStored (returned; a row whose scale is 0, all zeros or below float's range, is
// stored as zeros with scale 0) ...
template <class T>
float quantize_row(const float* x, std::int64_t n, T* q) {
  float amax = 0.0f;
  for (std::int64_t i = 0; i < n; ++i) amax = std::max(amax, std::abs(x[i]));
  const float scale = amax / ElemTraits<T>::kMaxStored;
  for (std::int64_t i = 0; i < n; ++i)
    q[i] = ElemTraits<T>::Quantize(scale == 0.0f ? 0.0f : x[i] / scale);
  return scale;
}

// ... or with a given scale (> 0; the static per-head scales of a cache): x / scale saturates at
// +-kMaxStored.
template <class T>
void quantize_row(const float* x, std::int64_t n, float scale, T* q) {
  for (std::int64_t i = 0; i < n; ++i) q[i] = ElemTraits<T>::Quantize(x[i] / scale);
}

}  // namespace cpuattn::detail
