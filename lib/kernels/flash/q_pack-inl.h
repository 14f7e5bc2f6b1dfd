// The Q unit of the f32 paths (QUnit::f32): a query block's rows copied into Qp, scaled. Tiled f32
// blocks of one query head over an f32 Q copy nothing (QUnit::f32_in_place: the tiles read Q's
// rows where they are, and K's panels carry the scale; driver-inl.h, PackQueries).
#if defined(CPUATTN_KERNELS_FLASH_Q_PACK_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef CPUATTN_KERNELS_FLASH_Q_PACK_INL_H_
#undef CPUATTN_KERNELS_FLASH_Q_PACK_INL_H_
#else
#define CPUATTN_KERNELS_FLASH_Q_PACK_INL_H_
#endif

#include <algorithm>
#include <cstdint>

#include "core/dtypes.h"
#include "core/inline.h"
#include "core/problem.h"
#include "simd/prefetch.h"
#include "simd/target_namespace.h"
#include "simd/widen-inl.h"

CPUATTN_NAMESPACE_BEGIN

// Copies the block's query rows (row r is position pos0 + r / nh, head h0 + r % nh of batch b),
// Qp[r][0:D] = Q * qscale (qscale = scale * log2(e), so that the softmax runs in base 2), zero from
// D to the row stride qs. Qp is vector-aligned and qs a whole number of vectors (TaskScratch).
// Row-major, not transposed: the score micro-kernel broadcasts one float per row and d from R row
// pointers (6 with AVX-512, which fit the general registers), and the copy is then a load, a
// multiply and a store per vector (docs/performance.md#dm-pack-q-row-major).
template <class O, class T>
void PackQAs(const detail::Problem& p, std::int64_t b, std::int64_t h0, std::int64_t nh,
             std::int64_t pos0, int rows, float qscale, std::int64_t qs,
             float* CPUATTN_RESTRICT qp) {
  constexpr int N = O::kLanes;
  const typename O::V vscale = O::Set(qscale);
  const std::int64_t dv = p.D / N * N;
  detail::ForQueryRows(pos0, h0, nh, 0, rows, [&](std::int64_t r, std::int64_t i, std::int64_t h) {
    const T* src = static_cast<const T*>(p.q.data) + b * p.q.s[0] + h * p.q.s[1] + i * p.q.s[2];
    float* dst = qp + r * qs;
    for (std::int64_t d = 0; d < dv; d += N)
      O::Store(O::Mul(LoadWide<O>(src + d), vscale), dst + d);
    if (dv < qs) {
      if (dv < p.D) O::Store(O::Mul(LoadWidePartial<O>(src + dv, p.D - dv), vscale), dst + dv);
      std::fill(dst + (dv < p.D ? dv + N : dv), dst + qs, 0.0f);
    }
  });
}

template <class O>
void PackQ(const detail::Problem& p, std::int64_t b, std::int64_t h0, std::int64_t nh,
           std::int64_t pos0, int rows, float qscale, std::int64_t qs, float* CPUATTN_RESTRICT qp) {
  detail::with_elem(p.q.dtype, [&](auto t) {
    PackQAs<O, decltype(t)>(p, b, h0, nh, pos0, rows, qscale, qs, qp);
  });
}

// Rows [r0, r1) of those PackQ reads for these arguments, into L2 (see InputsAhead,
// driver-inl.h).
inline void PrefetchQ(const detail::Problem& p, std::int64_t b, std::int64_t h0, std::int64_t nh,
                      std::int64_t pos0, std::int64_t r0, std::int64_t r1) {
  const auto eq = static_cast<std::int64_t>(dtype_size(p.q.dtype));
  detail::ForQueryRows(pos0, h0, nh, r0, r1, [&](std::int64_t, std::int64_t i, std::int64_t h) {
    const char* src =
        static_cast<const char*>(p.q.data) + (b * p.q.s[0] + h * p.q.s[1] + i * p.q.s[2]) * eq;
    for (std::int64_t off = 0; off < p.D * eq; off += 64) detail::Prefetch<2>(src + off);
  });
}

CPUATTN_NAMESPACE_END

#endif  // CPUATTN_KERNELS_FLASH_Q_PACK_INL_H_
