// The output epilogue, once for the task driver and the split-key merge: a row's unnormalised
// accumulator and softmax state become its output row (normalised, converted to out's dtype)
// and its log-sum-exp; or, in a task of a split problem, its partial result for the merge.
#if defined(CPUATTN_KERNELS_FLASH_EPILOGUE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef CPUATTN_KERNELS_FLASH_EPILOGUE_INL_H_
#undef CPUATTN_KERNELS_FLASH_EPILOGUE_INL_H_
#else
#define CPUATTN_KERNELS_FLASH_EPILOGUE_INL_H_
#endif

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "core/dtypes.h"
#include "core/problem.h"
#include "core/softmax.h"
#include "kernels/flash/config.h"
#include "simd/target_namespace.h"
#include "simd/widen-inl.h"

CPUATTN_NAMESPACE_BEGIN

// Where row (b, h, i) of out starts, in out's elements.
CPUATTN_ALWAYS_INLINE std::int64_t OutRowOffset(const detail::Problem& p, std::int64_t b,
                                                std::int64_t h, std::int64_t i) {
  return b * p.out_s[0] + h * p.out_s[1] + i * p.out_s[2];
}

// lse of row (b, h, i) = st.lse(), where the call asked for it.
CPUATTN_ALWAYS_INLINE void WriteLse(const detail::Problem& p, const detail::RowState& st,
                                    std::int64_t b, std::int64_t h, std::int64_t i) {
  if (p.lse != nullptr)
    static_cast<float*>(p.lse)[b * p.lse_s[0] + h * p.lse_s[1] + i * p.lse_s[2]] = st.lse();
}

// Row (b, h, i): out = arow[0, Dv) * st.out_scale() in out's dtype (bf16/f16 rounded to nearest
// even), and lse = st.lse() where the call asked for it. arow is vector-aligned. OutUnit::
// f32_stream writes with non-temporal stores where the row is whole aligned vectors (the task
// fences them before it ends); OutUnit::partials is WritePartial's.
template <class O>
void WriteRow(const detail::Problem& p, detail::OutUnit unit, const detail::RowState& st,
              const float* arow, std::int64_t b, std::int64_t h, std::int64_t i) {
  constexpr int N = O::kLanes;
  const std::int64_t out_off = OutRowOffset(p, b, h, i);
  const float scale = st.out_scale();
  const typename O::V vscale = O::Set(scale);
  if (unit == detail::OutUnit::narrow) {
    const std::int64_t dv = p.Dv / N * N;
    detail::with_elem(p.out_dtype, [&](auto t) {
      using T = decltype(t);
      if constexpr (std::is_same_v<T, detail::Bf16> || std::is_same_v<T, detail::F16>) {
        T* dst = static_cast<T*>(p.out) + out_off;
        for (std::int64_t d = 0; d < dv; d += N)
          StoreNarrow<O>(O::Mul(O::Load(arow + d), vscale), dst + d);
      }
    });
    for (std::int64_t d = dv; d < p.Dv; ++d)
      detail::store_float(p.out, p.out_dtype, out_off + d, arow[d] * scale);
  } else if (float* dst = static_cast<float*>(p.out) + out_off;
             unit == detail::OutUnit::f32_stream && p.Dv % N == 0 &&
             reinterpret_cast<std::uintptr_t>(dst) % (N * sizeof(float)) == 0) {
    for (std::int64_t d = 0; d < p.Dv; d += N)
      O::Stream(O::Mul(O::Load(arow + d), vscale), dst + d);
  } else {
    for (std::int64_t d = 0; d < p.Dv; ++d) dst[d] = arow[d] * scale;
  }
  WriteLse(p, st, b, h, i);
}

// Row (b, h, i) of key split ks: (m, l, arow[0, Dv)) unnormalised, for the merge.
CPUATTN_ALWAYS_INLINE void WritePartial(const detail::Problem& p, const detail::Plan& pl,
                                        const detail::RowState& st, const float* arow,
                                        std::int64_t b, std::int64_t h, std::int64_t i,
                                        std::int64_t ks) {
  float* dst = detail::partial_row(p, pl, b, h, i, ks);
  dst[0] = st.m;
  dst[1] = st.l;
  std::copy(arow, arow + p.Dv, dst + 2);
}

CPUATTN_NAMESPACE_END

#endif  // CPUATTN_KERNELS_FLASH_EPILOGUE_INL_H_
