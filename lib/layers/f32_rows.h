// A layer's x and out in bf16 or f16 (a reduced-precision model's hidden states). The layer's
// products run on f32 rows, so such an x is widened into scratch once and such an out narrowed
// from scratch once: one pass over each [rows, d_model], beside the d_model multiply-adds per
// element that each product spends on them.
#pragma once

#include <cstdint>

#include "core/dtypes.h"
#include "cpuattn/cpuattn.h"

namespace cpuattn::detail {

// Floats of scratch a 16-bit view takes as f32 rows (0 for f32), rounded up to 64 bytes.
inline std::int64_t f32_rows_floats(const TensorView& t) {
  if (t.dtype == DType::f32) return 0;
  std::int64_t n = 1;
  for (int d = 0; d < t.rank; ++d) n *= t.shape[d];
  return (n + 15) / 16 * 16;
}

// Calls f(row offset of t, row offset of a contiguous copy) for each row (last dimension) of t.
template <class F>
void for_each_row(const TensorView& t, F&& f) {
  std::int64_t n[3] = {1, 1, 1}, s[3] = {0, 0, 0};
  const int lead = t.rank - 1, off = 3 - lead;
  for (int d = 0; d < lead; ++d) {
    n[off + d] = t.shape[d];
    s[off + d] = t.strides[d];
  }
  const std::int64_t width = t.shape[t.rank - 1];
  std::int64_t row = 0;
  for (std::int64_t i = 0; i < n[0]; ++i)
    for (std::int64_t j = 0; j < n[1]; ++j)
      for (std::int64_t k = 0; k < n[2]; ++k, row += width) f(i * s[0] + j * s[1] + k * s[2], row);
}

// x as f32: x itself, or its rows widened (exactly) into `scratch`, which moves past them.
inline TensorView f32_rows(const TensorView& x, float*& scratch) {
  if (x.dtype == DType::f32) return x;
  float* dst = scratch;
  scratch += f32_rows_floats(x);
  const std::int64_t width = x.shape[x.rank - 1];
  with_elem(x.dtype, [&](auto e) {
    using T = decltype(e);
    const T* src = static_cast<const T*>(x.data);
    for_each_row(x, [&](std::int64_t from, std::int64_t to) {
      for (std::int64_t d = 0; d < width; ++d) dst[to + d] = to_float(src[from + d]);
    });
  });
  return TensorView::contiguous(dst, DType::f32, x.shape.data(), x.rank);
}

// The f32 view a layer writes for `out`: out itself, or rows in `scratch` (which moves past them)
// that narrow_rows() then stores into out.
inline OutputView f32_out(const OutputView& out, float*& scratch) {
  if (out.dtype == DType::f32) return out;
  float* rows = scratch;
  scratch += f32_rows_floats(out);
  return OutputView::contiguous(rows, DType::f32, out.shape.data(), out.rank);
}

// Stores f32_out's rows into out, rounded to nearest even (nothing when out is f32).
inline void narrow_rows(const OutputView& rows, const OutputView& out) {
  if (out.dtype == DType::f32) return;
  const auto* src = static_cast<const float*>(rows.data);
  const std::int64_t width = out.shape[out.rank - 1];
  for_each_row(out, [&](std::int64_t to, std::int64_t from) {
    for (std::int64_t d = 0; d < width; ++d)
      store_float(out.data, out.dtype, to + d, src[from + d]);
  });
}

}  // namespace cpuattn::detail
