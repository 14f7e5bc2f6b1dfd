// K/V element type fp8_e4m3: OCP FP8 E4M3, PyTorch's float8_e4m3fn and vLLM's / SGLang's
// "fp8_e4m3" KV cache. 1 sign, 4 exponent (bias 7) and 3 mantissa bits; no infinities; NaN is
// 0x7f / 0xff; the largest finite value is 448, the smallest normal 2^-6, subnormals are
// multiples of 2^-9. A scaled type: the value computed with is float(x) * scale, rounded to f32,
// the scale per token (the caches' default, max|x| / 448), per K/V head or per tensor (vLLM's
// k_scale / v_scale). See kv/elem.h for the two parts of a type file.
//
// Error of storing x with scale s: x / s is rounded to nearest even and saturated to +-448, so
// within 448 s the stored value is within 2^-4 |x| (half a unit of the 3-bit mantissa) where
// |x| >= 2^-6 s, and within 2^-10 s below (half a subnormal step); beyond 448 s it is 448 s.
#ifndef CPUATTN_KV_FP8_E4M3_H_
#define CPUATTN_KV_FP8_E4M3_H_

#include <cmath>
#include <cstdint>
#include <cstring>

namespace cpuattn::detail {

struct Fp8E4M3 {
  std::uint8_t bits;
};

// fp8_e4m3 -> f32 is exact.
CPUATTN_ALWAYS_INLINE float fp8_e4m3_to_f32(std::uint8_t b) {
  const std::uint32_t sign = static_cast<std::uint32_t>(b & 0x80u) << 24;
  const std::uint32_t mag = b & 0x7fu;
  if (mag == 0x7fu) return bits_to_float(sign | 0x7fc00000u);  // NaN
  const std::uint32_t exp = mag >> 3, man = mag & 7u;
  if (exp == 0) {  // zero or subnormal: man * 2^-9
    const float v = static_cast<float>(man) * 0x1p-9f;
    return sign != 0 ? -v : v;
  }
  return bits_to_float(sign | ((exp + 120u) << 23) | (man << 20));  // exponent 7 -> 127
}

// f32 -> fp8_e4m3, round to nearest even, saturated to +-448 (infinities too); NaN -> NaN.
CPUATTN_ALWAYS_INLINE std::uint8_t f32_to_fp8_e4m3(float f) {
  const std::uint32_t u = float_to_bits(f);
  const auto sign = static_cast<std::uint8_t>((u >> 24) & 0x80u);
  const std::uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7fu;   // NaN
  if (a >= 0x43e00000u) return sign | 0x7eu;  // >= 448: saturate
  if (a < 0x3c800000u) {
    // Below 2^-6: the nearest multiple of 2^-9, ties to even (8 * 2^-9 is 2^-6, encoded as 8).
    const float steps = bits_to_float(a) * 512.0f;  // exact (power of two)
    return sign | static_cast<std::uint8_t>(std::nearbyint(steps));
  }
  // Normal: rebias the exponent, round the 20 dropped mantissa bits to nearest even (a carry into
  // the exponent is the correct result; below 448 it cannot reach the NaN pattern).
  const std::uint32_t r = a - 0x3c000000u;  // exponent 127 -> 7
  const std::uint32_t rounded = r + 0x7ffffu + ((r >> 20) & 1u);
  return sign | static_cast<std::uint8_t>(rounded >> 20);
}

// The same bytes read at 2^-120 of their value (fp8_e4m3_to_f32(b) * 2^-120, exact: normal
// bytes become f32 normals, subnormal bytes f32 subnormals), which saves LoadWide its multiply
// and NaN fix: the decode units read K this way when Q was multiplied by 2^120 and V this way
// when P was, each only where the bytes hold no NaN code (kernels/flash/fp8_lo-inl.h).
struct Fp8E4M3Lo {
  std::uint8_t bits;
};
inline constexpr float kFp8LoFactor = 0x1p120f;

// Whether any of the n bytes at p is a NaN code. Eight bytes at a time: with the sign bits
// cleared, adding 1 to a byte sets its top bit only for 0x7f, and no byte carries into the next.
inline bool fp8_e4m3_any_nan(const std::uint8_t* p, std::int64_t n) {
  constexpr std::uint64_t kLow7 = 0x7f7f7f7f7f7f7f7full, kOnes = 0x0101010101010101ull;
  std::uint64_t hit = 0;
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    std::uint64_t w;
    std::memcpy(&w, p + i, 8);
    hit |= (w & kLow7) + kOnes;
  }
  for (; i < n; ++i) hit |= static_cast<std::uint64_t>((p[i] & 0x7fu) + 1u);
  return (hit & 0x8080808080808080ull) != 0;
}

