// x86 building blocks on raw registers (__m128 / __m256 / __m512), shared by both SIMD providers:
// operations neither Highway 1.0.3 nor xsimd 8.1 offers in the form the kernels need (register
// transposes, exp2's floor and scaling without range fix-ups), plus the few xsimd lacks (horizontal
// max, byte masks, streaming stores). Each provider converts its vector type to the raw register
// and back, so the instruction sequences exist once.
//
// Only the functions of the width being compiled are defined (CPUATTN_SIMD_BITS, see
// simd/target_namespace.h): the others would need instructions this target may not have.
#if defined(CPUATTN_SIMD_X86_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef CPUATTN_SIMD_X86_INL_H_
#undef CPUATTN_SIMD_X86_INL_H_
#else
#define CPUATTN_SIMD_X86_INL_H_
#endif

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "simd/contract.h"
#include "simd/target_namespace.h"

CPUATTN_NAMESPACE_BEGIN
namespace x86 {

CPUATTN_ALWAYS_INLINE void StreamFence() { _mm_sfence(); }

// r, held in a register from here on: an empty asm that takes the register and gives it back
// ("v": any of AVX-512's 32, so a tile's register allocation is not narrowed to the first 16).
// GCC 12 folds a vector load that feeds several FMAs into each of them as a memory operand, so a
// value read once in the source is read once per use (the Q rows of DotKeys' side-by-side keys:
// 2R + 2 loads for 2R FMAs where R + 2 were written, more than the two 256-bit loads a cycle AMD
// and Intel cores serve beside two FMA pipes: docs/performance.md#dm-q-in-register).
template <class Raw>
CPUATTN_ALWAYS_INLINE Raw InRegister(Raw r) {
  asm("" : "+v"(r));
  return r;
}

// p, made to depend on r, so that clang schedules a load from p after the instruction that wrote
// r (an empty asm: no instruction). GCC keeps the source's order of the loops that use it
// (LoadAfter, kernels/common/outer-inl.h), and given the asm added a register copy to some.
template <class Raw, class P>
CPUATTN_ALWAYS_INLINE P* After(Raw r, P* p) {
#if defined(__clang__)
  asm("" : "+r"(p) : "v"(r));
#else
  static_cast<void>(r);
#endif
  return p;
}

// The add that rounds Exp2's argument to nearest on AVX2 and SSE4 (Exp2Frac below).
inline constexpr float kExp2Round = 12583039.0f;  // 1.5 * 2^23 + 127

#if CPUATTN_SIMD_BITS == 512
// 16 x 16 floats: 32-bit and 64-bit unpacks within 128-bit blocks, then two rounds of 128-bit
// block shuffles (48 shuffles where a lane-by-lane transpose costs a store per element).
CPUATTN_ALWAYS_INLINE void Transpose(__m512* r) {
  __m512 t[16], u[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int g = 0; g < 4; ++g) {  // u[4g + k], block m: column 4m + k of rows 4g..4g+3
    const __m512d a = _mm512_castps_pd(t[4 * g]), b = _mm512_castps_pd(t[4 * g + 2]);
    const __m512d c = _mm512_castps_pd(t[4 * g + 1]), d = _mm512_castps_pd(t[4 * g + 3]);
    u[4 * g] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
    u[4 * g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
    u[4 * g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(c, d));
    u[4 * g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(c, d));
  }
  for (int k = 0; k < 4; ++k) {
    const __m512 x0 = _mm512_shuffle_f32x4(u[k], u[4 + k], 0x88);
    const __m512 x1 = _mm512_shuffle_f32x4(u[k], u[4 + k], 0xdd);
    const __m512 y0 = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0x88);
    const __m512 y1 = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0xdd);
    r[k] = _mm512_shuffle_f32x4(x0, y0, 0x88);
    r[4 + k] = _mm512_shuffle_f32x4(x1, y1, 0x88);
    r[8 + k] = _mm512_shuffle_f32x4(x0, y0, 0xdd);
    r[12 + k] = _mm512_shuffle_f32x4(x1, y1, 0xdd);
  }
}

// Exp2's argument step: n = floor(x), which vreduceps and vscalefps both take from x itself.
inline constexpr bool kExp2Centered = false;

