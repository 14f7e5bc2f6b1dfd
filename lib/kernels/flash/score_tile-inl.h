// The score unit of the f32 tiled path (ScoreUnit::tile_f32): tiles of Qp rows against packed K
// panels, masked in the epilogue (kernels/common/mask-inl.h, StoreScores); the dispatch from a
// run-time row count to the unrolled tile; and a whole block's scores.
#if defined(CPUATTN_KERNELS_FLASH_SCORE_TILE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef CPUATTN_KERNELS_FLASH_SCORE_TILE_INL_H_
#undef CPUATTN_KERNELS_FLASH_SCORE_TILE_INL_H_
#else
#define CPUATTN_KERNELS_FLASH_SCORE_TILE_INL_H_
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "core/inline.h"
#include "kernels/common/mask-inl.h"
#include "kernels/common/outer-inl.h"
#include "kernels/flash/softmax-inl.h"
#include "simd/math-inl.h"
#include "simd/target_namespace.h"

CPUATTN_NAMESPACE_BEGIN

// acc = Qp rows . the first C vectors of each d of a Kp panel (kp_w floats per d; C =
// O::kScoreCols for a whole panel), each row's sum started at init[r] (0 without init).
template <class O, int R, int C = O::kScoreCols>
CPUATTN_ALWAYS_INLINE void TileDots(const float* CPUATTN_RESTRICT q, std::int64_t qs,
                                    std::int64_t D, const float* CPUATTN_RESTRICT kp,
                                    typename O::V (&acc)[R][C], const typename O::V* init = nullptr,
                                    std::int64_t kp_w = O::kScoreCols * O::kLanes) {
  CPUATTN_UNROLL(16)
  for (int r = 0; r < R; ++r) {
    CPUATTN_UNROLL(4)
    for (int c = 0; c < C; ++c) acc[r][c] = init != nullptr ? init[r] : O::Zero();
  }
  AccumulateOuter<O, R, C>(q, 1, qs, kp, kp_w, D, acc);
}

// Scores of R rows x C vectors of keys: S[r][0:C vectors] = Qp[r] . Kp panel's first C vectors
// (kp_w floats per d). R * C accumulators stay in registers for the whole D loop; each d costs
// C loads, R broadcasts and R * C FMAs.
template <class O, int R, int C, bool kMasked>
CPUATTN_ALWAYS_INLINE void ScoreTile(const float* CPUATTN_RESTRICT q, std::int64_t qs,
                                     std::int64_t D, const float* CPUATTN_RESTRICT kp,
                                     std::int64_t kp_w, float* CPUATTN_RESTRICT s,
                                     std::int64_t s_stride, std::int32_t col0, const RowMask* rows,
                                     const MaskInfo& mi) {
  typename O::V acc[R][C];
  TileDots<O, R, C>(q, qs, D, kp, acc, nullptr, kp_w);
  ScoreEpilogue<O, R, C, kMasked>(acc, s, s_stride, col0, rows, mi);
}

// A masked tile of R rows x one panel (C = O::kScoreCols vectors of keys): only its live vectors
// (LiveVectorsOf) are computed, and the others hold -inf, as its epilogue would have made them:
// the scores are the same, bit for bit.
template <class O>
void ScoreRowsLive(int R, const float* q, std::int64_t qs, std::int64_t D, const float* kp,
                   float* s, std::int64_t s_stride, std::int32_t col0, const RowMask* rows,
                   const MaskInfo& mi) {
  constexpr int N = O::kLanes, C = O::kScoreCols;
  const LiveVectors live = LiveVectorsOf<O, C>(R, rows, col0);
  StoreDeadVectors<O, C>(R, live, s, s_stride);
  detail::WithCount<O::kScoreRows>(R, [&](auto r_tag) {
    detail::WithCount<C>(live.hi - live.lo, [&](auto c_tag) {
      ScoreTile<O, r_tag(), c_tag(), true>(q, qs, D, kp + live.lo * N, C * N, s + live.lo * N,
                                           s_stride, col0 + live.lo * N, rows, mi);
    });
  });
}

// A tile of R rows x one panel; masked tiles as ScoreRowsLive. Clean tiles keep the switch
// (docs/performance.md#dm-score-live-vectors: through WithCount they ran slower on AVX2).
template <class O, bool kMasked>
void ScoreRows(int R, const float* q, std::int64_t qs, std::int64_t D, const float* kp, float* s,
               std::int64_t s_stride, std::int32_t col0, const RowMask* rows, const MaskInfo& mi) {
  static_assert(O::kScoreRows <= 12, "extend the switch below");
  constexpr int W = O::kScoreCols * O::kLanes;
  if constexpr (kMasked) {
    ScoreRowsLive<O>(R, q, qs, D, kp, s, s_stride, col0, rows, mi);
  } else {
    switch (R) {
#define CPUATTN_SCORE_CASE(n)                                                              \
  case n:                                                                                  \
    if constexpr (n <= O::kScoreRows)                                                      \
      ScoreTile<O, n, O::kScoreCols, false>(q, qs, D, kp, W, s, s_stride, col0, rows, mi); \
    break;
      CPUATTN_SCORE_CASE(1)
      CPUATTN_SCORE_CASE(2)
      CPUATTN_SCORE_CASE(3)
      CPUATTN_SCORE_CASE(4)
      CPUATTN_SCORE_CASE(5)
      CPUATTN_SCORE_CASE(6)
      CPUATTN_SCORE_CASE(7)
      CPUATTN_SCORE_CASE(8)
      CPUATTN_SCORE_CASE(9)
      CPUATTN_SCORE_CASE(10)
      CPUATTN_SCORE_CASE(11)
      CPUATTN_SCORE_CASE(12)
#undef CPUATTN_SCORE_CASE
      default:
        break;
    }
  }
}

