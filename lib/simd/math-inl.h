// exp2, tanh and soft-capping, written once against the vector contract (simd/contract.h) for every
// target of every provider. Each states its maximum error and valid range; tests/kernels asserts
// them on every target and provider against double precision.
#if defined(CPUATTN_SIMD_MATH_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef CPUATTN_SIMD_MATH_INL_H_
#undef CPUATTN_SIMD_MATH_INL_H_
#else
#define CPUATTN_SIMD_MATH_INL_H_
#endif

#include <algorithm>
#include <cstddef>

#include "simd/contract.h"
#include "simd/target_namespace.h"

CPUATTN_NAMESPACE_BEGIN

// c[0] f^(N-1) + ... + c[N-1] by Horner's rule in multiply-adds.
template <class O, int N>
CPUATTN_ALWAYS_INLINE typename O::V Horner(typename O::V f, const float (&c)[N]) {
  typename O::V p = O::Set(c[0]);
  for (int i = 1; i < N; ++i) p = O::MulAdd(p, f, O::Set(c[i]));
  return p;
}

// 2^x. Maximum relative error 3e-7 (2.5 ulp) for x in (-126, 127]; x <= -126 gives exactly 0
// (never a denormal), so a masked score of -inf gives 0; NaN gives NaN; above 127 unspecified.
// Method: x = n + f with the target's integer n (simd/contract.h: floor(x), f in [0, 1), by one
// vreduceps on AVX-512; nearest, f in [-0.5, 0.5], by one add on AVX2 and SSE4); 2^f by a
// degree-5 polynomial fitted for minimum relative error on f's range (1.45e-7 in f32 Horner form
// on [0, 1); 1.55e-7 on [-0.5, 0.5], fitted with p(0) = 1 exactly, so that 2^x <= 1 for x <= 0,
// which SoftCap's 1 - e needs: a free p(0) of 1.00000012 made it negative for tiny x); Exp2Scale
// applies 2^n and zeroes the lanes at or below -126 whatever the polynomial gave for them.
template <class O>
CPUATTN_ALWAYS_INLINE typename O::V Exp2(typename O::V x) {
  static constexpr float kFloor[] = {1.8762338e-03f, 8.992582e-03f,  5.5823606e-02f,
                                     2.4015453e-01f, 6.9315296e-01f, 9.9999994e-01f};
  static constexpr float kCentered[] = {1.32647285e-03f, 9.67151299e-03f, 5.55072613e-02f,
                                        2.40222439e-01f, 6.93147004e-01f, 1.0f};
  const typename O::V f = O::Exp2Frac(x);
  return O::Exp2Scale(Horner<O>(f, O::kExp2Centered ? kCentered : kFloor), x);
}

// 2^x for probabilities that are rounded to bf16 next (8 significant bits): maximum relative error
// 3e-6 for x in (-126, 127], the rest as Exp2. Method: Exp2's, with 2^f by a degree-4 polynomial
// fitted for minimum relative error on f's range (2.7e-6 in f32 Horner form on either): one
// multiply-add fewer than Exp2 in the softmax of the native bf16 tiles, at 1/1400 of the bf16
// rounding that follows (docs/precision.md; degree 3, 7.5e-5, moved the log-sum-exp past its
// bound).
template <class O>
CPUATTN_ALWAYS_INLINE typename O::V Exp2Bf16(typename O::V x) {
  static constexpr float kFloor[] = {0.01353414636105299f, 0.05201149359345436f,
                                     0.2414427399635315f, 0.6930038332939148f, 1.0000026226043701f};
  static constexpr float kCentered[] = {9.57010221e-03f, 5.59179634e-02f, 2.40247265e-01f,
                                        6.93121791e-01f, 9.99999285e-01f};
  const typename O::V f = O::Exp2Frac(x);
  return O::Exp2Scale(Horner<O>(f, O::kExp2Centered ? kCentered : kFloor), x);
}

// P of tanh x = x + x^3 P(x^2) for |x| < 0.625: degree 4, fitted for minimum relative error on
// [0, 0.625] (1.3 ulp in f32). Tanh and SoftCap's small-argument branch.
template <class O>
CPUATTN_ALWAYS_INLINE typename O::V TanhPoly(typename O::V x2) {
  typename O::V p = O::Set(-0.0057049766182899475f);
  p = O::MulAdd(p, x2, O::Set(0.020639078691601753f));
  p = O::MulAdd(p, x2, O::Set(-0.05373971164226532f));
  p = O::MulAdd(p, x2, O::Set(0.13331441581249237f));
  return O::MulAdd(p, x2, O::Set(-0.3333328068256378f));
}

