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

// A run of V rows read in place: keys [j0, j0 + n) of the block, rows `v_stride` elements apart
// from v (one page's rows, for a paged cache).
template <class TV>
struct VRun {
  const TV* v;
  std::int64_t j0, n;
};

// Acc[R][0:C vectors] += P[R][keys of the runs] . V[those keys][c0 : c0 + C vectors]. R * C
// accumulators in registers across all runs (loaded and stored once per block, not once per
// 16-key page: at R = 4, C = 4 that was 32 memory operations per 256 FMAs); each key costs C
// loads, R broadcasts and R*C FMAs. V is f32 (packed, or in place) or, in place for decode, a
// reduced-precision TV widened as it is loaded.
template <class O, int R, int C, class TV = float>
CPUATTN_INLINE void PvTile(const float* CPUATTN_RESTRICT p, std::int64_t p_stride,
                           const VRun<TV>* runs, int nruns, std::int64_t c0, std::int64_t v_stride,
                           float* CPUATTN_RESTRICT acc_out, std::int64_t acc_stride) {
  using V = typename O::V;
  constexpr int N = O::kLanes;
  V acc[R][C];
  CPUATTN_UNROLL(16)
  for (int r = 0; r < R; ++r) {
    CPUATTN_UNROLL(16)
    for (int c = 0; c < C; ++c) acc[r][c] = O::Load(acc_out + r * acc_stride + c * N);
  }
  for (int i = 0; i < nruns; ++i)
    AccumulateOuter<O, R, C, TV>(p + runs[i].j0, 1, p_stride, runs[i].v + c0, v_stride, runs[i].n,
                                 acc);
  CPUATTN_UNROLL(16)
  for (int r = 0; r < R; ++r) {
    CPUATTN_UNROLL(16)
    for (int c = 0; c < C; ++c) O::Store(acc[r][c], acc_out + r * acc_stride + c * N);
  }
}

template <class O, int C, class TV>
void PvRowsC(int R, const float* p, std::int64_t p_stride, const VRun<TV>* runs, int nruns,
             std::int64_t c0, std::int64_t v_stride, float* acc, std::int64_t acc_stride) {
  switch (R) {
#define CPUATTN_PV_CASE(n)                                                          \
  case n:                                                                           \
    if constexpr (n <= O::kPvRows)                                                  \
      PvTile<O, n, C, TV>(p, p_stride, runs, nruns, c0, v_stride, acc, acc_stride); \
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

// R rows' accumulators [acc, acc + C vectors) (columns c0 on of V) += P . V over the runs.
template <class O, class TV = float>
void PvRows(int R, int C, const float* p, std::int64_t p_stride, const VRun<TV>* runs, int nruns,
            std::int64_t c0, std::int64_t v_stride, float* acc, std::int64_t acc_stride) {
  static_assert(O::kPvRows <= 8 && O::kPvCols <= 4, "extend the switches");
  switch (C) {
    case 1:
      PvRowsC<O, 1, TV>(R, p, p_stride, runs, nruns, c0, v_stride, acc, acc_stride);
      break;
    case 2:
      if constexpr (O::kPvCols >= 2)
        PvRowsC<O, 2, TV>(R, p, p_stride, runs, nruns, c0, v_stride, acc, acc_stride);
      break;
    case 3:
      if constexpr (O::kPvCols >= 3)
        PvRowsC<O, 3, TV>(R, p, p_stride, runs, nruns, c0, v_stride, acc, acc_stride);
      break;
    case 4:
      if constexpr (O::kPvCols >= 4)
        PvRowsC<O, 4, TV>(R, p, p_stride, runs, nruns, c0, v_stride, acc, acc_stride);
      break;
    default:
      break;
  }
}

// One run of nk keys: P[R][0:nk] . vp[nk][0:C vectors], rows `cw` elements apart.
template <class O, class TV = float>
void PvRows(int R, int C, const float* p, std::int64_t p_stride, const TV* vp, std::int64_t cw,
            std::int64_t nk, float* acc, std::int64_t acc_stride) {
  const VRun<TV> one{vp, 0, nk};
  PvRows<O, TV>(R, C, p, p_stride, &one, 1, 0, cw, acc, acc_stride);
}

CPUATTN_NAMESPACE_END

#endif  // CPUATTN_KERNELS_FLASH_PV_INL_H_
