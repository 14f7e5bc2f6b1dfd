// The split-key merge (OutUnit::partials): the k_splits partial results of a row, each (m, l,
// acc[Dv]) unnormalised with m in log2 units, rescaled to their common max, summed in split order
// and handed to the output epilogue, which also adds the head's sink.
#if defined(CPUATTN_KERNELS_FLASH_MERGE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef CPUATTN_KERNELS_FLASH_MERGE_INL_H_
#undef CPUATTN_KERNELS_FLASH_MERGE_INL_H_
#else
#define CPUATTN_KERNELS_FLASH_MERGE_INL_H_
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "core/problem.h"
#include "core/softmax.h"
#include "kernels/flash/config.h"
#include "kernels/flash/epilogue-inl.h"
#include "simd/target_namespace.h"

CPUATTN_NAMESPACE_BEGIN

// acc[0, n) += w * x[0, n) (acc aligned, x any alignment).
template <class O>
CPUATTN_ALWAYS_INLINE void AddScaledRow(float* CPUATTN_RESTRICT acc,
                                        const float* CPUATTN_RESTRICT x, float w, std::int64_t n) {
  constexpr int N = O::kLanes;
  const typename O::V vw = O::Set(w);
  std::int64_t d = 0;
  for (; d + N <= n; d += N) O::Store(O::MulAdd(O::LoadU(x + d), vw, O::Load(acc + d)), acc + d);
  for (; d < n; ++d) acc[d] += x[d] * w;
}

// The merged state of row (b, h, i) and its unnormalised sum in buf[0, Dv) (aligned). A NaN m
// poisons the row, as in the reference (std::max would drop it). A split whose keys all weigh 0
// against the row's max adds nothing, whatever its accumulator holds (NaN or inf from a V row that
// weighed something within the split), as the reference skips keys of weight 0; a NaN sum (a NaN
// score) still poisons the row.
template <class O>
detail::RowState MergeRow(const detail::Problem& p, const detail::Plan& pl, std::int64_t b,
                          std::int64_t h, std::int64_t i, float* CPUATTN_RESTRICT buf) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  detail::RowState st{neg_inf, 0.0f, static_cast<float>(p.sink(h) * detail::kLog2e)};
  for (std::int64_t s = 0; s < pl.k_splits; ++s) {
    const float m = detail::partial_row(p, pl, b, h, i, s)[0];
    st.m = std::isnan(m) || std::isnan(st.m) ? std::numeric_limits<float>::quiet_NaN()
                                             : std::max(st.m, m);
  }
  std::fill(buf, buf + p.Dv, 0.0f);
  if (st.empty()) return st;
  for (std::int64_t s = 0; s < pl.k_splits; ++s) {
    const float* src = detail::partial_row(p, pl, b, h, i, s);
    if (src[0] == neg_inf) continue;
    const float w = std::exp2(src[0] - st.m);
    if (w == 0.0f && !std::isnan(src[1])) continue;
    st.l += src[1] * w;
    AddScaledRow<O>(buf, src + 2, w, p.Dv);
  }
  return st;
}

// Rows [row0, row1) of a split problem, row = (b * H + h) * Lq + i, into out and lse; buf holds
// Dv floats (aligned).
template <class O>
void MergeRows(const detail::Problem& p, const detail::Plan& pl, std::int64_t row0,
               std::int64_t row1, float* buf) {
  const detail::OutUnit unit =
      p.out_dtype == DType::f32 ? detail::OutUnit::f32 : detail::OutUnit::narrow;
  for (std::int64_t row = row0; row < row1; ++row) {
    const std::int64_t i = row % p.Lq, h = (row / p.Lq) % p.H, b = row / (p.Lq * p.H);
    const detail::RowState st = MergeRow<O>(p, pl, b, h, i, buf);
    WriteRow<O>(p, unit, st, buf, b, h, i);
  }
}

CPUATTN_NAMESPACE_END

#endif  // CPUATTN_KERNELS_FLASH_MERGE_INL_H_
