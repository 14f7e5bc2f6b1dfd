// Per-target kernel of additive (Bahdanau) attention, written once against the vector contract.
#if defined(CPUATTN_KERNELS_ADDITIVE_ADDITIVE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef CPUATTN_KERNELS_ADDITIVE_ADDITIVE_INL_H_
#undef CPUATTN_KERNELS_ADDITIVE_ADDITIVE_INL_H_
#else
#define CPUATTN_KERNELS_ADDITIVE_ADDITIVE_INL_H_
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "core/softmax.h"
#include "kernels/additive/additive.h"
#include "kernels/common/mask-inl.h"
#include "simd/contract.h"
#include "simd/math-inl.h"
#include "simd/target_namespace.h"

CPUATTN_NAMESPACE_BEGIN

// One query row: scores over its visible keys, masks, softmax, weights, context.
// Scores are sum_a v[a] tanh(E1[i][a] + E2[j][a]): four keys per pass share the loads of E1 and
// v, so each tanh costs one load of E2 next to its arithmetic (tanh is ~20 vector operations,
// the loop is bound by them, not by memory).
template <class O>
void AdditiveTask(const detail::AdditiveProblem& a, std::int64_t t, detail::Scratch& scratch) {
  static_assert(simd::VectorOps<O>);
  using V = typename O::V;
  constexpr std::int64_t N = O::kLanes;
  const detail::Problem& p = *a.p;
  const std::int64_t b = t / p.Lq, i = t % p.Lq;
  const std::int64_t A = a.a_stride, Lk = p.Lk, Dv = p.Dv;
  const std::int64_t dv_pad = (Dv + 15) / 16 * 16, lk_pad = (Lk + 15) / 16 * 16;
  float* s = scratch.get(static_cast<std::size_t>(lk_pad + dv_pad));
  float* acc = s + lk_pad;

  const float* e1 = a.e1 + t * A;
  const float* e2 = a.e2 + b * Lk * A;
  const std::int64_t end = p.key_end(b, i);
  std::int64_t j = 0;
  for (; j + 4 <= end; j += 4) {
    V s0 = O::Zero(), s1 = O::Zero(), s2 = O::Zero(), s3 = O::Zero();
    const float* k0 = e2 + j * A;
    for (std::int64_t d = 0; d < A; d += N) {
      const V q = O::Load(e1 + d), w = O::LoadU(a.v + d);
      s0 = O::MulAdd(w, Tanh<O>(O::Add(q, O::Load(k0 + d))), s0);
      s1 = O::MulAdd(w, Tanh<O>(O::Add(q, O::Load(k0 + A + d))), s1);
      s2 = O::MulAdd(w, Tanh<O>(O::Add(q, O::Load(k0 + 2 * A + d))), s2);
      s3 = O::MulAdd(w, Tanh<O>(O::Add(q, O::Load(k0 + 3 * A + d))), s3);
    }
    s[j] = O::ReduceSum(s0);
    s[j + 1] = O::ReduceSum(s1);
    s[j + 2] = O::ReduceSum(s2);
    s[j + 3] = O::ReduceSum(s3);
  }
  for (; j < end; ++j) {
    V s0 = O::Zero();
    for (std::int64_t d = 0; d < A; d += N) {
      s0 = O::MulAdd(O::LoadU(a.v + d), Tanh<O>(O::Add(O::Load(e1 + d), O::Load(e2 + j * A + d))),
                     s0);
    }
    s[j] = O::ReduceSum(s0);
  }
  // Base-2 units from here on, as in the attention kernel (the mask adds log2(e) * mask).
  for (j = 0; j < end; ++j) s[j] *= detail::kLog2e;
  RowMask rm{0, static_cast<std::int32_t>(end), 0, 0.0f, nullptr};
  MaskInfo mi{p.mask_kind, p.mask.s[3]};
  if (p.mask_kind != detail::MaskKind::none) {
    const std::size_t esize = dtype_size(p.mask.dtype);
    rm.mask = static_cast<const char*>(p.mask.data) +
              static_cast<std::size_t>(b * p.mask.s[0] + i * p.mask.s[2]) * esize;
  }
  MaskScoreRowScalar(s, Lk, rm, mi);

  float m = -std::numeric_limits<float>::infinity();
  for (j = 0; j < end; ++j) m = std::isnan(s[j]) || std::isnan(m) ? s[j] + m : std::max(m, s[j]);
  float* out = static_cast<float*>(p.out) + b * p.out_s[0] + i * p.out_s[2];
  float* wrow = p.weights ? static_cast<float*>(p.weights) + b * p.weights_s[0] + i * p.weights_s[2]
                          : nullptr;
  if (m == -std::numeric_limits<float>::infinity()) {  // every key masked
    std::fill(out, out + Dv, 0.0f);
    if (wrow)
      for (j = 0; j < Lk; ++j) wrow[j * p.weights_s[3]] = 0.0f;
    return;
  }
  float l = 0.0f;
  for (j = 0; j < end; ++j) {
    s[j] = std::exp2(s[j] - m);
    l += s[j];
  }
  const float inv = 1.0f / l;
  for (std::int64_t d = 0; d < dv_pad; d += N) O::Store(O::Zero(), acc + d);
  for (j = 0; j < end; ++j) {
    if (s[j] == 0.0f) continue;
    const float* vrow = static_cast<const float*>(p.v.data) + b * p.v.s[0] + j * p.v.s[2];
    const V w = O::Set(s[j]);
    std::int64_t d = 0;
    for (; d + N <= Dv; d += N)
      O::Store(O::MulAdd(w, O::LoadU(vrow + d), O::Load(acc + d)), acc + d);
    for (; d < Dv; ++d) acc[d] += s[j] * vrow[d];
  }
  for (std::int64_t d = 0; d < Dv; ++d) out[d] = acc[d] * inv;
  if (wrow) {
    for (j = 0; j < Lk; ++j) wrow[j * p.weights_s[3]] = j < end ? s[j] * inv : 0.0f;
  }
}

CPUATTN_NAMESPACE_END

#endif  // CPUATTN_KERNELS_ADDITIVE_ADDITIVE_INL_H_