// Scores of a block's `rows` Qp rows (stride qs) against the packed K panels of its first ncols
// keys (whole panels), into S rows of s_stride: columns [clean_lo, clean_hi) of the block need
// no per-element mask for any row, the others take the row masks rm[r]. between() runs after each
// tile (the driver's prefetch of the next task's inputs, a few lines at a time).
template <class O, class Between>
void ScoreBlockTiles(int rows, const float* qp, std::int64_t qs, std::int64_t D, const float* kp,
                     std::int64_t ncols, std::int64_t clean_lo, std::int64_t clean_hi, float* s,
                     std::int64_t s_stride, const RowMask* rm, const MaskInfo& mi,
                     const Between& between) {
  constexpr int W = O::kScoreCols * O::kLanes;
  for (std::int64_t c0 = 0; c0 < ncols; c0 += W) {
    const float* panel = kp + (c0 / W) * D * W;
    const bool masked = c0 < clean_lo || c0 + W > clean_hi;
    const auto col0 = static_cast<std::int32_t>(c0);
    for (int r0 = 0; r0 < rows; r0 += O::kScoreRows) {
      const int R = std::min(O::kScoreRows, rows - r0);
      if (masked) {
        ScoreRows<O, true>(R, qp + r0 * qs, qs, D, panel, s + r0 * s_stride + c0, s_stride, col0,
                           rm + r0, mi);
      } else {
        ScoreRows<O, false>(R, qp + r0 * qs, qs, D, panel, s + r0 * s_stride + c0, s_stride, col0,
                            rm + r0, mi);
      }
      between();
    }
  }
}

// 2^acc[r][c] into S rows, and their sums added into lsum rows (one vector each): the epilogue
// of a one-pass tile, whose accumulators already hold s - m.
template <class O, int R>
CPUATTN_ALWAYS_INLINE void StoreProbs(const typename O::V (&acc)[R][O::kScoreCols],
                                      float* CPUATTN_RESTRICT s, std::int64_t s_stride,
                                      float* CPUATTN_RESTRICT lsum, std::int64_t lsum_stride) {
  using V = typename O::V;
  constexpr int C = O::kScoreCols, N = O::kLanes;
  CPUATTN_UNROLL(16)
  for (int r = 0; r < R; ++r) {
    V sum = O::Load(lsum + r * lsum_stride);
    CPUATTN_UNROLL(4)
    for (int c = 0; c < C; ++c) {
      const V e = Exp2<O>(acc[r][c]);
      O::Store(e, s + r * s_stride + c * N);
      sum = O::Add(sum, e);
    }
    O::Store(sum, lsum + r * lsum_stride);
  }
}

// The lane-wise max of n[0, kN) as a balanced tree, ceil(log2 kN) max latencies deep: a chain over
// a tile's accumulators (24 on AVX-512) held the tile's epilogue back on Intel's cores, with the
// same operations (docs/performance.md#dm-tile-max-tree).
template <class O, int kN>
CPUATTN_ALWAYS_INLINE typename O::V MaxTree(const typename O::V* n) {
  if constexpr (kN == 1) {
    return n[0];
  } else {
    return O::Max(MaxTree<O, kN / 2>(n), MaxTree<O, kN - kN / 2>(n + kN / 2));
  }
}

