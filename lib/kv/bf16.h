// K/V (and Q, out) element type bf16: bfloat16 stored as its 16-bit pattern, the top half of an
// f32 (see kv/elem.h for the two parts of a type file).
#ifndef CPUATTN_KV_BF16_H_
#define CPUATTN_KV_BF16_H_

#include <cmath>
#include <cstdint>

namespace cpuattn::detail {

struct Bf16 {
  std::uint16_t bits;
};

// bf16 -> f32 is exact.
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

template <>
struct ElemOf<DType::bf16> {
  using type = Bf16;
};
template <>
struct ElemTraits<Bf16> {
  static constexpr DType kDType = DType::bf16;
  static constexpr bool kScaled = false;
  static constexpr NativeDot kNative = NativeDot::bf16_pairs;
  static CPUATTN_ALWAYS_INLINE float ToFloat(Bf16 x) { return bf16_to_f32(x.bits); }
};

}  // namespace cpuattn::detail

#endif  // CPUATTN_KV_BF16_H_

#ifdef CPUATTN_KV_TARGET_PART
CPUATTN_NAMESPACE_BEGIN

// The 16 bits shifted into the top of each f32 lane.
template <class O>
CPUATTN_ALWAYS_INLINE typename O::V LoadWide(const detail::Bf16* p) {
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

#if CPUATTN_SIMD_BITS == 256 || CPUATTN_SIMD_BITS == 512
// Of the 2 x kLanes elements at p, the even ones (LoadWideEven: lane i is p[2 i]) or the odd ones
// (LoadWideOdd: p[2 i + 1]). A pair is one 32-bit lane: its low half, the even element, shifted
// up; its high half, the odd element's f32 bits in place, with the low half cleared by a mask.
// One bit operation per vector where LoadWide spends a widening shuffle and a shift. A kernel
// that wants both calls the two in turn: the second load hits L1, and no register holds the pair
// in between.
template <class O>
CPUATTN_ALWAYS_INLINE typename O::V LoadWideEven(const detail::Bf16* p) {
#if CPUATTN_SIMD_BITS == 512
  return O::FromRaw(_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_loadu_si512(p), 16)));
#else
  const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return O::FromRaw(_mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
#endif
}

template <class O>
CPUATTN_ALWAYS_INLINE typename O::V LoadWideOdd(const detail::Bf16* p) {
#if CPUATTN_SIMD_BITS == 512
  const __m512i high = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  return O::FromRaw(_mm512_castsi512_ps(_mm512_and_si512(_mm512_loadu_si512(p), high)));
#else
  // On AVX2 the mask is vpand's memory operand: in a register it would be the 17th that a 3 x 4
  // tile (12 accumulators, 3 broadcasts, the widened vector) needs, and GCC then keeps an
  // accumulator on the stack. The asm keeps the compiler from hoisting the mask into a register.
  // Two shifts instead would run on the two pipes that the broadcasts and half the FMAs share
  // (Zen 3), where vpand runs on any of the four.
  alignas(32) static constexpr std::uint32_t kHigh[8] = {0xffff0000u, 0xffff0000u, 0xffff0000u,
                                                         0xffff0000u, 0xffff0000u, 0xffff0000u,
                                                         0xffff0000u, 0xffff0000u};
  __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  asm("vpand %1, %0, %0" : "+x"(w) : "m"(*reinterpret_cast<const __m256i*>(kHigh)));
  return O::FromRaw(_mm256_castsi256_ps(w));
#endif
}
#endif

CPUATTN_NAMESPACE_END
#endif  // CPUATTN_KV_TARGET_PART