template <>
struct ElemTraits<Fp8E4M3Lo> {
  static constexpr DType kDType = DType::fp8_e4m3;
  static constexpr bool kScaled = true;
  static constexpr NativeDot kNative = NativeDot::none;
  static CPUATTN_ALWAYS_INLINE float ToFloat(Fp8E4M3Lo x) {
    return fp8_e4m3_to_f32(x.bits) * (1.0f / kFp8LoFactor);
  }
};

template <>
struct ElemOf<DType::fp8_e4m3> {
  using type = Fp8E4M3;
};
template <>
struct ElemTraits<Fp8E4M3> {
  static constexpr DType kDType = DType::fp8_e4m3;
  static constexpr bool kScaled = true;
  static constexpr NativeDot kNative = NativeDot::none;
  static CPUATTN_ALWAYS_INLINE float ToFloat(Fp8E4M3 x) { return fp8_e4m3_to_f32(x.bits); }
  static constexpr float kMaxStored = 448.0f;
  static CPUATTN_ALWAYS_INLINE Fp8E4M3 Quantize(float y) { return {f32_to_fp8_e4m3(y)}; }
};

}  // namespace cpuattn::detail

#endif  // CPUATTN_KV_FP8_E4M3_H_

#ifdef CPUATTN_KV_TARGET_PART
CPUATTN_NAMESPACE_BEGIN

// Fp8E4M3Lo: the byte sign-extended to 32 bits and shifted left by 20 is sign | exponent |
// mantissa of the f32 whose bits they are, 2^-120 times the value (subnormal bytes give f32
// subnormals). A NaN code reads as +-480 * 2^-120 (NaN through WidenViaMemory); the callers find
// NaN codes themselves.
template <class O>
CPUATTN_ALWAYS_INLINE typename O::V LoadWide(const detail::Fp8E4M3Lo* p) {
#if CPUATTN_SIMD_BITS == 512
  const __m512i v = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return O::FromRaw(_mm512_castsi512_ps(_mm512_and_si512(
      _mm512_slli_epi32(v, 20), _mm512_set1_epi32(static_cast<int>(0x87f00000u)))));
#elif CPUATTN_SIMD_BITS == 256
  const __m256i v = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  return O::FromRaw(_mm256_castsi256_ps(_mm256_and_si256(
      _mm256_slli_epi32(v, 20), _mm256_set1_epi32(static_cast<int>(0x87f00000u)))));
#elif CPUATTN_SIMD_BITS == 128
  std::int32_t four;
  std::memcpy(&four, p, 4);
  const __m128i v = _mm_cvtepi8_epi32(_mm_cvtsi32_si128(four));
  return O::FromRaw(_mm_castsi128_ps(
      _mm_and_si128(_mm_slli_epi32(v, 20), _mm_set1_epi32(static_cast<int>(0x87f00000u)))));
#else
  return WidenViaMemory<O>(p);
#endif
}

// Fp8E4M3: the Lo reading times 2^120 (exact, subnormals too), and the NaN codes (Lo magnitude
// bits 0x07f00000, so the bits shifted left by one are 0x0fe00000) all ones, an f32 NaN. Seven
// operations per vector; a conversion through binary16 (vcvtph2ps) was slower on AVX2
// (docs/performance.md#dm-fp8-widening).
template <class O>
CPUATTN_ALWAYS_INLINE typename O::V LoadWide(const detail::Fp8E4M3* p) {
#if CPUATTN_SIMD_BITS == 512
  const __m512 lo = O::ToRaw(LoadWide<O>(reinterpret_cast<const detail::Fp8E4M3Lo*>(p)));
  const __mmask16 nan = _mm512_cmpeq_epi32_mask(_mm512_slli_epi32(_mm512_castps_si512(lo), 1),
                                                _mm512_set1_epi32(0x0fe00000));
  return O::FromRaw(_mm512_mask_blend_ps(nan, _mm512_mul_ps(lo, _mm512_set1_ps(0x1p120f)),
                                         _mm512_castsi512_ps(_mm512_set1_epi32(-1))));
#elif CPUATTN_SIMD_BITS == 256
  const __m256 lo = O::ToRaw(LoadWide<O>(reinterpret_cast<const detail::Fp8E4M3Lo*>(p)));
  const __m256i nan = _mm256_cmpeq_epi32(_mm256_slli_epi32(_mm256_castps_si256(lo), 1),
                                         _mm256_set1_epi32(0x0fe00000));
  return O::FromRaw(
      _mm256_or_ps(_mm256_mul_ps(lo, _mm256_set1_ps(0x1p120f)), _mm256_castsi256_ps(nan)));
#elif CPUATTN_SIMD_BITS == 128
  const __m128 lo = O::ToRaw(LoadWide<O>(reinterpret_cast<const detail::Fp8E4M3Lo*>(p)));
  const __m128i nan =
      _mm_cmpeq_epi32(_mm_slli_epi32(_mm_castps_si128(lo), 1), _mm_set1_epi32(0x0fe00000));
  return O::FromRaw(_mm_or_ps(_mm_mul_ps(lo, _mm_set1_ps(0x1p120f)), _mm_castsi128_ps(nan)));
#else
  return WidenViaMemory<O>(p);
#endif
}

