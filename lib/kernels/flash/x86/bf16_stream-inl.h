// The native units of streamed blocks (decoding steps of 2..kStreamRows rows per K/V head) with
// bf16 K/V, for CPUs with AVX512-BF16: QUnit::f32_hilo with its score dot (Dot4HiLo) and
// PvUnit::runs_bf16. Compiled only in the avx512_bf16 unit (flash_bf16.cc).
//
// Scores: bf16 K rows are multiplied as stored with vdpbf16ps, which pairs adjacent dimensions, so
// K needs no packing; Q, scaled f32 rows, is split into two bf16 rows hi + lo kept beside each f32
// row in the Qp scratch: hi from qd + QHiLoOffset(D), lo D32 elements after it, D32 = D rounded
// up to 32 (zero-padded). Two instructions per 32 dimensions instead of the f32 path's two FMAs,
// two widening loads and two Q loads; Q rounded to bf16 alone (hi) would add 2^-9 relative to
// every score.
// Error: hi = q truncated to bf16 (|q - hi| < 2^-7 |q|, same sign), lo = bf16(q - hi) rounded to
// nearest, so |q - hi - lo| < 2^-16 |q|; the products of bf16 pairs are exact in f32. Where lo
// rounds to 0 (q a bf16 already, or subnormal: vdpbf16ps flushes those) it is 2^-126 with q's
// sign instead, so that q * inf stays an infinity of the right sign (hi * inf + 0 * inf would
// be NaN); that adds at most 2^-126 |k| per term. Infinite q: lo as for a bf16 q; NaN q: hi NaN.
#if defined(CPUATTN_KERNELS_FLASH_X86_BF16_STREAM_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef CPUATTN_KERNELS_FLASH_X86_BF16_STREAM_INL_H_
#undef CPUATTN_KERNELS_FLASH_X86_BF16_STREAM_INL_H_
#else
#define CPUATTN_KERNELS_FLASH_X86_BF16_STREAM_INL_H_
#endif

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "core/dtypes.h"
#include "core/problem.h"
#include "kernels/flash/pv-inl.h"
#include "kernels/flash/stream_dot-inl.h"
#include "kernels/flash/x86/bf16_tile-inl.h"
#include "kernels/flash/x86/pair_order-inl.h"
#include "simd/target_namespace.h"
#include "simd/x86/x86-inl.h"

CPUATTN_NAMESPACE_BEGIN

#if defined(__AVX512BF16__)

template <class O>
struct Bf16Stream {
  static_assert(O::kLanes == 16, "the native bf16 units are AVX-512 only");
  static constexpr int N = 16;

  // Dimensions [d, d + 32) of Dot4HiLo (those of mask m), hi into acc and lo into acc2 when
  // kSplit is 2, both into acc otherwise.
  template <int R, int kSplit, int R2>
  static CPUATTN_ALWAYS_INLINE void Dot4HiLoStep(const float* CPUATTN_RESTRICT qd, std::int64_t dp,
                                                 std::int64_t D, std::int64_t d32,
                                                 const detail::Bf16* const (&k)[4], std::int64_t d,
                                                 __mmask32 m, __m512 (&acc)[R][4],
                                                 __m512 (&acc2)[R2][4]) {
    __m512bh kv[4];
    CPUATTN_UNROLL(4)
    for (int g = 0; g < 4; ++g) kv[g] = (__m512bh)_mm512_maskz_loadu_epi16(m, k[g] + d);
    CPUATTN_UNROLL(16)
    for (int r = 0; r < R; ++r) {
      const auto* hi = reinterpret_cast<const std::uint16_t*>(qd + r * dp + QHiLoOffset(D));
      const auto qh = (__m512bh)_mm512_loadu_si512(hi + d);
      const auto ql = (__m512bh)_mm512_loadu_si512(hi + d32 + d);
      CPUATTN_UNROLL(4)
      for (int g = 0; g < 4; ++g) {
        if constexpr (kSplit == 2) {
          acc[r][g] = _mm512_dpbf16_ps(acc[r][g], qh, kv[g]);
          acc2[r][g] = _mm512_dpbf16_ps(acc2[r][g], ql, kv[g]);
        } else {
          acc[r][g] = _mm512_dpbf16_ps(_mm512_dpbf16_ps(acc[r][g], qh, kv[g]), ql, kv[g]);
        }
      }
    }
  }

