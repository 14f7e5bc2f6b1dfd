// The native bf16 pieces of the flash kernel, for CPUs with AVX512-BF16: vdpbf16ps multiplies
// pairs of bf16 and adds both products to an f32 lane, twice the multiply-adds of an f32 FMA per
// instruction. Compiled only in the avx512_bf16 unit (flash_bf16.cc); the task driver
// (task-inl.h) calls these for blocks it packs, when Q, K and V are all bf16.
//
// Layouts (bf16 pairs: the two elements one vdpbf16ps lane reduces, stored next to each other,
// so one 32-bit broadcast or one 64-byte load feeds a whole instruction):
//   Qb  [rows][DP2][2]          query rows as stored (not scaled: the scale multiplies the f32
//                               scores, so no rounding is added), D padded to even with 0.
//   Kb  [panels][DP2][W][2]     per panel of W keys: for each pair of dims, W keys x 2 dims.
//   Pb  [rows][Nk]              the probabilities rounded to bf16 (vcvtne2ps2bf16: nearest even).
//   Vb  [chunks][nk2][CW][2]    per chunk of CW values: for each pair of keys, CW columns x 2
//                               keys; an odd block's last pair has a zero key.
// Error: Q K^T products of two bf16 are exact in f32 and summed in f32, as in the f32 kernel; P V
// adds the rounding of P to bf16, |dp| <= 2^-8 p, so |d out| <= 2^-8 max |v| (README).
#if defined(CPUATTN_KERNELS_FLASH_BF16_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef CPUATTN_KERNELS_FLASH_BF16_INL_H_
#undef CPUATTN_KERNELS_FLASH_BF16_INL_H_
#else
#define CPUATTN_KERNELS_FLASH_BF16_INL_H_
#endif

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>

#include "core/problem.h"
#include "kernels/common/mask-inl.h"
#include "kernels/flash/decode-inl.h"
#include "kernels/flash/pack-inl.h"
#include "kernels/flash/pv-inl.h"
#include "simd/target_namespace.h"

CPUATTN_NAMESPACE_BEGIN

#if defined(__AVX512BF16__)

template <class O>
struct NativeBf16 {
  static_assert(O::kLanes == 16, "the native bf16 kernel is AVX-512 only");
  static constexpr int N = 16;
  static constexpr int W = Geometry<O>::W;
  static constexpr int CW = Geometry<O>::CW;

  static std::int64_t Pairs(std::int64_t n) { return (n + 1) / 2; }

  // Qb rows: a copy of the stored bf16 rows, zero-padded to qs2 pairs.
  static void PackQ(const detail::Problem& p, std::int64_t b, std::int64_t h0, std::int64_t nh,
                    std::int64_t pos0, int rows, std::int64_t qs2,
                    std::uint16_t* CPUATTN_RESTRICT qb) {
    for (int r = 0; r < rows; ++r) {
      const std::uint16_t* src = static_cast<const std::uint16_t*>(p.q.data) + b * p.q.s[0] +
                                 (h0 + r % nh) * p.q.s[1] + (pos0 + r / nh) * p.q.s[2];
      std::uint16_t* dst = qb + r * qs2 * 2;
      std::memcpy(dst, src, static_cast<std::size_t>(p.D) * 2);
      std::fill(dst + p.D, dst + qs2 * 2, std::uint16_t{0});
    }
  }