// x - floor(x) in one vreduceps (round down, 0 fraction bits kept).
CPUATTN_ALWAYS_INLINE __m512 Exp2Frac(__m512 x) {
  return _mm512_reduce_ps(x, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
}

// p * 2^floor(x) by vscalefps; lanes with x <= -126 are zeroed by the mask (the comparison is
// true for NaN, so NaN stays NaN).
CPUATTN_ALWAYS_INLINE __m512 Exp2Scale(__m512 p, __m512 x) {
  const __mmask16 keep =
      _mm512_cmp_ps_mask(x, _mm512_set1_ps(simd::kExp2ZeroAtOrBelow), _CMP_NLE_UQ);
  return _mm512_maskz_scalef_ps(keep, p, x);
}

CPUATTN_ALWAYS_INLINE float ReduceMax(__m512 v) { return _mm512_reduce_max_ps(v); }

// The lane sums of four vectors at once, out[i] = sum of a[i]'s lanes: 12 operations for the
// four where four separate reductions cost about 32 (the decode score kernel needs one per key).
CPUATTN_ALWAYS_INLINE __m128 ReduceSum4(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
  // Interleave pairs and add: each 128-bit block holds partial sums of (a0, a1, a0, a1) ...
  const __m512 x01 = _mm512_add_ps(_mm512_unpacklo_ps(a0, a1), _mm512_unpackhi_ps(a0, a1));
  const __m512 x23 = _mm512_add_ps(_mm512_unpacklo_ps(a2, a3), _mm512_unpackhi_ps(a2, a3));
  // ... then (a0, a1, a2, a3) per block; the four blocks are summed last.
  const __m512 y = _mm512_add_ps(_mm512_shuffle_ps(x01, x23, _MM_SHUFFLE(1, 0, 1, 0)),
                                 _mm512_shuffle_ps(x01, x23, _MM_SHUFFLE(3, 2, 3, 2)));
  const __m256 z = _mm256_add_ps(_mm512_castps512_ps256(y),
                                 _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(y), 1)));
  return _mm_add_ps(_mm256_castps256_ps128(z), _mm256_extractf128_ps(z, 1));
}

CPUATTN_ALWAYS_INLINE __m512 KeepIfByteSet(__m512 s, const std::uint8_t* bytes) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes));
  const __mmask16 set = _mm_test_epi8_mask(b, b);
  return _mm512_mask_blend_ps(set, _mm512_set1_ps(-__builtin_inff()), s);
}

CPUATTN_ALWAYS_INLINE void Stream(__m512 v, float* p) { _mm512_stream_ps(p, v); }

#elif CPUATTN_SIMD_BITS == 256
CPUATTN_ALWAYS_INLINE void Transpose(__m256* r) {
  __m256 t[8], s[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int g = 0; g < 2; ++g) {
    s[4 * g] = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], _MM_SHUFFLE(1, 0, 1, 0));
    s[4 * g + 1] = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], _MM_SHUFFLE(3, 2, 3, 2));
    s[4 * g + 2] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], _MM_SHUFFLE(1, 0, 1, 0));
    s[4 * g + 3] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int k = 0; k < 4; ++k) {
    r[k] = _mm256_permute2f128_ps(s[k], s[4 + k], 0x20);
    r[4 + k] = _mm256_permute2f128_ps(s[k], s[4 + k], 0x31);
  }
}

CPUATTN_ALWAYS_INLINE float ReduceMax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}

CPUATTN_ALWAYS_INLINE __m256 KeepIfByteSet(__m256 s, const std::uint8_t* bytes) {
  const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(bytes)));
  const __m256 unset = _mm256_castsi256_ps(_mm256_cmpeq_epi32(b, _mm256_setzero_si256()));
  return _mm256_blendv_ps(s, _mm256_set1_ps(-__builtin_inff()), unset);
}

CPUATTN_ALWAYS_INLINE void Stream(__m256 v, float* p) { _mm256_stream_ps(p, v); }

// Exp2's argument step on AVX2 and SSE4: n = x rounded to nearest, by one add of kExp2Round =
// 1.5 * 2^23 + 127. The sum lies in [2^23, 2^24), where a float's ulp is 1, so the add itself
// rounds x (to nearest even) and leaves n + 127 in the low mantissa bits: shifted left by 23 they
// are the bits of 2^n for -126 <= n <= 127. That replaces roundps (two uops on Intel's FMA ports)
// and the float-to-int conversion of a floor form; 2^n is multiplied into p rather than added to
// its exponent bits, so a NaN x, whose payload lands in those bits, still gives p's NaN.
inline constexpr bool kExp2Centered = true;

