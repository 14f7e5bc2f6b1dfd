// The exact P V of a key block: the rows' weights times V read in place, skipping every key whose
// weight in a row is 0, as the reference does. A key that a mask, causality or a window excludes
// has a weight of exactly 0 (exp2 of -inf), and its V row may hold anything: services pad batches
// with uninitialised memory, recycle cache pages and pre-allocate cache slots. The tiles multiply
// every key of a block, and 0 * inf is NaN, so a query block whose accumulators come out
// non-finite runs again on this unit (RunTask, AccFinite): the common case pays one check per
// query block, and only blocks that met a non-finite value pay for the skip.
#if defined(CPUATTN_KERNELS_FLASH_PV_SKIP_ZERO_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef CPUATTN_KERNELS_FLASH_PV_SKIP_ZERO_INL_H_
#undef CPUATTN_KERNELS_FLASH_PV_SKIP_ZERO_INL_H_
#else
#define CPUATTN_KERNELS_FLASH_PV_SKIP_ZERO_INL_H_
#endif

#include <cmath>
#include <cstdint>

#include "core/dtypes.h"
#include "core/problem.h"
#include "kernels/flash/kv_pack-inl.h"
#include "simd/target_namespace.h"
#include "simd/widen-inl.h"

CPUATTN_NAMESPACE_BEGIN

// Whether all of acc[0, n) is finite (n a whole number of vectors, acc aligned): x * 0 is 0 for
// finite x and NaN for inf or NaN, so one multiply-add per vector gathers the answer. Four chains
// of multiply-adds, so that the loop does not wait an FMA's latency per vector.
template <class O>
bool AccFinite(const float* CPUATTN_RESTRICT acc, std::int64_t n) {
  constexpr int N = O::kLanes;
  const typename O::V zero = O::Zero();
  typename O::V s0 = zero, s1 = zero, s2 = zero, s3 = zero;
  std::int64_t i = 0;
  for (; i + 4 * N <= n; i += 4 * N) {
    s0 = O::MulAdd(O::Load(acc + i), zero, s0);
    s1 = O::MulAdd(O::Load(acc + i + N), zero, s1);
    s2 = O::MulAdd(O::Load(acc + i + 2 * N), zero, s2);
    s3 = O::MulAdd(O::Load(acc + i + 3 * N), zero, s3);
  }
  for (; i < n; i += N) s0 = O::MulAdd(O::Load(acc + i), zero, s0);
  return !std::isnan(O::ReduceSum(O::Add(O::Add(s0, s1), O::Add(s2, s3))));
}

// acc[r][0, Dv) += sum over keys j in [kb0, kb0 + nk) with s[r][j] != 0 of s[r][j] v_j, for
// `rows` rows of K/V head hk (s rows s_stride apart, acc rows acc_stride apart). s holds the
// softmax's unnormalized weights, not yet multiplied by an int8 V's scale.
template <class O, class T>
void PvSkipZeroAs(const detail::Problem& p, std::int64_t b, std::int64_t hk, std::int64_t kb0,
                  std::int64_t nk, int rows, const float* s, std::int64_t s_stride, float* acc,
                  std::int64_t acc_stride) {
  constexpr int N = O::kLanes;
  const std::int64_t dv = p.Dv / N * N;
  for (std::int64_t j = 0; j < nk; ++j) {
    const T* vrow = static_cast<const T*>(p.v.data) + p.key_off(p.v.s, b, kb0 + j) + hk * p.v.s[1];
    for (int r = 0; r < rows; ++r) {
      const float w = s[r * s_stride + j];
      if (w == 0.0f) continue;
      const auto vw = O::Set(w * KeyScale(p, p.v_scale, p.v_scale_s, b, hk, kb0 + j));
      float* a = acc + r * acc_stride;
      for (std::int64_t d = 0; d < dv; d += N)
        O::StoreU(O::MulAdd(vw, LoadWide<O>(vrow + d), O::LoadU(a + d)), a + d);
      if (dv < p.Dv)
        O::StoreU(O::MulAdd(vw, LoadWidePartial<O>(vrow + dv, p.Dv - dv), O::LoadU(a + dv)),
                  a + dv);
    }
  }
}

template <class O>
void PvSkipZero(const detail::Problem& p, std::int64_t b, std::int64_t hk, std::int64_t kb0,
                std::int64_t nk, int rows, const float* s, std::int64_t s_stride, float* acc,
                std::int64_t acc_stride) {
  detail::with_elem(p.v.dtype, [&](auto t) {
    PvSkipZeroAs<O, decltype(t)>(p, b, hk, kb0, nk, rows, s, s_stride, acc, acc_stride);
  });
}

CPUATTN_NAMESPACE_END

#endif  // CPUATTN_KERNELS_FLASH_PV_SKIP_ZERO_INL_H_