  // R rows' dot products with four bf16 keys (Dot4 in stream_dot-inl.h, for QUnit::f32_hilo): q
  // is hi + lo, two bf16 rows beside each Qp row (SplitQRows), and each of the two products of
  // bf16 pairs is exact in f32, so a score is within 2^-16 |q| |k| of the f32 product.
  template <int R>
  static CPUATTN_ALWAYS_INLINE void Dot4HiLo(const float* CPUATTN_RESTRICT qd, std::int64_t dp,
                                             std::int64_t D, const detail::Bf16* const (&k)[4],
                                             __m128 (&sum)[R]) {
    // d by d across the four keys: each Q hi/lo load serves four keys (SplitQRows).
    const std::int64_t d32 = (D + 31) / 32 * 32;
    __m512 acc[R][4];
    // With two rows, hi and lo go into separate accumulators: a chain of two dependent
    // vdpbf16ps per 32 dimensions leaves few rows latency-bound
    // (docs/performance.md#dm-native-bf16-latency).
    constexpr int kSplit = R <= 2 ? 2 : 1;
    __m512 acc2[kSplit == 2 ? R : 1][4];
    CPUATTN_UNROLL(16)
    for (int r = 0; r < R; ++r) {
      CPUATTN_UNROLL(4)
      for (int g = 0; g < 4; ++g) acc[r][g] = _mm512_setzero_ps();
    }
    if constexpr (kSplit == 2) {
      CPUATTN_UNROLL(16)
      for (int r = 0; r < R; ++r) {
        CPUATTN_UNROLL(4)
        for (int g = 0; g < 4; ++g) acc2[r][g] = _mm512_setzero_ps();
      }
    }
    // Whole 32 dimensions with an all-ones mask (a constant: the loads are plain), then the row's
    // last partial 32 by a masked load, so nothing past D is read.
    std::int64_t d = 0;
    for (; d + 32 <= D; d += 32)
      Dot4HiLoStep<R, kSplit>(qd, dp, D, d32, k, d, static_cast<__mmask32>(~0u), acc, acc2);
    if (d < D)
      Dot4HiLoStep<R, kSplit>(qd, dp, D, d32, k, d,
                              static_cast<__mmask32>((1u << static_cast<unsigned>(D - d)) - 1u),
                              acc, acc2);
    if constexpr (kSplit == 2) {
      CPUATTN_UNROLL(16)
      for (int r = 0; r < R; ++r) {
        CPUATTN_UNROLL(4)
        for (int g = 0; g < 4; ++g) acc[r][g] = _mm512_add_ps(acc[r][g], acc2[r][g]);
      }
    }
    CPUATTN_UNROLL(16)
    for (int r = 0; r < R; ++r)
      sum[r] = x86::ReduceSum4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]);
  }

  // QUnit::f32_hilo: the hi and lo bf16 rows of the block's f32 Qp rows, beside them in Qp from
  // QHiLoOffset(D) (stream_dot-inl.h), for Dot4HiLo.
  static void SplitQRows(float* CPUATTN_RESTRICT qp, int rows, std::int64_t qs, std::int64_t D) {
    const std::int64_t d32 = (D + 31) / 32 * 32;
    const __m512i keep_hi = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
    for (int r = 0; r < rows; ++r) {
      const float* x = qp + r * qs;
      auto* hi = reinterpret_cast<std::uint16_t*>(qp + r * qs + QHiLoOffset(D));
      std::uint16_t* lo = hi + d32;
      for (std::int64_t d = 0; d < d32; d += 16) {
        const std::int64_t n = std::clamp<std::int64_t>(D - d, 0, 16);
        const auto m = static_cast<__mmask16>((1u << n) - 1u);
        const __m512 v = _mm512_maskz_loadu_ps(m, x + d);
        const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        const __mmask16 finite =
            _mm512_cmp_ps_mask(_mm512_abs_ps(v), _mm512_set1_ps(3.40282347e38f), _CMP_LE_OQ);
        __m512i h = _mm512_and_si512(_mm512_castps_si512(v), keep_hi);
        h = _mm512_mask_mov_epi32(h, nan, _mm512_set1_epi32(0x7fc00000));
        const __m512 rest = _mm512_maskz_sub_ps(finite, v, _mm512_castsi512_ps(h));
        // Round to nearest even (vcvtneps2bf16), then the 2^-126 stand-in where lo is +-0 and q is
        // not 0 (or NaN, where it does not matter).
        __m256i l = (__m256i)_mm512_cvtneps_pbh(rest);
        const __m256i sign =
            _mm256_and_si256(_mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(v), 16)),
                             _mm256_set1_epi16(static_cast<short>(0x8000)));
        const __mmask16 lo_zero = _mm256_testn_epi16_mask(l, _mm256_set1_epi16(0x7fff)) &
                                  _mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_NEQ_UQ);
        l = _mm256_mask_mov_epi16(l, lo_zero, _mm256_or_si256(sign, _mm256_set1_epi16(0x0080)));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(hi + d),
                            _mm512_cvtepi32_epi16(_mm512_srli_epi32(h, 16)));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(lo + d), l);
      }
    }
  }

  // Decoding steps (streamed blocks): P V with V read in place, no packing. vdpbf16ps reduces
  // pairs of keys, so two V rows are interleaved in registers, 32 columns at a time
  // (vpunpcklwd / vpunpckhwd): the "lo" vector holds columns 8i + {0..3} of 128-bit lane i, the
  // "hi" vector 8i + {4..7}. The accumulators keep that order for the whole query block (the
  // online softmax only scales them) and PairOrder::UnpermuteAcc (x86/pair_order-inl.h) restores it
  // once before the output. Per 32 columns and two keys: two loads, two shuffles and R
  // instructions, where the f32 path widens four vectors and runs 4R FMAs
  // (docs/performance.md#dm-native-pv-runs). Pb is the rows' P rounded to bf16 (RoundRow), row
  // stride pbs. Keys t and t + 1 of a run (kPair), or key t alone with a zero row and a zero
  // probability (a run's odd last key), into acc. A pair's two bf16 weights are adjacent in Pb: one
  // 32-bit broadcast from memory, where assembling them in a register cost five operations per row.
  template <int R, int G, bool kPair>
  static CPUATTN_ALWAYS_INLINE void PvRunsStep(const std::uint16_t* CPUATTN_RESTRICT p,
                                               std::int64_t pbs,
                                               const std::uint16_t* CPUATTN_RESTRICT v,
                                               std::int64_t v_stride, std::int64_t t,
                                               __m512 (&acc)[R][2 * G]) {
    __m512bh vv[2 * G];
    CPUATTN_UNROLL(2)
    for (int g = 0; g < G; ++g) {
      const __m512i a = _mm512_loadu_si512(v + t * v_stride + 32 * g);
      const __m512i b =
          kPair ? _mm512_loadu_si512(v + (t + 1) * v_stride + 32 * g) : _mm512_setzero_si512();
      vv[2 * g] = (__m512bh)_mm512_unpacklo_epi16(a, b);
      vv[2 * g + 1] = (__m512bh)_mm512_unpackhi_epi16(a, b);
    }
    CPUATTN_UNROLL(8)
    for (int r = 0; r < R; ++r) {
      std::uint32_t w = p[r * pbs + t];
      if constexpr (kPair) std::memcpy(&w, p + r * pbs + t, sizeof w);
      const auto pw = (__m512bh)_mm512_set1_epi32(static_cast<int>(w));
      CPUATTN_UNROLL(4)
      for (int c = 0; c < 2 * G; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], pw, vv[c]);
    }
  }

  template <int R, int G>
  static CPUATTN_ALWAYS_INLINE void PvRunsTile(const std::uint16_t* CPUATTN_RESTRICT pb,
                                               std::int64_t pbs, const VRun<detail::Bf16>* runs,
                                               int nruns, std::int64_t c0, std::int64_t v_stride,
                                               float* CPUATTN_RESTRICT acc_out,
                                               std::int64_t acc_stride) {
    __m512 acc[R][2 * G];
    CPUATTN_UNROLL(8)
    for (int r = 0; r < R; ++r) {
      CPUATTN_UNROLL(4)
      for (int c = 0; c < 2 * G; ++c) acc[r][c] = _mm512_load_ps(acc_out + r * acc_stride + c * N);
    }
    for (int i = 0; i < nruns; ++i) {
      const auto* v = reinterpret_cast<const std::uint16_t*>(runs[i].v) + c0;
      const std::uint16_t* p = pb + runs[i].j0;
      const std::int64_t n = runs[i].n;
      std::int64_t t = 0;
      for (; t + 1 < n; t += 2) PvRunsStep<R, G, true>(p, pbs, v, v_stride, t, acc);
      if (t < n) PvRunsStep<R, G, false>(p, pbs, v, v_stride, t, acc);
    }
    CPUATTN_UNROLL(8)
    for (int r = 0; r < R; ++r) {
      CPUATTN_UNROLL(4)
      for (int c = 0; c < 2 * G; ++c) _mm512_store_ps(acc_out + r * acc_stride + c * N, acc[r][c]);
    }
  }

  // R rows x G groups of 32 columns (G = 1 or 2) from c0; Dv is whole groups of 32.
  static void PvRuns(int R, int G, const std::uint16_t* pb, std::int64_t pbs,
                     const VRun<detail::Bf16>* runs, int nruns, std::int64_t c0,
                     std::int64_t v_stride, float* acc, std::int64_t acc_stride) {
    switch (R * 2 + G - 1) {
#define CPUATTN_BF16_RUNS_CASE(r)                                            \
  case r * 2:                                                                \
    if constexpr (r <= O::kPvRows)                                           \
      PvRunsTile<r, 1>(pb, pbs, runs, nruns, c0, v_stride, acc, acc_stride); \
    break;                                                                   \
  case r * 2 + 1:                                                            \
    if constexpr (r <= O::kPvRows)                                           \
      PvRunsTile<r, 2>(pb, pbs, runs, nruns, c0, v_stride, acc, acc_stride); \
    break;
      CPUATTN_BF16_RUNS_CASE(1)
      CPUATTN_BF16_RUNS_CASE(2)
      CPUATTN_BF16_RUNS_CASE(3)
      CPUATTN_BF16_RUNS_CASE(4)
      CPUATTN_BF16_RUNS_CASE(5)
      CPUATTN_BF16_RUNS_CASE(6)
#undef CPUATTN_BF16_RUNS_CASE
      default:
        break;
    }
  }

  // PvUnit::runs_bf16 for rows [r_lo, r_hi) of K/V head hk: Pb rows = P rows (s_stride apart,
  // ncols whole panels) rounded to bf16, then Acc += Pb . V over keys [0, nk_live) of the block
  // at kb0 in steps of kStreamKeys keys, each step's runs in one call per 64 columns (Dv is whole
  // groups of 32), and a share of the K rows read next (`ahead`) prefetched per step. The
  // accumulators stay in PvRuns's column order (PairOrder::UnpermuteAcc).
  static void PvBlock(const detail::Problem& p, std::int64_t b, std::int64_t hk, std::int64_t kb0,
                      std::int64_t nk_live, std::int64_t ncols, int r_lo, int r_hi, const float* s,
                      std::int64_t s_stride, std::uint16_t* pb, float* acc, std::int64_t dvp,
                      const detail::KeyAhead& ahead) {
    for (int r = r_lo; r < r_hi; ++r)
      Bf16Tile<O>::RoundRow(s + r * s_stride, ncols, pb + r * s_stride);
    VRun<detail::Bf16> vruns[O::kBlockKeys];
    const std::int64_t steps = (nk_live + kStreamKeys - 1) / kStreamKeys;
    for (std::int64_t s0 = 0; s0 < nk_live; s0 += kStreamKeys) {
      ahead.Share(s0 / kStreamKeys, steps);
      const int nv = MakeVRuns(p, b, hk, kb0, s0, std::min(nk_live, s0 + kStreamKeys), vruns);
      for (std::int64_t c0 = 0; c0 < p.Dv; c0 += 64) {
        const int groups = p.Dv - c0 >= 64 ? 2 : 1;
        for (int r0 = r_lo; r0 < r_hi; r0 += O::kPvRows) {
          const int R = std::min(O::kPvRows, r_hi - r0);
          PvRuns(R, groups, pb + r0 * s_stride, s_stride, vruns, nv, c0, p.v.s[2],
                 acc + r0 * dvp + c0, dvp);
        }
      }
    }
  }
};

#endif  // __AVX512BF16__

CPUATTN_NAMESPACE_END

#endif  // CPUATTN_KERNELS_FLASH_X86_BF16_STREAM_INL_H_