  // Kb panels of keys [j0, j0 + nk): 32 keys x 16 bf16 dims at a time are read as 16 x 16 f32
  // words (pairs) and transposed in registers, giving [pair][16 keys][2] per vector.
  static void PackK(const detail::Problem& p, std::int64_t b, std::int64_t hk, std::int64_t j0,
                    std::int64_t nk, std::uint32_t* CPUATTN_RESTRICT kb) {
    const std::uint16_t* K = static_cast<const std::uint16_t*>(p.k.data) + hk * p.k.s[1];
    const std::int64_t dp2 = Pairs(p.D);
    const std::int64_t panels = (nk + W - 1) / W;
    for (std::int64_t pi = 0; pi < panels; ++pi) {
      std::uint32_t* dst = kb + pi * dp2 * W;
      for (int part = 0; part < W / N; ++part) {
        const std::int64_t w0 = pi * W + part * N;
        const std::int64_t keys = std::clamp<std::int64_t>(nk - w0, 0, N);
        for (std::int64_t q0 = 0; q0 < dp2; q0 += N) {
          const std::int64_t pairs = std::min<std::int64_t>(N, dp2 - q0);
          __m512 r[N];
          for (int w = 0; w < N; ++w) {
            if (w >= keys) {
              r[w] = _mm512_setzero_ps();
              continue;
            }
            const std::uint16_t* src = K + p.key_off(p.k.s, b, j0 + w0 + w) + 2 * q0;
            const std::int64_t elems = std::min<std::int64_t>(2 * pairs, p.D - 2 * q0);
            if (elems == 2 * N) {
              r[w] = _mm512_loadu_ps(src);
            } else {
              // Masked load of the row's tail: no element past D is read; the rest is 0.
              const __mmask32 m = static_cast<__mmask32>((std::uint64_t{1} << elems) - 1);
              r[w] = _mm512_castsi512_ps(_mm512_maskz_loadu_epi16(m, src));
            }
          }
          x86::Transpose(r);
          for (std::int64_t q = 0; q < pairs; ++q)
            _mm512_storeu_ps(dst + (q0 + q) * W + part * N, r[q]);
        }
      }
    }
  }

