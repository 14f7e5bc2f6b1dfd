// The P V micro-kernel: probabilities of a tile of rows times one column chunk of V, accumulated
// into the rows' unnormalized output.
#if defined(CPUATTN_KERNELS_FLASH_PV_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef CPUATTN_KERNELS_FLASH_PV_INL_H_
#undef CPUATTN_KERNELS_FLASH_PV_INL_H_
#else
#define CPUATTN_KERNELS_FLASH_PV_INL_H_
#endif

#include <cstdint>

#include "kernels/common/outer-inl.h"
#include "simd/target_namespace.h"

CPUATTN_NAMESPACE_BEGIN

// Acc[R][0:C vectors] += P[R][0:nk] . Vp chunk [nk][CW]. R * C accumulators in registers; each key
// costs C loads, R broadcasts and R*C FMAs.
// V is f32 (packed, or in place) or, in place for decode, a reduced-precision TV widened as it is
// loaded.
template <class O, int R, int C, class TV = float>
CPUATTN_INLINE void PvTile(const float* CPUATTN_RESTRICT p, std::int64_t p_stride,
                           const TV* CPUATTN_RESTRICT vp, std::int64_t cw, std::int64_t nk,
                           float* CPUATTN_RESTRICT acc_out, std::int64_t acc_stride) {
  using V = typename O::V;
  constexpr int N = O::kLanes;
  V acc[R][C];
  CPUATTN_UNROLL(16)
  for (int r = 0; r < R; ++r) {
    CPUATTN_UNROLL(16)
    for (int c = 0; c < C; ++c) acc[r][c] = O::Load(acc_out + r * acc_stride + c * N);
  }
  AccumulateOuter<O, R, C, TV>(p, 1, p_stride, vp, cw, nk, acc);
  CPUATTN_UNROLL(16)
  for (int r = 0; r < R; ++r) {
    CPUATTN_UNROLL(16)
    for (int c = 0; c < C; ++c) O::Store(acc[r][c], acc_out + r * acc_stride + c * N);
  }
}

template <class O, int C, class TV>
void PvRowsC(int R, const float* p, std::int64_t p_stride, const TV* vp, std::int64_t cw,
             std::int64_t nk, float* acc, std::int64_t acc_stride) {
  switch (R) {
#define CPUATTN_PV_CASE(n)                                                                        \
  case n:                                                                                         \
    if constexpr (n <= O::kPvRows) PvTile<O, n, C, TV>(p, p_stride, vp, cw, nk, acc, acc_stride); \
    break;
    CPUATTN_PV_CASE(1)
    CPUATTN_PV_CASE(2)
    CPUATTN_PV_CASE(3)
    CPUATTN_PV_CASE(4)
    CPUATTN_PV_CASE(5)
    CPUATTN_PV_CASE(6)
    CPUATTN_PV_CASE(7)
    CPUATTN_PV_CASE(8)
#undef CPUATTN_PV_CASE
    default:
      break;
  }
}

template <class O, class TV = float>
void PvRows(int R, int C, const float* p, std::int64_t p_stride, const TV* vp, std::int64_t cw,
            std::int64_t nk, float* acc, std::int64_t acc_stride) {
  static_assert(O::kPvRows <= 8 && O::kPvCols <= 4, "extend the switches");
  switch (C) {
    case 1:
      PvRowsC<O, 1, TV>(R, p, p_stride, vp, cw, nk, acc, acc_stride);
      break;
    case 2:
      if constexpr (O::kPvCols >= 2) PvRowsC<O, 2, TV>(R, p, p_stride, vp, cw, nk, acc, acc_stride);
      break;
    case 3:
      if constexpr (O::kPvCols >= 3) PvRowsC<O, 3, TV>(R, p, p_stride, vp, cw, nk, acc, acc_stride);
      break;
    case 4:
      if constexpr (O::kPvCols >= 4) PvRowsC<O, 4, TV>(R, p, p_stride, vp, cw, nk, acc, acc_stride);
      break;
    default:
      break;
  }
}

CPUATTN_NAMESPACE_END

#endif  // CPUATTN_KERNELS_FLASH_PV_INL_H_