// tanh(x). Maximum relative error 4e-7 over all finite floats; tanh(+-inf) = +-1; NaN gives NaN.
// Method: for |x| < 0.625, x + x^3 P(x^2) with P of degree 4 fitted for minimum relative error on
// [0, 0.625] (1.3 ulp in f32); above, 1 - 2 / (2^(2 log2(e) |x|) + 1), which has no cancellation
// once tanh >= 0.55, with Exp2's 3e-7; |x| >= 9 gives exactly +-1 (the true value rounds to 1
// there). The sign is copied back from x.
template <class O>
CPUATTN_ALWAYS_INLINE typename O::V Tanh(typename O::V x) {
  using V = typename O::V;
  const V ax = O::Abs(x);
  const V x2 = O::Mul(ax, ax);
  const V small = O::MulAdd(O::Mul(ax, x2), TanhPoly<O>(x2), ax);
  const V e = Exp2<O>(O::Mul(O::Min(ax, O::Set(9.0f)), O::Set(2.8853900817779268f)));
  const V large = O::Sub(O::Set(1.0f), O::Div(O::Set(2.0f), O::Add(e, O::Set(1.0f))));
  V t = O::IfThenElse(O::Lt(ax, O::Set(0.625f)), small, large);
  t = O::IfThenElse(O::Ge(ax, O::Set(9.0f)), O::Set(1.0f), t);
  t = O::IfThenElse(O::IsNaN(x), x, t);
  return O::CopySignToAbs(t, x);
}

// Caps (in log2 units) above which SoftCap takes its small-argument branch: below it, 4e-7 cap is
// at most 2.6e-5 absolute, and the branch would slow every soft-capped epilogue
// (docs/performance.md#dm-softcap-exact-branch).
inline constexpr float kSoftCapExactAbove = 64.0f;

// cap * tanh(x / cap) for cap > 0, given cap and k = 2 log2(e) / cap: logit soft-capping.
// Maximum error: absolute 4e-7 cap for every finite x; and with kExactSmall (which callers take
// for caps above kSoftCapExactAbove), relative 4e-7 for |x| < 0.625 cap, so the capped score tends
// to x itself as the cap grows (a cap of 1e30 leaves every score as it was). +-inf give +-cap;
// NaN gives NaN.
// Method: tanh y = (1 - e) / (1 + e) with e = 2^(-k |x|) in (0, 1] (no overflow; Exp2's 3e-7
// relative error moves the quotient by at most 1.5e-7, and 1 - e by 3e-7 absolute near 0); with
// kExactSmall, below 0.625 cap Tanh's polynomial branch in y = |x| / cap instead: |x| + |x| y^2
// P(y^2) (1.3 ulp). The sign is copied back from x.
template <class O, bool kExactSmall = true>
CPUATTN_ALWAYS_INLINE typename O::V SoftCap(typename O::V x, typename O::V cap, typename O::V k) {
  using V = typename O::V;
  const V ax = O::Abs(x);
  const V e = Exp2<O>(O::Mul(ax, O::Sub(O::Zero(), k)));
  // cap (1 - e) in one multiply-add: the multiplies, not the division, bound the epilogue of a
  // score tile (docs/performance.md).
  const V large = O::Div(O::MulAdd(O::Sub(O::Zero(), cap), e, cap), O::Add(O::Set(1.0f), e));
  if constexpr (!kExactSmall) return O::CopySignToAbs(large, x);
  const V y = O::Mul(ax, O::Mul(k, O::Set(0.34657359027997264f)));  // k ln(2) / 2 = 1 / cap
  const V y2 = O::Mul(y, y);
  const V small = O::MulAdd(O::Mul(ax, y2), TanhPoly<O>(y2), ax);
  return O::CopySignToAbs(O::IfThenElse(O::Lt(y, O::Set(0.625f)), small, large), x);
}

// out[i] = f(in[i]) for a vector function f; the tail goes through a zero-padded vector.
template <class O, class F>
void MapArray(const float* in, float* out, std::size_t n, F f) {
  constexpr std::size_t N = O::kLanes;
  std::size_t i = 0;
  for (; i + N <= n; i += N) O::StoreU(f(O::LoadU(in + i)), out + i);
  if (i < n) {
    alignas(64) float buf[N] = {};
    std::copy(in + i, in + n, buf);
    O::Store(f(O::Load(buf)), buf);
    std::copy(buf, buf + (n - i), out + i);
  }
}

CPUATTN_NAMESPACE_END

#endif  // CPUATTN_SIMD_MATH_INL_H_