  // Vb chunks of keys [j0, j0 + nk): two rows of V interleaved column by column.
  static void PackV(const detail::Problem& p, std::int64_t DvP, std::int64_t b, std::int64_t hk,
                    std::int64_t j0, std::int64_t nk, std::uint32_t* CPUATTN_RESTRICT vb) {
    const std::uint16_t* Vs = static_cast<const std::uint16_t*>(p.v.data) + hk * p.v.s[1];
    const std::int64_t nk2 = Pairs(nk);
    for (std::int64_t c0 = 0; c0 < DvP; c0 += CW) {
      const std::int64_t cw = std::min<std::int64_t>(CW, DvP - c0);
      std::uint32_t* dst = vb + c0 * nk2;  // chunk c0: nk2 pair rows of cw words
      const std::int64_t valid = std::max<std::int64_t>(0, std::min(cw, p.Dv - c0));
      for (std::int64_t k2 = 0; k2 < nk2; ++k2) {
        const std::uint16_t* r0 = Vs + p.key_off(p.v.s, b, j0 + 2 * k2) + c0;
        const bool has_r1 = 2 * k2 + 1 < nk;
        const std::uint16_t* r1 = has_r1 ? Vs + p.key_off(p.v.s, b, j0 + 2 * k2 + 1) + c0 : nullptr;
        std::uint32_t* row = dst + k2 * cw;
        std::int64_t c = 0;
        for (; c + N <= valid; c += N) {
          const __m512i a =
              _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(r0 + c)));
          const __m512i z = has_r1 ? _mm512_cvtepu16_epi32(_mm256_loadu_si256(
                                         reinterpret_cast<const __m256i*>(r1 + c)))
                                   : _mm512_setzero_si512();
          _mm512_storeu_si512(row + c, _mm512_or_si512(a, _mm512_slli_epi32(z, 16)));
        }
        for (; c < valid; ++c)
          row[c] = r0[c] | (has_r1 ? static_cast<std::uint32_t>(r1[c]) << 16 : 0u);
        for (; c < cw; ++c) row[c] = 0;
      }
    }
  }

  // Scores of R rows x W keys: S = qscale * (Qb . Kb panel), masked in the epilogue.
  template <int R, bool kMasked>
  static CPUATTN_INLINE void ScoreTile(const std::uint32_t* CPUATTN_RESTRICT q, std::int64_t qs2,
                                       std::int64_t dp2, const std::uint32_t* CPUATTN_RESTRICT kb,
                                       float qscale, float* CPUATTN_RESTRICT s,
                                       std::int64_t s_stride, std::int32_t col0,
                                       const RowMask* rows, const MaskInfo& mi) {
    constexpr int C = W / N;
    __m512 acc[R][C];
    CPUATTN_UNROLL(16)
    for (int r = 0; r < R; ++r) {
      CPUATTN_UNROLL(4)
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
    }
    for (std::int64_t k = 0; k < dp2; ++k) {
      __m512bh bv[C];
      CPUATTN_UNROLL(4)
      for (int c = 0; c < C; ++c) bv[c] = (__m512bh)_mm512_loadu_ps(kb + k * W + c * N);
      CPUATTN_UNROLL(16)
      for (int r = 0; r < R; ++r) {
        const __m512bh av = (__m512bh)_mm512_set1_epi32(static_cast<int>(q[r * qs2 + k]));
        CPUATTN_UNROLL(4)
        for (int c = 0; c < C; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], av, bv[c]);
      }
    }
    const __m512 vs = _mm512_set1_ps(qscale);
    // Local copies of the mask state, as in ScoreTile (score-inl.h).
    const MaskInfo m = mi;
    RowMask rm[R] = {};
    CopyRowMasks<R>(rows, kMasked || m.transforms(), rm);
    typename O::V x[R][C];
    CPUATTN_UNROLL(16)
    for (int r = 0; r < R; ++r) {
      CPUATTN_UNROLL(4)
      for (int c = 0; c < C; ++c) x[r][c] = O::FromRaw(_mm512_mul_ps(acc[r][c], vs));
    }
    if (m.transforms()) TransformTile<O, R, C>(x, col0, rm, m);
    CPUATTN_UNROLL(16)
    for (int r = 0; r < R; ++r) {
      CPUATTN_UNROLL(4)
      for (int c = 0; c < C; ++c) {
        if constexpr (kMasked) x[r][c] = ApplyRowMask<O>(x[r][c], col0 + c * N, rm[r], m);
        O::Store(x[r][c], s + r * s_stride + c * N);
      }
    }
  }

  template <bool kMasked>
  static void ScoreRows(int R, const std::uint32_t* q, std::int64_t qs2, std::int64_t dp2,
                        const std::uint32_t* kb, float qscale, float* s, std::int64_t s_stride,
                        std::int32_t col0, const RowMask* rows, const MaskInfo& mi) {
    switch (R) {
#define CPUATTN_BF16_SCORE_CASE(n)                                                 \
  case n:                                                                          \
    if constexpr (n <= O::kScoreRows)                                              \
      ScoreTile<n, kMasked>(q, qs2, dp2, kb, qscale, s, s_stride, col0, rows, mi); \
    break;
      CPUATTN_BF16_SCORE_CASE(1)
      CPUATTN_BF16_SCORE_CASE(2)
      CPUATTN_BF16_SCORE_CASE(3)
      CPUATTN_BF16_SCORE_CASE(4)
      CPUATTN_BF16_SCORE_CASE(5)
      CPUATTN_BF16_SCORE_CASE(6)
#undef CPUATTN_BF16_SCORE_CASE
      default:
        break;
    }
  }

  // Pb row = S row rounded to bf16 (ncols is whole panels, so whole 32-value steps).
  static CPUATTN_INLINE void RoundRow(const float* CPUATTN_RESTRICT s, std::int64_t ncols,
                                      std::uint16_t* CPUATTN_RESTRICT pb) {
    for (std::int64_t c = 0; c < ncols; c += 2 * N) {
      const __m512bh h = _mm512_cvtne2ps_pbh(_mm512_load_ps(s + c + N), _mm512_load_ps(s + c));
      _mm512_storeu_si512(pb + c, (__m512i)h);
    }
  }

  // Acc[R][0:C vectors] += Pb[R][keys] . Vb chunk, over nk2 key pairs.
  template <int R, int C>
  static CPUATTN_INLINE void PvTile(const std::uint32_t* CPUATTN_RESTRICT p, std::int64_t p_stride2,
                                    const std::uint32_t* CPUATTN_RESTRICT vb, std::int64_t cw,
                                    std::int64_t nk2, float* CPUATTN_RESTRICT acc_out,
                                    std::int64_t acc_stride) {
    __m512 acc[R][C];
    CPUATTN_UNROLL(16)
    for (int r = 0; r < R; ++r) {
      CPUATTN_UNROLL(4)
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_load_ps(acc_out + r * acc_stride + c * N);
    }
    for (std::int64_t k = 0; k < nk2; ++k) {
      __m512bh bv[C];
      CPUATTN_UNROLL(4)
      for (int c = 0; c < C; ++c) bv[c] = (__m512bh)_mm512_loadu_ps(vb + k * cw + c * N);
      CPUATTN_UNROLL(16)
      for (int r = 0; r < R; ++r) {
        const __m512bh av = (__m512bh)_mm512_set1_epi32(static_cast<int>(p[r * p_stride2 + k]));
        CPUATTN_UNROLL(4)
        for (int c = 0; c < C; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], av, bv[c]);
      }
    }
    CPUATTN_UNROLL(16)
    for (int r = 0; r < R; ++r) {
      CPUATTN_UNROLL(4)
      for (int c = 0; c < C; ++c) _mm512_store_ps(acc_out + r * acc_stride + c * N, acc[r][c]);
    }
  }

  template <int C>
  static void PvRowsC(int R, const std::uint32_t* p, std::int64_t p_stride2,
                      const std::uint32_t* vb, std::int64_t cw, std::int64_t nk2, float* acc,
                      std::int64_t acc_stride) {
    switch (R) {
#define CPUATTN_BF16_PV_CASE(n)                                                              \
  case n:                                                                                    \
    if constexpr (n <= O::kPvRows) PvTile<n, C>(p, p_stride2, vb, cw, nk2, acc, acc_stride); \
    break;
      CPUATTN_BF16_PV_CASE(1)
      CPUATTN_BF16_PV_CASE(2)
      CPUATTN_BF16_PV_CASE(3)
      CPUATTN_BF16_PV_CASE(4)
      CPUATTN_BF16_PV_CASE(5)
      CPUATTN_BF16_PV_CASE(6)
#undef CPUATTN_BF16_PV_CASE
      default:
        break;
    }
  }

  // The hi and lo bf16 rows of decoding's f32 Q rows, beside them in Qp (decode-inl.h, Dot4).
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
  // online softmax only scales them) and UnpermuteAcc restores it once before the output. Per
  // 32 columns and two keys: two loads, two shuffles and R instructions, where the f32 path
  // widens four vectors and runs 4R FMAs (a micro-benchmark on Zen 4, four rows in L1: 9.4 ->
  // 4.7 ns per key at D 128). Pb is the rows' P rounded to bf16 (RoundRow), row stride pbs.
  template <int R, int G>
  static CPUATTN_INLINE void PvRunsTile(const std::uint16_t* CPUATTN_RESTRICT pb, std::int64_t pbs,
                                        const VRun<detail::Bf16>* runs, int nruns, std::int64_t c0,
                                        std::int64_t v_stride, float* CPUATTN_RESTRICT acc_out,
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
      for (std::int64_t t = 0; t < n; t += 2) {
        // An odd run's last key goes with a zero row and a zero probability.
        const bool pair = t + 1 < n;
        __m512bh vv[2 * G];
        CPUATTN_UNROLL(2)
        for (int g = 0; g < G; ++g) {
          const __m512i a = _mm512_loadu_si512(v + t * v_stride + 32 * g);
          const __m512i b =
              pair ? _mm512_loadu_si512(v + (t + 1) * v_stride + 32 * g) : _mm512_setzero_si512();
          vv[2 * g] = (__m512bh)_mm512_unpacklo_epi16(a, b);
          vv[2 * g + 1] = (__m512bh)_mm512_unpackhi_epi16(a, b);
        }
        CPUATTN_UNROLL(8)
        for (int r = 0; r < R; ++r) {
          std::uint32_t w = p[r * pbs + t];
          if (pair) w |= static_cast<std::uint32_t>(p[r * pbs + t + 1]) << 16;
          const auto pw = (__m512bh)_mm512_set1_epi32(static_cast<int>(w));
          CPUATTN_UNROLL(4)
          for (int c = 0; c < 2 * G; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], pw, vv[c]);
        }
      }
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

  // int8 V in decoding steps (streamed blocks) on VNNI. A row's weights for the block, w_j =
  // p_j vscale_j (the scale joined P after the softmax sum), are quantized to int16 wi_j =
  // round(w_j / f), f = max_j |w_j| / 32767, so that P V = f sum_j wi_j v_j runs on vpdpwssd:
  // exact int32 sums of int16 pairs (two keys per lane; V sign-extended to int16 and two rows
  // interleaved as PvRunsTile does with bf16, so the same column order and UnpermuteAcc apply).
  // Error: |w_j - f wi_j| <= f / 2 < 2^-16 max w, so out moves by at most Nk 2^-16 max|v| for
  // a block of Nk keys (the sum over blocks of their largest p is at most l), 2^-9 max|v| at
  // Nk 128 (README). Per two keys and 64 columns at four rows: 4 widening loads, 4 shuffles and
  // 16 vpdpwssd, where the f32 path widens 8 vectors in 16 instructions and runs 32 FMAs.
  // Writes wi for keys [0, n) of row s to w and returns f: 0 when every weight is 0, and NaN
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

  // Acc[R][2G vectors from c0] += f[r] sum over the runs' keys of wi v, in int32 registers over
  // the whole block (|sum| <= Nk 32767 128 < 2^31 for Nk <= 512), converted once at the end.
  template <int R, int G>
  static CPUATTN_INLINE void PvRunsI8Tile(const std::int16_t* CPUATTN_RESTRICT w, std::int64_t ws,
                                          const float* f, const VRun<std::int8_t>* runs, int nruns,
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
      for (std::int64_t t = 0; t < n; t += 2) {
        // An odd run's last key goes with a zero row (its pair's weight is not read).
        const bool pair = t + 1 < n;
        __m512i vv[2 * G];
        CPUATTN_UNROLL(2)
        for (int g = 0; g < G; ++g) {
          const __m512i a = _mm512_cvtepi8_epi16(
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + t * v_stride + 32 * g)));
          const __m512i b =
              pair ? _mm512_cvtepi8_epi16(_mm256_loadu_si256(
                         reinterpret_cast<const __m256i*>(v + (t + 1) * v_stride + 32 * g)))
                   : _mm512_setzero_si512();
          vv[2 * g] = _mm512_unpacklo_epi16(a, b);
          vv[2 * g + 1] = _mm512_unpackhi_epi16(a, b);
        }
        CPUATTN_UNROLL(8)
        for (int r = 0; r < R; ++r) {
          std::uint32_t pw = static_cast<std::uint16_t>(p[r * ws + t]);
          if (pair)
            pw |= static_cast<std::uint32_t>(static_cast<std::uint16_t>(p[r * ws + t + 1])) << 16;
          const __m512i wv = _mm512_set1_epi32(static_cast<int>(pw));
          CPUATTN_UNROLL(4)
          for (int c = 0; c < 2 * G; ++c) acc[r][c] = _mm512_dpwssd_epi32(acc[r][c], wv, vv[c]);
        }
      }
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
  // adds into the accumulators in PvRuns's column order (see UnpermuteAcc).
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

  // The natural column order of rows accumulated by PvRuns (n columns, whole groups of 32).
  static void UnpermuteAcc(float* acc, int rows, std::int64_t stride, std::int64_t n) {
    // Natural column c of a group: lo lane 4 (c / 8) + c % 8 when c % 8 < 4, else hi lane
    // 4 (c / 8) + c % 8 - 4 (index + 16 in vpermt2ps).
    alignas(64) std::int32_t idx[32];
    for (int c = 0; c < 32; ++c) idx[c] = 4 * (c / 8) + c % 4 + (c % 8 < 4 ? 0 : 16);
    const __m512i i0 = _mm512_load_si512(idx), i1 = _mm512_load_si512(idx + 16);
    for (int r = 0; r < rows; ++r)
      for (std::int64_t c = 0; c < n; c += 32) {
        float* a = acc + r * stride + c;
        const __m512 lo = _mm512_load_ps(a), hi = _mm512_load_ps(a + N);
        _mm512_store_ps(a, _mm512_permutex2var_ps(lo, i0, hi));
        _mm512_store_ps(a + N, _mm512_permutex2var_ps(lo, i1, hi));
      }
  }

  static void PvRows(int R, int C, const std::uint32_t* p, std::int64_t p_stride2,
                     const std::uint32_t* vb, std::int64_t cw, std::int64_t nk2, float* acc,
                     std::int64_t acc_stride) {
    static_assert(O::kPvCols == 4 && O::kPvRows <= 6 && O::kScoreRows <= 6);
    switch (C) {
      case 1:
        PvRowsC<1>(R, p, p_stride2, vb, cw, nk2, acc, acc_stride);
        break;
      case 2:
        PvRowsC<2>(R, p, p_stride2, vb, cw, nk2, acc, acc_stride);
        break;
      case 3:
        PvRowsC<3>(R, p, p_stride2, vb, cw, nk2, acc, acc_stride);
        break;
      case 4:
        PvRowsC<4>(R, p, p_stride2, vb, cw, nk2, acc, acc_stride);
        break;
      default:
        break;
    }
  }
};

#endif  // __AVX512BF16__

CPUATTN_NAMESPACE_END

#endif  // CPUATTN_KERNELS_FLASH_BF16_INL_H_
