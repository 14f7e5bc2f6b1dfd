// The native unit PvUnit::runs_vnni: P V of streamed blocks (decoding steps of 2..kStreamRows
// rows per K/V head) with int8 V on AVX512-VNNI (vpdpwssd), in the column order of the bf16 runs
// (PairOrder::UnpermuteAcc restores it). Compiled only in the native units (flash_bf16.cc,
// flash_vnni.cc): AVX-512 with VNNI.
#if defined(CPUATTN_KERNELS_FLASH_X86_VNNI_I8_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef CPUATTN_KERNELS_FLASH_X86_VNNI_I8_INL_H_
#undef CPUATTN_KERNELS_FLASH_X86_VNNI_I8_INL_H_
#else
#define CPUATTN_KERNELS_FLASH_X86_VNNI_I8_INL_H_
#endif

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "core/problem.h"
#include "kernels/flash/config.h"
#include "kernels/flash/pv-inl.h"
#include "kernels/flash/x86/pair_order-inl.h"
#include "simd/target_namespace.h"

CPUATTN_NAMESPACE_BEGIN

#if defined(__AVX512VNNI__)

template <class O>
struct VnniI8 {
  static_assert(O::kLanes == 16, "the native units are AVX-512 only");
  static constexpr int N = 16;

  // int8 V in decoding steps (streamed blocks) on VNNI. A row's weights for the block, w_j =
  // p_j vscale_j (the scale joined P after the softmax sum), are quantized to int16 wi_j =
  // round(w_j / f), f = max_j |w_j| / 32767, so that P V = f sum_j wi_j v_j runs on vpdpwssd:
  // exact int32 sums of int16 pairs (two keys per lane; V sign-extended to int16 and two rows
  // interleaved as PvRunsTile does with bf16, so the same column order and PairOrder apply).
  // Error: |w_j - f wi_j| <= f / 2 < 2^-16 max w, so out moves by at most Nk 2^-16 max|v| for
  // a block of Nk keys (the sum over blocks of their largest p is at most l), 2^-9 max|v| at
  // Nk 128 (docs/precision.md). Per two keys and 64 columns at four rows: 4 widening loads, 4
  // shuffles and 16 vpdpwssd, where the f32 path widens 8 vectors in 16 instructions and runs 32
  // FMAs. Writes wi for keys [0, n) of row s to w and returns f: 0 when every weight is 0, and NaN
  // when a weight is NaN or infinite (an int8 scale that is), with every wi 0: such a row takes
  // PvRunsI8Exact instead.
  static float QuantWeightRow(const float* CPUATTN_RESTRICT s, std::int64_t n,
                              std::int16_t* CPUATTN_RESTRICT w) {
    __m512 mx = _mm512_setzero_ps();
    __mmask16 bad = 0;
    for (std::int64_t c = 0; c < n; c += N) {
      const auto m = static_cast<__mmask16>(n - c >= N ? 0xffff : (1u << (n - c)) - 1u);
      const __m512 v = _mm512_abs_ps(_mm512_maskz_loadu_ps(m, s + c));
      bad |= _mm512_cmp_ps_mask(v, _mm512_set1_ps(3.40282347e38f), _CMP_NLE_UQ);
      mx = _mm512_max_ps(mx, v);
    }
    const float wmax = _mm512_reduce_max_ps(mx);
    const bool finite = bad == 0 && wmax > 0.0f;
    const __m512 inv = _mm512_set1_ps(finite ? 32767.0f / wmax : 0.0f);
    for (std::int64_t c = 0; c < n; c += N) {
      const auto m = static_cast<__mmask16>(n - c >= N ? 0xffff : (1u << (n - c)) - 1u);
      const __m512i q =
          _mm512_cvt_roundps_epi32(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, s + c), inv),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      _mm256_mask_storeu_epi16(w + c, m, _mm512_cvtsepi32_epi16(q));
    }
    if (bad != 0) return std::numeric_limits<float>::quiet_NaN();
    return finite ? wmax / 32767.0f : 0.0f;
  }

  // acc += the pairs' products, the accumulator updated in its own register. Through the
  // intrinsic GCC 12 copied each of a tile's accumulators out and back every step and spilled
  // some (vpdpwssd has one form, its accumulator tied; an FMA has three), so the step took twice
  // its instructions.
  static CPUATTN_ALWAYS_INLINE void DpwssdInPlace(__m512i& acc, __m512i w, __m512i v) {
#if defined(__GNUC__) && !defined(__clang__)
    asm("vpdpwssd %2, %1, %0" : "+v"(acc) : "v"(w), "v"(v));
#else
    acc = _mm512_dpwssd_epi32(acc, w, v);
#endif
  }

  // Keys t and t + 1 (kPair; else key t with a zero row, whose weight is not read) of V rows
  // from v into acc[r][0..2G): V widened to int16 and the two rows interleaved, each row's two
  // weights one 32-bit broadcast from memory (wi of consecutive keys are adjacent).
  template <int R, int G, bool kPair>
  static CPUATTN_ALWAYS_INLINE void PairStep(const std::int8_t* CPUATTN_RESTRICT v,
                                             std::int64_t v_stride,
                                             const std::int16_t* CPUATTN_RESTRICT p,
                                             std::int64_t ws, __m512i (&acc)[R][2 * G]) {
    __m512i vv[2 * G];
    CPUATTN_UNROLL(2)
    for (int g = 0; g < G; ++g) {
      const __m512i a =
          _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + 32 * g)));
      const __m512i b = kPair ? _mm512_cvtepi8_epi16(_mm256_loadu_si256(
                                    reinterpret_cast<const __m256i*>(v + v_stride + 32 * g)))
                              : _mm512_setzero_si512();
      vv[2 * g] = _mm512_unpacklo_epi16(a, b);
      vv[2 * g + 1] = _mm512_unpackhi_epi16(a, b);
    }
    CPUATTN_UNROLL(8)
    for (int r = 0; r < R; ++r) {
      std::int32_t pw;
      if constexpr (kPair) {
        std::memcpy(&pw, p + r * ws, sizeof(pw));
      } else {
        pw = static_cast<std::uint16_t>(p[r * ws]);
      }
      const __m512i wv = _mm512_set1_epi32(pw);
      CPUATTN_UNROLL(4)
      for (int c = 0; c < 2 * G; ++c) DpwssdInPlace(acc[r][c], wv, vv[c]);
    }
  }

  // Acc[R][2G vectors from c0] += f[r] sum over the runs' keys of wi v, in int32 registers over
  // the whole block (|sum| <= Nk 32767 128 < 2^31 for Nk <= 512), converted once at the end.
  template <int R, int G>
  static CPUATTN_ALWAYS_INLINE void PvRunsI8Tile(const std::int16_t* CPUATTN_RESTRICT w,
                                                 std::int64_t ws, const float* f,
                                                 const VRun<std::int8_t>* runs, int nruns,
                                                 std::int64_t c0, std::int64_t v_stride,
                                                 float* CPUATTN_RESTRICT acc_out,
                                                 std::int64_t acc_stride) {
    static_assert(O::kBlockKeys <= 512, "int32 sums of a block's wi v could overflow");
    __m512i acc[R][2 * G];
    CPUATTN_UNROLL(8)
    for (int r = 0; r < R; ++r) {
      CPUATTN_UNROLL(4)
      for (int c = 0; c < 2 * G; ++c) acc[r][c] = _mm512_setzero_si512();
    }
    for (int i = 0; i < nruns; ++i) {
      const std::int8_t* v = runs[i].v + c0;
      const std::int16_t* p = w + runs[i].j0;
      const std::int64_t n = runs[i].n;
      // Whole pairs in a loop without a pair check, then an odd run's last key.
      std::int64_t t = 0;
      for (; t + 1 < n; t += 2) PairStep<R, G, true>(v + t * v_stride, v_stride, p + t, ws, acc);
      if (t < n) PairStep<R, G, false>(v + t * v_stride, v_stride, p + t, ws, acc);
    }
    CPUATTN_UNROLL(8)
    for (int r = 0; r < R; ++r) {
      const __m512 fr = _mm512_set1_ps(f[r]);
      CPUATTN_UNROLL(4)
      for (int c = 0; c < 2 * G; ++c) {
        float* a = acc_out + r * acc_stride + c * N;
        _mm512_store_ps(a, _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r][c]), fr, _mm512_load_ps(a)));
      }
    }
  }

  // One row's P V in f32, weight times widened V as the f32 path computes it, for a row whose
  // weights are not all finite: its infinities and NaNs come out column by column as there. It
  // adds into the accumulators in PvRuns's column order (see x86/pair_order-inl.h).
  static void PvRunsI8Exact(const float* s, const VRun<std::int8_t>* runs, int nruns,
                            std::int64_t Dv, std::int64_t v_stride, float* acc) {
    for (int i = 0; i < nruns; ++i)
      for (std::int64_t t = 0; t < runs[i].n; ++t) {
        const float w = s[runs[i].j0 + t];
        const std::int8_t* v = runs[i].v + t * v_stride;
        for (std::int64_t c = 0; c < Dv; ++c) {
          const std::int64_t k = c % 32;
          acc[c - k + (k % 8 < 4 ? 0 : 16) + 4 * (k / 8) + k % 4] += w * static_cast<float>(v[c]);
        }
      }
  }

  // R rows x G groups of 32 columns (G = 1 or 2) from c0; Dv is whole groups of 32.
  static void PvRunsI8(int R, int G, const std::int16_t* w, std::int64_t ws, const float* f,
                       const VRun<std::int8_t>* runs, int nruns, std::int64_t c0,
                       std::int64_t v_stride, float* acc, std::int64_t acc_stride) {
    switch (R * 2 + G - 1) {
#define CPUATTN_I8_RUNS_CASE(r)                                                 \
  case r * 2:                                                                   \
    if constexpr (r <= O::kPvRows)                                              \
      PvRunsI8Tile<r, 1>(w, ws, f, runs, nruns, c0, v_stride, acc, acc_stride); \
    break;                                                                      \
  case r * 2 + 1:                                                               \
    if constexpr (r <= O::kPvRows)                                              \
      PvRunsI8Tile<r, 2>(w, ws, f, runs, nruns, c0, v_stride, acc, acc_stride); \
    break;
      CPUATTN_I8_RUNS_CASE(1)
      CPUATTN_I8_RUNS_CASE(2)
      CPUATTN_I8_RUNS_CASE(3)
      CPUATTN_I8_RUNS_CASE(4)
      CPUATTN_I8_RUNS_CASE(5)
      CPUATTN_I8_RUNS_CASE(6)
#undef CPUATTN_I8_RUNS_CASE
      default:
        break;
    }
  }

  // PvUnit::runs_vnni for rows [r_lo, r_hi) of K/V head hk: P scaled by V's scales, each row's
  // weights quantized to int16 (QuantWeightRow), Acc += P V over keys [0, nk_live) of the block at
  // kb0 in one call per 64 columns (the int32 sums span the block); rows with a non-finite weight
  // take PvRunsI8Exact. Pb holds the int16 weights. A share of the K rows read next (`ahead`) is
  // prefetched per 64 columns.
  static void PvBlock(const detail::Problem& p, std::int64_t b, std::int64_t hk, std::int64_t kb0,
                      std::int64_t nk_live, int r_lo, int r_hi, float* s, std::int64_t s_stride,
                      std::uint16_t* pb, float* acc, std::int64_t dvp,
                      const detail::KeyAhead& ahead) {
    ScalePByVScales<O>(p, b, hk, kb0, nk_live, r_lo, r_hi, s, s_stride, 1.0f);
    auto* w = reinterpret_cast<std::int16_t*>(pb);
    float f[detail::kStreamRows];
    unsigned exact_rows = 0;
    for (int r = r_lo; r < r_hi; ++r) {
      f[r - r_lo] = QuantWeightRow(s + r * s_stride, nk_live, w + r * s_stride);
      if (std::isnan(f[r - r_lo])) f[r - r_lo] = 0.0f, exact_rows |= 1u << (r - r_lo);
    }
    VRun<std::int8_t> vruns[O::kBlockKeys];
    const int nv = MakeVRuns(p, b, hk, kb0, 0, nk_live, vruns);
    const std::int64_t chunks = (p.Dv + 63) / 64;
    for (std::int64_t c0 = 0; c0 < p.Dv; c0 += 64) {
      ahead.Share(c0 / 64, chunks);
      const int groups = p.Dv - c0 >= 64 ? 2 : 1;
      for (int r0 = r_lo; r0 < r_hi; r0 += O::kPvRows) {
        const int R = std::min(O::kPvRows, r_hi - r0);
        PvRunsI8(R, groups, w + r0 * s_stride, s_stride, f + (r0 - r_lo), vruns, nv, c0, p.v.s[2],
                 acc + r0 * dvp + c0, dvp);
      }
    }
    for (int r = r_lo; r < r_hi; ++r)
      if ((exact_rows >> (r - r_lo)) & 1u)
        PvRunsI8Exact(s + r * s_stride, vruns, nv, p.Dv, p.v.s[2], acc + r * dvp);
  }
};

#endif  // __AVX512VNNI__

CPUATTN_NAMESPACE_END

#endif  // CPUATTN_KERNELS_FLASH_X86_VNNI_I8_INL_H_
