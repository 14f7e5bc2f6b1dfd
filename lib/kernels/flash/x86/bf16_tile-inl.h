// The native bf16 units of tiled blocks, for CPUs with AVX512-BF16 (QUnit::bf16,
// KvUnit::packed_bf16, ScoreUnit::tile_bf16, PvUnit::tile_bf16): vdpbf16ps multiplies pairs of
// bf16 and adds both products to an f32 lane, twice the multiply-adds of an f32 FMA per
// instruction. Compiled only in the avx512_bf16 unit (flash_bf16.cc).
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
// adds the rounding of P to bf16, |dp| <= 2^-8 p, so |d out| <= 2^-8 max |v| (docs/precision.md).
#if defined(CPUATTN_KERNELS_FLASH_X86_BF16_TILE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef CPUATTN_KERNELS_FLASH_X86_BF16_TILE_INL_H_
#undef CPUATTN_KERNELS_FLASH_X86_BF16_TILE_INL_H_
#else
#define CPUATTN_KERNELS_FLASH_X86_BF16_TILE_INL_H_
#endif

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "core/inline.h"
#include "core/problem.h"
#include "kernels/common/mask-inl.h"
#include "kernels/flash/geometry-inl.h"
#include "kernels/flash/softmax-inl.h"
#include "simd/math-inl.h"
#include "simd/target_namespace.h"
#include "simd/x86/x86-inl.h"

CPUATTN_NAMESPACE_BEGIN

#if defined(__AVX512BF16__)

template <class O>
struct Bf16Tile {
  static_assert(O::kLanes == 16, "the native bf16 units are AVX-512 only");
  static constexpr int N = 16;
  static constexpr int W = Geometry<O>::W;
  static constexpr int CW = Geometry<O>::CW;

  static std::int64_t Pairs(std::int64_t n) { return (n + 1) / 2; }