// Fp8E4M3Lo, two vectors (2 * kLanes bytes) at once. On AVX2 one shuffle of the 16 bytes
// (broadcast to both halves) puts each byte in the high byte of a 16-bit lane, ordered so that
// the two interleaves below give elements in order; the arithmetic shift and the mask then make
// each lane the upper half of the Lo f32, and the interleaves with zero widen them: five
// operations per 16 elements where LoadWide takes six.
template <class O>
CPUATTN_ALWAYS_INLINE void LoadWidePair(const detail::Fp8E4M3Lo* p, typename O::V& lo,
                                        typename O::V& hi) {
#if CPUATTN_SIMD_BITS == 256
  const __m256i x =
      _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  // 16-bit lanes: elements 0-3 and 8-11 in the low half, 4-7 and 12-15 in the high half.
  const __m256i order =
      _mm256_setr_epi8(-1, 0, -1, 1, -1, 2, -1, 3, -1, 8, -1, 9, -1, 10, -1, 11, -1, 4, -1, 5, -1,
                       6, -1, 7, -1, 12, -1, 13, -1, 14, -1, 15);
  const __m256i w = _mm256_and_si256(_mm256_srai_epi16(_mm256_shuffle_epi8(x, order), 4),
                                     _mm256_set1_epi16(static_cast<short>(0x87f0)));
  const __m256i zero = _mm256_setzero_si256();
  lo = O::FromRaw(_mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, w)));
  hi = O::FromRaw(_mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, w)));
#else
  lo = LoadWide<O>(p);
  hi = LoadWide<O>(p + O::kLanes);
#endif
}

// Whether `rows` runs of n bytes, stride bytes apart, hold a NaN code (0x7f or 0xff): the
// largest byte as signed (0x7f) and as unsigned (0xff), 32 bytes per step, two operations each
// where detail::fp8_e4m3_any_nan takes twelve.
template <class O>
CPUATTN_ALWAYS_INLINE bool AnyNanCode(const std::uint8_t* p, std::int64_t rows, std::int64_t stride,
                                      std::int64_t n) {
#if CPUATTN_SIMD_BITS >= 256
  __m256i ms = _mm256_set1_epi8(-128), mu = _mm256_setzero_si256();
  bool tail = false;
  const std::int64_t nv = n / 32 * 32;
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::uint8_t* row = p + r * stride;
    for (std::int64_t i = 0; i < nv; i += 32) {
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + i));
      ms = _mm256_max_epi8(ms, x);
      mu = _mm256_max_epu8(mu, x);
    }
    if (nv < n) tail = tail || detail::fp8_e4m3_any_nan(row + nv, n - nv);
  }
  const __m256i hit = _mm256_or_si256(_mm256_cmpeq_epi8(ms, _mm256_set1_epi8(0x7f)),
                                      _mm256_cmpeq_epi8(mu, _mm256_set1_epi8(-1)));
  return tail || _mm256_movemask_epi8(hit) != 0;
#else
  for (std::int64_t r = 0; r < rows; ++r)
    if (detail::fp8_e4m3_any_nan(p + r * stride, n)) return true;
  return false;
#endif
}

CPUATTN_NAMESPACE_END
#endif  // CPUATTN_KV_TARGET_PART
