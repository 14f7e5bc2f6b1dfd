// The inner loop of the register-blocked micro-kernels (attention scores, P V, the layers' dense
// product): R x C vector accumulators += a(k, r) (broadcast) x b[k][0:C vectors], for k < K,
// with a(k, r) = a[k * a_k + r * a_r] and the C vectors of each k contiguous, `b_stride` floats
// apart. Per k: C loads, R broadcasts, R * C FMAs. Inlined, so the accumulators stay in
// registers.
#if defined(CPUATTN_KERNELS_COMMON_OUTER_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef CPUATTN_KERNELS_COMMON_OUTER_INL_H_
#undef CPUATTN_KERNELS_COMMON_OUTER_INL_H_
#else
#define CPUATTN_KERNELS_COMMON_OUTER_INL_H_
#endif

#include <cstdint>

#include "simd/target_namespace.h"
#include "simd/widen-inl.h"

CPUATTN_NAMESPACE_BEGIN

// `b` may be of a reduced-precision storage type (TB = Bf16, F16 or int8): each vector is widened
// as it is loaded (simd/widen-inl.h) and serves all R rows.
template <class O, int R, int C, class TB = float>
CPUATTN_ALWAYS_INLINE void AccumulateOuter(const float* CPUATTN_RESTRICT a, std::int64_t a_k,
                                           std::int64_t a_r, const TB* CPUATTN_RESTRICT b,
                                           std::int64_t b_stride, std::int64_t K,
                                           typename O::V (&acc)[R][C]) {
  using V = typename O::V;
  for (std::int64_t k = 0; k < K; ++k) {
    V bv[C];
    LoadWideN<O, C>(b + k * b_stride, bv);
    CPUATTN_UNROLL(16)
    for (int r = 0; r < R; ++r) {
      const V av = O::Set(a[k * a_k + r * a_r]);
      CPUATTN_UNROLL(32)
      for (int j = 0; j < C; ++j) acc[r][j] = O::MulAdd(av, bv[j], acc[r][j]);
    }
  }
}

CPUATTN_NAMESPACE_END

#endif  // CPUATTN_KERNELS_COMMON_OUTER_INL_H_
