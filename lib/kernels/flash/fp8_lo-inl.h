// Reading an fp8_e4m3 K or V at 2^-120 of its value (Fp8E4M3Lo, kv/fp8_e4m3.h) in the decode
// units: the factor 2^120 moves to the other operand of the products, Q for K (once per query
// block, ScoreUnit::dot) and P for V (once per key block, PvUnit::runs). Multiplying by a power
// of two is exact there, so scores and outputs are bitwise those of the exact reading, and each
// widening costs three operations where the exact one costs seven. The exact reading stays where
// the moved factor could overflow (|Qp| >= 2^7; a V scale >= 2^7). NaN codes are found after
// the products, in L1: a K NaN code sets its key's scores to NaN, a V NaN code its output column.
#if defined(CPUATTN_KERNELS_FLASH_FP8_LO_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef CPUATTN_KERNELS_FLASH_FP8_LO_INL_H_
#undef CPUATTN_KERNELS_FLASH_FP8_LO_INL_H_
#else
#define CPUATTN_KERNELS_FLASH_FP8_LO_INL_H_
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "core/dtypes.h"
#include "core/problem.h"
#include "kernels/flash/config.h"
#include "kv/kv-inl.h"
#include "simd/target_namespace.h"

CPUATTN_NAMESPACE_BEGIN

// Below this bound times 2^120 is finite with room for P <= 1 and Q's rounding: 2^7 * 2^120.
inline constexpr float kFp8LoOperandBound = 128.0f;

// Calls f(T{}) with the element tag a unit reads dtype t as: Fp8E4M3Lo where `lo`, else t's.
template <class F>
CPUATTN_ALWAYS_INLINE void WithReadElem(DType t, bool lo, F&& f) {
  if (lo) {
    f(detail::Fp8E4M3Lo{});
  } else {
    detail::with_elem(t, f);
  }
}

// QUnit::f32 before ScoreUnit::dot over an fp8_e4m3 K: multiplies the block's `rows` Qp rows
// (stride qs) by 2^120 when every |Qp| is below kFp8LoOperandBound, and returns whether it did
// (then K reads as Fp8E4M3Lo).
template <class O>
bool PrescaleQForFp8K(const detail::Problem& p, const detail::BlockPath& path, float* qp, int rows,
                      std::int64_t qs) {
  if (p.k.dtype != DType::fp8_e4m3 || path.q != detail::QUnit::f32 ||
      path.score != detail::ScoreUnit::dot)
    return false;
  using V = typename O::V;
  const std::int64_t n =
      static_cast<std::int64_t>(rows) * qs;  // qs is a whole number of vectors (TaskScratch)
  V vmax = O::Zero();
  for (std::int64_t i = 0; i < n; i += O::kLanes) vmax = O::Max(vmax, O::Abs(O::Load(qp + i)));
  // An infinity fails the comparison; a NaN (which Max may drop) stays NaN times 2^120.
  if (!(O::ReduceMax(vmax) < kFp8LoOperandBound)) return false;
  const V f = O::Set(detail::kFp8LoFactor);
  for (std::int64_t i = 0; i < n; i += O::kLanes) O::Store(O::Mul(O::Load(qp + i), f), qp + i);
  return true;
}

// After ScoreUnit::dot read the nk keys (rows of bytes ks apart) as Fp8E4M3Lo: the scores of a
// key whose D bytes hold a NaN code become NaN, as the exact reading makes them.
template <class O>
void SetNanKeyScores(const std::uint8_t* k, std::int64_t ks, std::int64_t D, std::int64_t nk,
                     int rows, float* s, std::int64_t s_stride) {
  if (!AnyNanCode<O>(k, nk, ks, D)) return;
  for (std::int64_t j = 0; j < nk; ++j) {
    if (!detail::fp8_e4m3_any_nan(k + j * ks, D)) continue;
    for (int r = 0; r < rows; ++r) s[r * s_stride + j] = std::numeric_limits<float>::quiet_NaN();
  }
}

// Whether PvUnit::runs reads the V rows of keys [0, nk_live) of the block at kb0 (K/V head hk)
// as Fp8E4M3Lo, with P times 2^120 (ScalePByVScales): an fp8_e4m3 V and every V scale of those
// keys below kFp8LoOperandBound (P <= 1 after the softmax, so P times scale times 2^120 is
// finite). NaN codes are looked for after the products (SetNanValueColumns), when the rows are
// in L1: scanning first would take the block's cold read outside the P V loop that overlaps it.
inline bool VScalesAllowLo(const detail::Problem& p, std::int64_t b, std::int64_t hk,
                           std::int64_t kb0, std::int64_t nk_live) {
  if (p.v.dtype != DType::fp8_e4m3) return false;
  if (p.v_scale == nullptr) return true;
  for (std::int64_t j0 = 0; j0 < nk_live;) {
    const std::int64_t nj = std::min(nk_live - j0, p.page_run(kb0 + j0));
    const float* vs = p.v_scale + p.key_off(p.v_scale_s, b, kb0 + j0) + hk * p.v_scale_s[1];
    const std::int64_t n = p.v_scale_s[2] == 0 ? 1 : nj;
    for (std::int64_t t = 0; t < n; ++t)
      if (!(std::abs(vs[t * p.v_scale_s[2]]) < kFp8LoOperandBound)) return false;
    j0 += nj;
  }
  return true;
}

// After PvUnit::runs read those V rows as Fp8E4M3Lo into Acc rows [r_lo, r_hi): a column d
// where some key's byte is a NaN code becomes NaN in every row, as the exact reading makes it
// (P times NaN is NaN, P = 0 included, and a NaN stays NaN through the later blocks' rescaling).
template <class O>
void SetNanValueColumns(const detail::Problem& p, std::int64_t b, std::int64_t hk, std::int64_t kb0,
                        std::int64_t nk_live, int r_lo, int r_hi, float* acc, std::int64_t dvp) {
  for (std::int64_t j0 = 0; j0 < nk_live;) {
    const std::int64_t nj = std::min(nk_live - j0, p.page_run(kb0 + j0));
    const auto* v =
        static_cast<const std::uint8_t*>(p.v.data) + p.key_off(p.v.s, b, kb0 + j0) + hk * p.v.s[1];
    if (AnyNanCode<O>(v, nj, p.v.s[2], p.Dv)) {
      for (std::int64_t j = 0; j < nj; ++j)
        for (std::int64_t d = 0; d < p.Dv; ++d)
          if ((v[j * p.v.s[2] + d] & 0x7f) == 0x7f)
            for (int r = r_lo; r < r_hi; ++r)
              acc[r * dvp + d] = std::numeric_limits<float>::quiet_NaN();
    }
    j0 += nj;
  }
}

CPUATTN_NAMESPACE_END

#endif  // CPUATTN_KERNELS_FLASH_FP8_LO_INL_H_
