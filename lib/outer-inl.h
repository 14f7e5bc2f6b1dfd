// The inner loop of the register-blocked micro-kernels (attention scores, P V, the layers' dense
// product): R x C vector accumulators += a(k, r) (broadcast) x b[k][0:C vectors], for k < K,
// with a(k, r) = a[k * a_k + r * a_r] and the C vectors of each k contiguous, `b_stride` floats
// apart. Per k: C loads, R broadcasts, R * C FMAs.
// Included by kernels_hwy.cc inside its HWY_NAMESPACE, once per target; inlined, so the
// accumulators stay in registers.
#if defined(CPUATTN_OUTER_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef CPUATTN_OUTER_INL_H_
#undef CPUATTN_OUTER_INL_H_
#else
#define CPUATTN_OUTER_INL_H_
#endif

template <class O, int R, int C>
HWY_INLINE void AccumulateOuter(const float* HWY_RESTRICT a, std::int64_t a_k, std::int64_t a_r,
                                const float* HWY_RESTRICT b, std::int64_t b_stride, std::int64_t K,
                                typename O::V (&acc)[R][C]) {
  using V = typename O::V;
  constexpr int N = O::kLanes;
  for (std::int64_t k = 0; k < K; ++k) {
    V bv[C];
    HWY_UNROLL(32)
    for (int j = 0; j < C; ++j) bv[j] = O::LoadU(b + k * b_stride + j * N);
    HWY_UNROLL(16)
    for (int r = 0; r < R; ++r) {
      const V av = O::Set(a[k * a_k + r * a_r]);
      HWY_UNROLL(32)
      for (int j = 0; j < C; ++j) acc[r][j] = O::MulAdd(av, bv[j], acc[r][j]);
    }
  }
}

#endif  // CPUATTN_OUTER_INL_H_
