// The order in which the dense product's micro-kernels (GemmTile, GemvTile) hold a panel row of
// B in their accumulators.
//
// bf16 B on x86 is widened by parity (LoadWideEven / LoadWideOdd, kv/bf16.h: one or two bit
// operations per vector where LoadWide takes a shuffle and a shift, which on AVX2 compete with the
// FMAs for the vector pipes). The accumulators of a panel row then hold its columns in pair order:
// vector 2m the even columns of the m-th run of 2 x kLanes, vector 2m + 1 the odd ones. The sums
// are the same products in the same order as in column order; only where each lands differs. They
// meet the caller's memory in column order (bias in, C out) through LoadPanelRow /
// UnpermutePanelRow, once per tile; partial sums that a kernel keeps between its k blocks or
// chunks stay in pair order. Every other B (f32, and bf16 on 128-bit and scalable targets) is
// held in column order, and these helpers are plain loads and stores.
#if defined(CPUATTN_KERNELS_GEMM_PANEL_ORDER_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef CPUATTN_KERNELS_GEMM_PANEL_ORDER_INL_H_
#undef CPUATTN_KERNELS_GEMM_PANEL_ORDER_INL_H_
#else
#define CPUATTN_KERNELS_GEMM_PANEL_ORDER_INL_H_
#endif

#include <cstdint>
#include <type_traits>

#include "kernels/gemm/gemm.h"
#include "simd/target_namespace.h"
#include "simd/widen-inl.h"

CPUATTN_NAMESPACE_BEGIN

template <class TB>
inline constexpr bool kPairOrder = std::is_same_v<TB, detail::Bf16> &&
                                   (CPUATTN_SIMD_BITS == 256 || CPUATTN_SIMD_BITS == 512);

// Column of a panel held by lane i of accumulator vector j.
template <class O, class TB>
constexpr std::int64_t PanelColumn(int j, int i) {
  if constexpr (kPairOrder<TB>) return (j / 2) * 2 * O::kLanes + 2 * i + j % 2;
  return j * O::kLanes + i;
}

// Loads of a panel row of B (kPanel elements at `row`) in the accumulators' order, for OuterStep
// (kernels/common/outer-inl.h) and GemvStep: vector j alone, or all C of them.
struct PanelOrder {
  template <class O, class TB>
  static CPUATTN_ALWAYS_INLINE typename O::V One(const TB* row, int j) {
    if constexpr (kPairOrder<TB>) {
      const TB* run = row + (j / 2) * 2 * O::kLanes;
      return j % 2 == 0 ? LoadWideEven<O>(run) : LoadWideOdd<O>(run);
    } else {
      return LoadWide<O>(row + j * O::kLanes);
    }
  }
  template <class O, class TB, int C>
  static CPUATTN_ALWAYS_INLINE void Row(const TB* row, typename O::V (&v)[C]) {
    if constexpr (kPairOrder<TB>) {
      CPUATTN_UNROLL(32)
      for (int j = 0; j < C; ++j) v[j] = One<O, TB>(row, j);
    } else {
      LoadWideN<O, C>(row, v);
    }
  }
};

// The accumulators of a panel row from kPanel floats in column order (vector-aligned).
template <class O, class TB, int C>
CPUATTN_ALWAYS_INLINE void LoadPanelRow(const float* src, typename O::V (&v)[C]) {
  if constexpr (kPairOrder<TB>) {
    alignas(64) float tmp[C * O::kLanes];
    for (int j = 0; j < C; ++j)
      for (int i = 0; i < O::kLanes; ++i) tmp[j * O::kLanes + i] = src[PanelColumn<O, TB>(j, i)];
    CPUATTN_UNROLL(32)
    for (int j = 0; j < C; ++j) v[j] = O::Load(tmp + j * O::kLanes);
  } else {
    CPUATTN_UNROLL(32)
    for (int j = 0; j < C; ++j) v[j] = O::Load(src + j * O::kLanes);
  }
}

// The first `cols` columns of a panel row from `acc_order` (C x kLanes floats in the
// accumulators' order) to dst in column order.
template <class O, class TB, int C>
CPUATTN_ALWAYS_INLINE void UnpermutePanelRow(const float* acc_order, float* dst,
                                             std::int64_t cols) {
  for (int j = 0; j < C; ++j) {
    for (int i = 0; i < O::kLanes; ++i) {
      const std::int64_t col = PanelColumn<O, TB>(j, i);
      if (col < cols) dst[col] = acc_order[j * O::kLanes + i];
    }
  }
}

// The first `cols` columns of a panel row's accumulators to dst in column order: plain stores when
// they are already in that order and the row is whole, else through a buffer so no store passes
// column `cols`.
template <class O, class TB, int C>
CPUATTN_ALWAYS_INLINE void StorePanelRow(const typename O::V (&v)[C], float* dst,
                                         std::int64_t cols) {
  if (!kPairOrder<TB> && cols == detail::PackedMatrix::kPanel) {
    CPUATTN_UNROLL(32)
    for (int j = 0; j < C; ++j) O::StoreU(v[j], dst + j * O::kLanes);
    return;
  }
  alignas(64) float tmp[C * O::kLanes];
  CPUATTN_UNROLL(32)
  for (int j = 0; j < C; ++j) O::Store(v[j], tmp + j * O::kLanes);
  UnpermutePanelRow<O, TB, C>(tmp, dst, cols);
}

CPUATTN_NAMESPACE_END

#endif  // CPUATTN_KERNELS_GEMM_PANEL_ORDER_INL_H_