  // Qb rows: a copy of the stored bf16 rows, zero-padded to qs2 pairs.
  static void PackQ(const detail::Problem& p, std::int64_t b, std::int64_t h0, std::int64_t nh,
                    std::int64_t pos0, int rows, std::int64_t qs2,
                    std::uint16_t* CPUATTN_RESTRICT qb) {
    detail::ForQueryRows(pos0, h0, nh, 0, rows,
                         [&](std::int64_t r, std::int64_t i, std::int64_t h) {
                           const std::uint16_t* src = static_cast<const std::uint16_t*>(p.q.data) +
                                                      b * p.q.s[0] + h * p.q.s[1] + i * p.q.s[2];
                           std::uint16_t* dst = qb + r * qs2 * 2;
                           std::memcpy(dst, src, static_cast<std::size_t>(p.D) * 2);
                           std::fill(dst + p.D, dst + qs2 * 2, std::uint16_t{0});
                         });
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

  // acc = Qb rows . the first C vectors of keys of a Kb panel (W keys per pair of dims), R rows.
  template <int R, int C = W / N>
  static CPUATTN_ALWAYS_INLINE void Dots(const std::uint32_t* CPUATTN_RESTRICT q, std::int64_t qs2,
                                         std::int64_t dp2, const std::uint32_t* CPUATTN_RESTRICT kb,
                                         __m512 (&acc)[R][C]) {
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
  }

  // Scores of R rows x C vectors of keys: S = qscale * (Qb . Kb panel's first C vectors), masked
  // in the epilogue.
  template <int R, int C, bool kMasked>
  static CPUATTN_ALWAYS_INLINE void ScoreTile(const std::uint32_t* CPUATTN_RESTRICT q,
                                              std::int64_t qs2, std::int64_t dp2,
                                              const std::uint32_t* CPUATTN_RESTRICT kb,
                                              float qscale, float* CPUATTN_RESTRICT s,
                                              std::int64_t s_stride, std::int32_t col0,
                                              const RowMask* rows, const MaskInfo& mi) {
    __m512 acc[R][C];
    Dots<R, C>(q, qs2, dp2, kb, acc);
    const __m512 vs = _mm512_set1_ps(qscale);
    typename O::V x[R][C];
    CPUATTN_UNROLL(16)
    for (int r = 0; r < R; ++r) {
      CPUATTN_UNROLL(4)
      for (int c = 0; c < C; ++c) x[r][c] = O::FromRaw(_mm512_mul_ps(acc[r][c], vs));
    }
    ScoreEpilogue<O, R, C, kMasked>(x, s, s_stride, col0, rows, mi);
  }

  // A masked tile computes only the vectors its rows see, as ScoreRowsLive (score_tile-inl.h).
  static void ScoreRowsLive(int R, const std::uint32_t* q, std::int64_t qs2, std::int64_t dp2,
                            const std::uint32_t* kb, float qscale, float* s, std::int64_t s_stride,
                            std::int32_t col0, const RowMask* rows, const MaskInfo& mi) {
    constexpr int C = W / N;
    const LiveVectors live = LiveVectorsOf<O, C>(R, rows, col0);
    StoreDeadVectors<O, C>(R, live, s, s_stride);
    detail::WithCount<O::kScoreRows>(R, [&](auto r_tag) {
      detail::WithCount<C>(live.hi - live.lo, [&](auto c_tag) {
        ScoreTile<r_tag(), c_tag(), true>(q, qs2, dp2, kb + live.lo * N, qscale, s + live.lo * N,
                                          s_stride, col0 + live.lo * N, rows, mi);
      });
    });
  }

  template <bool kMasked>
  static void ScoreRows(int R, const std::uint32_t* q, std::int64_t qs2, std::int64_t dp2,
                        const std::uint32_t* kb, float qscale, float* s, std::int64_t s_stride,
                        std::int32_t col0, const RowMask* rows, const MaskInfo& mi) {
    if constexpr (kMasked) {
      ScoreRowsLive(R, q, qs2, dp2, kb, qscale, s, s_stride, col0, rows, mi);
      return;
    }
    switch (R) {
#define CPUATTN_BF16_SCORE_CASE(n)                                                        \
  case n:                                                                                 \
    if constexpr (n <= O::kScoreRows)                                                     \
      ScoreTile<n, W / N, kMasked>(q, qs2, dp2, kb, qscale, s, s_stride, col0, rows, mi); \
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

  // The softmax's probabilities of columns [c, c + 32) rounded to bf16 into a Pb row
  // (OnlineSoftmaxRow's put): the f32 values never return to S.
  struct PutRounded {
    std::uint16_t* pb;
    static CPUATTN_ALWAYS_INLINE typename O::V Exp(typename O::V x) { return Exp2Bf16<O>(x); }
    CPUATTN_ALWAYS_INLINE void operator()(std::int64_t c, typename O::V p0,
                                          typename O::V p1) const {
      const __m512bh h = _mm512_cvtne2ps_pbh(O::ToRaw(p1), O::ToRaw(p0));
      _mm512_storeu_si512(pb + c, (__m512i)h);
    }
  };

  // Where a probability tile's raw dot products come from: Dots over Qb rows and a Kb panel, or
  // (SavedDots) S rows that hold them already (the AMX tiles', x86/amx_tile-inl.h).
  struct PanelDots {
    const std::uint32_t* q;
    std::int64_t qs2, dp2;
    const std::uint32_t* kb;
    template <int R, int C>
    CPUATTN_ALWAYS_INLINE void Load(__m512 (&acc)[R][C]) const {
      Dots<R, C>(q, qs2, dp2, kb, acc);
    }
  };
  struct SavedDots {
    const float* s;
    std::int64_t s_stride;
    template <int R, int C>
    CPUATTN_ALWAYS_INLINE void Load(__m512 (&acc)[R][C]) const {
      CPUATTN_UNROLL(16)
      for (int r = 0; r < R; ++r) {
        CPUATTN_UNROLL(4)
        for (int c = 0; c < C; ++c) acc[r][c] = _mm512_load_ps(s + r * s_stride + c * N);
      }
    }
  };

  // ProbBlock's tile: R rows x W keys of probabilities 2^(s - m[r]) rounded to bf16 into Pb rows
  // and summed into lsum rows (one vector each), straight from the accumulators. The lanes with a
  // score above m[r] + kLazyMaxSlack or NaN are or-ed into `refused`, which ProbBlockFrom checks
  // after the block's last tile (as ProbBlockTiles' `seen`, score_tile-inl.h). With kFirst (the
  // block's first panel, rows that have seen no key) m[r] is set, to the largest of the row's
  // scores here; false where that is not finite or a score is NaN.
  template <int R, bool kFirst, class Src>
  static CPUATTN_ALWAYS_INLINE bool ProbTile(const Src& src, float qscale, float* m,
                                             std::uint16_t* CPUATTN_RESTRICT pb,
                                             std::int64_t pb_stride, float* CPUATTN_RESTRICT lsum,
                                             std::int64_t lsum_stride, __mmask16& refused) {
    constexpr int C = W / N;
    static_assert(C % 2 == 0, "probabilities are rounded two vectors at a time");
    __m512 acc[R][C];
    src.template Load<R, C>(acc);
    const __m512 vs = _mm512_set1_ps(qscale);
    if constexpr (kFirst) {
      // The max drops NaN lanes, so they are looked for apart.
      float mr[R];
      __mmask16 nan = 0;
      CPUATTN_UNROLL(16)
      for (int r = 0; r < R; ++r) {
        CPUATTN_UNROLL(4)
        for (int c = 0; c < C; ++c) {
          acc[r][c] = _mm512_mul_ps(acc[r][c], vs);
          nan |= _mm512_cmp_ps_mask(acc[r][c], acc[r][c], _CMP_UNORD_Q);
        }
        __m512 mx = acc[r][0];
        CPUATTN_UNROLL(4)
        for (int c = 1; c < C; ++c) mx = _mm512_max_ps(mx, acc[r][c]);
        mr[r] = _mm512_reduce_max_ps(mx);
      }
      if (nan != 0) return false;
      CPUATTN_UNROLL(16)
      for (int r = 0; r < R; ++r)
        if (!std::isfinite(mr[r])) return false;
      CPUATTN_UNROLL(16)
      for (int r = 0; r < R; ++r) {
        m[r] = mr[r];
        const __m512 vm = _mm512_set1_ps(mr[r]);
        CPUATTN_UNROLL(4)
        for (int c = 0; c < C; ++c) acc[r][c] = _mm512_sub_ps(acc[r][c], vm);
      }
    } else {
      // s - m in one rounding: qscale * dot - m.
      const __m512 lim = _mm512_set1_ps(kLazyMaxSlack);
      __mmask16 over = 0;
      CPUATTN_UNROLL(16)
      for (int r = 0; r < R; ++r) {
        const __m512 vm = _mm512_set1_ps(m[r]);
        CPUATTN_UNROLL(4)
        for (int c = 0; c < C; ++c) {
          acc[r][c] = _mm512_fmsub_ps(acc[r][c], vs, vm);
          over |= _mm512_cmp_ps_mask(acc[r][c], lim, _CMP_NLE_UQ);
        }
      }
      refused |= over;
    }
    CPUATTN_UNROLL(16)
    for (int r = 0; r < R; ++r) {
      typename O::V sum = O::Load(lsum + r * lsum_stride);
      CPUATTN_UNROLL(4)
      for (int c = 0; c < C; c += 2) {
        const typename O::V e0 = Exp2Bf16<O>(O::FromRaw(acc[r][c]));
        const typename O::V e1 = Exp2Bf16<O>(O::FromRaw(acc[r][c + 1]));
        PutRounded{pb + r * pb_stride}(c * N, e0, e1);
        sum = O::Add(sum, O::Add(e0, e1));
      }
      O::Store(sum, lsum + r * lsum_stride);
    }
    return true;
  }

  template <bool kFirst, class Src>
  static bool ProbRows(int R, const Src& src, float qscale, float* m, std::uint16_t* pb,
                       std::int64_t pb_stride, float* lsum, std::int64_t lsum_stride,
                       __mmask16& refused) {
    switch (R) {
#define CPUATTN_BF16_PROB_CASE(n)                                                            \
  case n:                                                                                    \
    if constexpr (n <= O::kScoreRows)                                                        \
      return ProbTile<n, kFirst>(src, qscale, m, pb, pb_stride, lsum, lsum_stride, refused); \
    break;
      CPUATTN_BF16_PROB_CASE(1)
      CPUATTN_BF16_PROB_CASE(2)
      CPUATTN_BF16_PROB_CASE(3)
      CPUATTN_BF16_PROB_CASE(4)
      CPUATTN_BF16_PROB_CASE(5)
      CPUATTN_BF16_PROB_CASE(6)
#undef CPUATTN_BF16_PROB_CASE
      default:
        break;
    }
    return false;
  }

  // Scores and softmax of a block in one pass (lazy rescaling), for a block that no row needs
  // masked or transformed: each tile turns its scores into bf16 probabilities Pb (the first
  // ncols columns, whole panels) while they are in registers, and adds their sums into lsum rows.
  // Scores, their max, their exponentials and their rounding no longer cross memory between
  // passes. Rows that have each seen a block keep their max m; with `first` (rows that have seen
  // no key) the first panel's tiles set it, as ProbBlockTiles (score_tile-inl.h) does. False if a
  // score is above m + kLazyMaxSlack or NaN (known after the last tile) or, with `first`, as soon
  // as a first panel's largest score is not finite or one of its scores NaN: the block then takes
  // the two passes, which overwrite what was written (with `first`, m is -inf again). between()
  // runs after each tile (ProbBlockTiles).
  template <class Between>
  static bool ProbBlock(int rows, const std::uint32_t* qb, std::int64_t qs2, std::int64_t dp2,
                        const std::uint32_t* kb, std::int64_t ncols, float qscale, float* m,
                        bool first, std::uint16_t* pb, std::int64_t pb_stride, float* lsum,
                        std::int64_t lsum_stride, const Between& between) {
    return ProbBlockFrom(
        rows,
        [&](int r0, std::int64_t c0) {
          return PanelDots{qb + r0 * qs2, qs2, dp2, kb + (c0 / W) * dp2 * W};
        },
        ncols, qscale, m, first, pb, pb_stride, lsum, lsum_stride, between);
  }

  // ProbBlock with the tiles' raw dot products src_at(r0, c0) (rows from r0, keys from c0): a
  // PanelDots or a SavedDots.
  template <class SrcAt, class Between>
  static bool ProbBlockFrom(int rows, const SrcAt& src_at, std::int64_t ncols, float qscale,
                            float* m, bool first, std::uint16_t* pb, std::int64_t pb_stride,
                            float* lsum, std::int64_t lsum_stride, const Between& between) {
    for (int r = 0; r < rows; ++r) O::Store(O::Zero(), lsum + r * lsum_stride);
    __mmask16 refused = 0;
    return LazyPanels<W, O::kScoreRows>(
        rows, ncols, first, m,
        [&](int r0, int R, std::int64_t c0, auto first_panel) {
          return ProbRows<decltype(first_panel)::value>(
              R, src_at(r0, c0), qscale, m + r0, pb + r0 * pb_stride + c0, pb_stride,
              lsum + r0 * lsum_stride, lsum_stride, refused);
        },
        [&] { return refused == 0; }, between);
  }

  // Pb row = S row rounded to bf16 (ncols is whole panels, so whole 32-value steps).
  static CPUATTN_ALWAYS_INLINE void RoundRow(const float* CPUATTN_RESTRICT s, std::int64_t ncols,
                                             std::uint16_t* CPUATTN_RESTRICT pb) {
    for (std::int64_t c = 0; c < ncols; c += 2 * N) {
      const __m512bh h = _mm512_cvtne2ps_pbh(_mm512_load_ps(s + c + N), _mm512_load_ps(s + c));
      _mm512_storeu_si512(pb + c, (__m512i)h);
    }
  }

  // Acc[R][0:C vectors] += Pb[R][keys] . Vb chunk, over nk2 key pairs.
  template <int R, int C>
  static CPUATTN_ALWAYS_INLINE void PvTile(const std::uint32_t* CPUATTN_RESTRICT p,
                                           std::int64_t p_stride2,
                                           const std::uint32_t* CPUATTN_RESTRICT vb,
                                           std::int64_t cw, std::int64_t nk2,
                                           float* CPUATTN_RESTRICT acc_out,
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

  // ScoreUnit::tile_bf16: scores of a block's rows (Qb rows of qs2 pairs) against the Kb panels
  // of its first ncols keys (whole panels), times qscale, into S rows of s_stride; columns
  // [clean_lo, clean_hi) need no per-element mask; between() after each tile (as ScoreBlockTiles).
  template <class Between>
  static void ScoreBlock(int rows, const std::uint32_t* qb, std::int64_t qs2, std::int64_t dp2,
                         const std::uint32_t* kb, std::int64_t ncols, std::int64_t clean_lo,
                         std::int64_t clean_hi, float qscale, float* s, std::int64_t s_stride,
                         const RowMask* rm, const MaskInfo& mi, const Between& between) {
    for (std::int64_t c0 = 0; c0 < ncols; c0 += W) {
      const std::uint32_t* panel = kb + (c0 / W) * dp2 * W;
      const bool masked = c0 < clean_lo || c0 + W > clean_hi;
      const auto col0 = static_cast<std::int32_t>(c0);
      for (int r0 = 0; r0 < rows; r0 += O::kScoreRows) {
        const int R = std::min(O::kScoreRows, rows - r0);
        float* srow = s + r0 * s_stride + c0;
        if (masked) {
          ScoreRows<true>(R, qb + r0 * qs2, qs2, dp2, panel, qscale, srow, s_stride, col0, rm + r0,
                          mi);
        } else {
          ScoreRows<false>(R, qb + r0 * qs2, qs2, dp2, panel, qscale, srow, s_stride, col0, rm + r0,
                           mi);
        }
        between();
      }
    }
  }

  // PvUnit::tile_bf16: Acc rows += Pb rows (the block's probabilities as the softmax rounded
  // them, PutRounded; pb_stride apart) . Vb chunks of a block of nk keys, the first nk_live seen.
  // between() runs after each tile (PvBlockTiles).
  template <class Between>
  static void PvBlock(int rows, const std::uint16_t* pb, std::int64_t pb_stride,
                      const std::uint32_t* vb, std::int64_t nk, std::int64_t nk_live, float* acc,
                      std::int64_t dvp, const Between& between) {
    const std::int64_t nk2 = Pairs(nk), live2 = Pairs(nk_live);
    for (std::int64_t c0 = 0; c0 < dvp; c0 += CW) {
      const std::int64_t cw = std::min<std::int64_t>(CW, dvp - c0);
      const std::uint32_t* vchunk = vb + c0 * nk2;
      for (int r0 = 0; r0 < rows; r0 += O::kPvRows) {
        const int R = std::min(O::kPvRows, rows - r0);
        PvRows(R, static_cast<int>(cw / N),
               reinterpret_cast<const std::uint32_t*>(pb + r0 * pb_stride), pb_stride / 2, vchunk,
               cw, live2, acc + r0 * dvp + c0, dvp);
        between();
      }
    }
  }
};

#endif  // __AVX512BF16__

CPUATTN_NAMESPACE_END

#endif  // CPUATTN_KERNELS_FLASH_X86_BF16_TILE_INL_H_