// x - n in [-0.5, 0.5], exact for |x| < 2^22 (n - x is then a float); Exp2Scale's add is the
// same one, which a compiler computes once for both.
CPUATTN_ALWAYS_INLINE __m256 Exp2Frac(__m256 x) {
  const __m256 round = _mm256_set1_ps(kExp2Round);
  return _mm256_sub_ps(x, _mm256_sub_ps(_mm256_add_ps(x, round), round));
}

// p * 2^n, n as Exp2Frac's. Exact while the product is a normal float: for Exp2's p that holds
// for -126 < x <= 127 (n = -126 only where x - n > 0, so p > 1 there), and lanes with x <= -126
// are zeroed (x = -126 itself would give p(0) * 2^-126; -inf gives 0 * NaN before the zeroing).
CPUATTN_ALWAYS_INLINE __m256 Exp2Scale(__m256 p, __m256 x) {
  const __m256i t = _mm256_castps_si256(_mm256_add_ps(x, _mm256_set1_ps(kExp2Round)));
  const __m256 scaled = _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32(t, 23)));
  const __m256 below = _mm256_cmp_ps(x, _mm256_set1_ps(simd::kExp2ZeroAtOrBelow), _CMP_LE_OQ);
  return _mm256_andnot_ps(below, scaled);
}

// Lane i (of each 128-bit half) of PairSum(a0, a1): pairs of a0's lanes (i < 2), a1's (i >= 2).
// ReduceSum4 of four vectors is the lane-wise sum of PairSum(PairSum(a0, a1), PairSum(a2, a3))'s
// halves, so a caller short of registers may fold a0, a1 as soon as they are complete.
CPUATTN_ALWAYS_INLINE __m256 PairSum(__m256 a0, __m256 a1) { return _mm256_hadd_ps(a0, a1); }

// Lane g: the sum of the 8 lanes of a_g, from two PairSums.
CPUATTN_ALWAYS_INLINE __m128 ReducePairSums(__m256 p01, __m256 p23) {
  const __m256 y = _mm256_hadd_ps(p01, p23);
  return _mm_add_ps(_mm256_castps256_ps128(y), _mm256_extractf128_ps(y, 1));
}

#elif CPUATTN_SIMD_BITS == 128
CPUATTN_ALWAYS_INLINE void Transpose(__m128* r) { _MM_TRANSPOSE4_PS(r[0], r[1], r[2], r[3]); }

CPUATTN_ALWAYS_INLINE float ReduceMax(__m128 m) {
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}

CPUATTN_ALWAYS_INLINE __m128 KeepIfByteSet(__m128 s, const std::uint8_t* bytes) {
  std::int32_t four;
  std::memcpy(&four, bytes, 4);
  const __m128i b = _mm_cvtepu8_epi32(_mm_cvtsi32_si128(four));
  const __m128 unset = _mm_castsi128_ps(_mm_cmpeq_epi32(b, _mm_setzero_si128()));
  return _mm_blendv_ps(s, _mm_set1_ps(-__builtin_inff()), unset);
}

CPUATTN_ALWAYS_INLINE void Stream(__m128 v, float* p) { _mm_stream_ps(p, v); }

// Exp2's argument step as the 256-bit one above.
inline constexpr bool kExp2Centered = true;

CPUATTN_ALWAYS_INLINE __m128 Exp2Frac(__m128 x) {
  const __m128 round = _mm_set1_ps(kExp2Round);
  return _mm_sub_ps(x, _mm_sub_ps(_mm_add_ps(x, round), round));
}

CPUATTN_ALWAYS_INLINE __m128 Exp2Scale(__m128 p, __m128 x) {
  const __m128i t = _mm_castps_si128(_mm_add_ps(x, _mm_set1_ps(kExp2Round)));
  const __m128 scaled = _mm_mul_ps(p, _mm_castsi128_ps(_mm_slli_epi32(t, 23)));
  return _mm_andnot_ps(_mm_cmple_ps(x, _mm_set1_ps(simd::kExp2ZeroAtOrBelow)), scaled);
}
#endif

}  // namespace x86
CPUATTN_NAMESPACE_END

#endif  // CPUATTN_SIMD_X86_INL_H_
