// Masks of the attention kernels, applied to a row of scores while they are in registers (the tiled
// path, in the score micro-kernel's epilogue) or in memory (the streaming decode path). Scores
// are in log2 units: an additive mask is multiplied by log2(e) as it is added.
#if defined(CPUATTN_KERNELS_COMMON_MASK_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef CPUATTN_KERNELS_COMMON_MASK_INL_H_
#undef CPUATTN_KERNELS_COMMON_MASK_INL_H_
#else
#define CPUATTN_KERNELS_COMMON_MASK_INL_H_
#endif

#include <algorithm>
#include <cstdint>
#include <limits>

#include "core/problem.h"
#include "core/softmax.h"
#include "simd/target_namespace.h"

CPUATTN_NAMESPACE_BEGIN

// Lanes whose key index col0 + lane is >= end become -inf. Float lane indices are exact: they
// stay below the 128-key block.
template <class O>
CPUATTN_INLINE typename O::V KeepBelow(typename O::V s, std::int32_t col0, std::int32_t end) {
  const auto keep =
      O::Lt(O::Add(O::Iota(), O::Set(static_cast<float>(col0))), O::Set(static_cast<float>(end)));
  return O::IfThenElse(keep, s, O::Set(-std::numeric_limits<float>::infinity()));
}

// Masking of one score row inside the score micro-kernel's epilogue, while the scores are still in
// registers. `end` is the first key (relative to the tile) this row may not see; `mask` points at
// the row's mask entries for the tile's first key (nullptr: no mask tensor).
struct RowMask {
  std::int32_t end;
  const void* mask;
};

struct MaskInfo {
  detail::MaskKind kind;
  std::int64_t stride;  // element stride of the mask along keys (0 = broadcast)
};

// Only lanes below rm.end are read from the mask: past it lies the end of the mask row (or of
// the tensor), and those lanes become -inf anyway.
template <class O>
CPUATTN_INLINE typename O::V ApplyRowMask(typename O::V s, std::int32_t col0, const RowMask& rm,
                                          const MaskInfo& mi) {
  constexpr int N = O::kLanes;
  if (rm.mask != nullptr && col0 < rm.end) {
    const bool full = mi.stride == 1 && col0 + N <= rm.end;
    const int valid = std::min(N, rm.end - col0);
    if (mi.kind == detail::MaskKind::additive) {
      const float* m = static_cast<const float*>(rm.mask) + col0 * mi.stride;
      typename O::V add;
      if (full) {
        add = O::LoadU(m);
      } else {
        alignas(64) float tmp[N] = {};
        for (int i = 0; i < valid; ++i) tmp[i] = m[i * mi.stride];
        add = O::Load(tmp);
      }
      s = O::MulAdd(add, O::Set(detail::kLog2e), s);
    } else {
      const std::uint8_t* m = static_cast<const std::uint8_t*>(rm.mask) + col0 * mi.stride;
      if (full) {
        s = O::KeepIfByteSet(s, m);
      } else {
        alignas(64) std::uint8_t tmp[N] = {};
        for (int i = 0; i < valid; ++i) tmp[i] = m[i * mi.stride];
        s = O::KeepIfByteSet(s, tmp);
      }
    }
  }
  return KeepBelow<O>(s, col0, rm.end);
}

// Element-wise masks of one streamed score row (the tiled path does this in its epilogue).
inline void MaskScoreRow(float* CPUATTN_RESTRICT srow, std::int64_t ncols, const RowMask& rm,
                         const MaskInfo& mi) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (std::int64_t j = 0; j < ncols; ++j) {
    if (j >= rm.end) {
      srow[j] = neg_inf;
    } else if (rm.mask != nullptr) {
      if (mi.kind == detail::MaskKind::additive) {
        srow[j] += static_cast<const float*>(rm.mask)[j * mi.stride] * detail::kLog2e;
      } else if (static_cast<const std::uint8_t*>(rm.mask)[j * mi.stride] == 0) {
        srow[j] = neg_inf;
      }
    }
  }
}

CPUATTN_NAMESPACE_END

#endif  // CPUATTN_KERNELS_COMMON_MASK_INL_H_