// ProbBlockTiles' tile: R rows x W keys of probabilities 2^(s - m[r]) into S rows, and their sums
// into lsum rows, from the accumulators. The largest s - m of the tile goes into `seen` (one
// vector, the lane-wise max over the block's tiles so far), which ProbBlockTiles checks against
// kLazyMaxSlack after the block's last tile: a branch here on the tile's own max held the tile's
// epilogue until the max was reduced (docs/performance.md#dm-lazy-check-deferred). With kFirst
// (the block's first panel, rows that have seen no key yet) m[r] is not read but set, to the
// largest of the row's scores here; false, with m unchanged, where that is not finite. A NaN
// score passes as NaN probabilities, which the driver's check of Acc (AccFinite) sends through
// the exact rerun.
template <class O, int R, bool kFirst>
CPUATTN_ALWAYS_INLINE bool ProbTile(const float* CPUATTN_RESTRICT q, std::int64_t qs,
                                    std::int64_t D, const float* CPUATTN_RESTRICT kp, float* m,
                                    float* CPUATTN_RESTRICT s, std::int64_t s_stride,
                                    float* CPUATTN_RESTRICT lsum, std::int64_t lsum_stride,
                                    float* CPUATTN_RESTRICT seen) {
  using V = typename O::V;
  constexpr int C = O::kScoreCols;
  V acc[R][C];
  if constexpr (kFirst) {
    TileDots<O, R>(q, qs, D, kp, acc);
    float mr[R];
    CPUATTN_UNROLL(16)
    for (int r = 0; r < R; ++r) {
      V mx = acc[r][0];
      CPUATTN_UNROLL(4)
      for (int c = 1; c < C; ++c) mx = O::Max(mx, acc[r][c]);
      mr[r] = O::ReduceMax(mx);
      if (!std::isfinite(mr[r])) return false;
    }
    CPUATTN_UNROLL(16)
    for (int r = 0; r < R; ++r) {
      m[r] = mr[r];
      const V vm = O::Set(mr[r]);
      CPUATTN_UNROLL(4)
      for (int c = 0; c < C; ++c) acc[r][c] = O::Sub(acc[r][c], vm);
    }
  } else {
    // The dot products start at -m[r], so the accumulators end as s - m, which both passes below
    // read without a subtraction each.
    V neg_m[R];
    CPUATTN_UNROLL(16)
    for (int r = 0; r < R; ++r) neg_m[r] = O::Set(-m[r]);
    TileDots<O, R>(q, qs, D, kp, acc, neg_m);
    O::Store(O::Max(O::Load(seen), MaxTree<O, R * C>(&acc[0][0])), seen);
  }
  StoreProbs<O, R>(acc, s, s_stride, lsum, lsum_stride);
  return true;
}

template <class O, bool kFirst>
bool ProbRows(int R, const float* q, std::int64_t qs, std::int64_t D, const float* kp, float* m,
              float* s, std::int64_t s_stride, float* lsum, std::int64_t lsum_stride, float* seen) {
  switch (R) {
#define CPUATTN_PROB_CASE(n)                                                                \
  case n:                                                                                   \
    if constexpr (n <= O::kScoreRows)                                                       \
      return ProbTile<O, n, kFirst>(q, qs, D, kp, m, s, s_stride, lsum, lsum_stride, seen); \
    break;
    CPUATTN_PROB_CASE(1)
    CPUATTN_PROB_CASE(2)
    CPUATTN_PROB_CASE(3)
    CPUATTN_PROB_CASE(4)
    CPUATTN_PROB_CASE(5)
    CPUATTN_PROB_CASE(6)
    CPUATTN_PROB_CASE(7)
    CPUATTN_PROB_CASE(8)
    CPUATTN_PROB_CASE(9)
    CPUATTN_PROB_CASE(10)
    CPUATTN_PROB_CASE(11)
    CPUATTN_PROB_CASE(12)
#undef CPUATTN_PROB_CASE
    default:
      break;
  }
  return false;
}

// Scores and softmax of a block in one pass (lazy rescaling), for a block that no row needs masked
// or transformed: each tile writes its probabilities 2^(s - m) to S (the first ncols columns,
// whole panels) while the scores are in registers, and adds their sums into lsum rows (zeroed
// here); the max pass and the exp2 pass over S are gone. Rows that have each seen a block keep
// their max m; with `first` (rows that have seen no key: a short sequence's only block) the first
// panel's tiles set m to the largest score of the row's first panel, and the later panels are
// weighed against it. False if a score is above m + kLazyMaxSlack (known after the last tile) or,
// with `first`, as soon as a first panel's largest score is not finite: the block then takes the
// two passes, which overwrite S and lsum (with `first`, m is -inf again). between() as in
// ScoreBlockTiles.
template <class O, class Between>
bool ProbBlockTiles(int rows, const float* qp, std::int64_t qs, std::int64_t D, const float* kp,
                    std::int64_t ncols, float* m, bool first, float* s, std::int64_t s_stride,
                    float* lsum, std::int64_t lsum_stride, const Between& between) {
  constexpr int W = O::kScoreCols * O::kLanes;
  for (int r = 0; r < rows; ++r) O::Store(O::Zero(), lsum + r * lsum_stride);
  alignas(64) float seen[O::kLanes];
  O::Store(O::Set(-std::numeric_limits<float>::infinity()), seen);
  return LazyPanels<W, O::kScoreRows>(
      rows, ncols, first, m,
      [&](int r0, int R, std::int64_t c0, auto first_panel) {
        return ProbRows<O, decltype(first_panel)::value>(
            R, qp + r0 * qs, qs, D, kp + (c0 / W) * D * W, m + r0, s + r0 * s_stride + c0, s_stride,
            lsum + r0 * lsum_stride, lsum_stride, seen);
      },
      [&] { return !(O::ReduceMax(O::Load(seen)) > kLazyMaxSlack); }, between);
}

CPUATTN_NAMESPACE_END

#endif  // CPUATTN_KERNELS_FLASH_SCORE_TILE_INL_H_
