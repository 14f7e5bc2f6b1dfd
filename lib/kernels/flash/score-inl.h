// The score micro-kernel of the tiled path: a tile of Qp rows against one packed K panel, masked
// in its epilogue; and the dispatch from a run-time row count to the unrolled tile.
#if defined(CPUATTN_KERNELS_FLASH_SCORE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef CPUATTN_KERNELS_FLASH_SCORE_INL_H_
#undef CPUATTN_KERNELS_FLASH_SCORE_INL_H_
#else
#define CPUATTN_KERNELS_FLASH_SCORE_INL_H_
#endif

#include <cstdint>

#include "kernels/common/mask-inl.h"
#include "kernels/common/outer-inl.h"
#include "simd/target_namespace.h"

CPUATTN_NAMESPACE_BEGIN

// Scores of R rows x W = C vectors of keys (C = O::kScoreCols): S[r][0:W] = Qp[r] . Kp panel.
// R * C accumulators stay in registers for the whole D loop; each d costs C loads, R broadcasts
// and R * C FMAs.
template <class O, int R, bool kMasked>
CPUATTN_INLINE void ScoreTile(const float* CPUATTN_RESTRICT q, std::int64_t qs, std::int64_t D,
                              const float* CPUATTN_RESTRICT kp, float* CPUATTN_RESTRICT s,
                              std::int64_t s_stride, std::int32_t col0, const RowMask* rows,
                              const MaskInfo& mi) {
  using V = typename O::V;
  constexpr int N = O::kLanes, C = O::kScoreCols;
  V acc[R][C];
  CPUATTN_UNROLL(16)
  for (int r = 0; r < R; ++r) {
    CPUATTN_UNROLL(4)
    for (int c = 0; c < C; ++c) acc[r][c] = O::Zero();
  }
  AccumulateOuter<O, R, C>(q, 1, qs, kp, C * N, D, acc);
  // The epilogue reads local copies of the mask state (CopyRowMasks): read in place, they cost the
  // soft-cap epilogue about twice its own operations.
  const MaskInfo m = mi;
  RowMask rm[R] = {};
  CopyRowMasks<R>(rows, kMasked || m.transforms(), rm);
  if (m.transforms()) TransformTile<O, R, C>(acc, col0, rm, m);
  CPUATTN_UNROLL(16)
  for (int r = 0; r < R; ++r) {
    CPUATTN_UNROLL(4)
    for (int c = 0; c < C; ++c) {
      if constexpr (kMasked) acc[r][c] = ApplyRowMask<O>(acc[r][c], col0 + c * N, rm[r], m);
      O::Store(acc[r][c], s + r * s_stride + c * N);
    }
  }
}

template <class O, bool kMasked>
void ScoreRows(int R, const float* q, std::int64_t qs, std::int64_t D, const float* kp, float* s,
               std::int64_t s_stride, std::int32_t col0, const RowMask* rows, const MaskInfo& mi) {
  static_assert(O::kScoreRows <= 12, "extend the switch below");
  switch (R) {
#define CPUATTN_SCORE_CASE(n)                                              \
  case n:                                                                  \
    if constexpr (n <= O::kScoreRows)                                      \
      ScoreTile<O, n, kMasked>(q, qs, D, kp, s, s_stride, col0, rows, mi); \
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

CPUATTN_NAMESPACE_END

#endif  // CPUATTN_KERNELS_FLASH_SCORE_INL_H_
