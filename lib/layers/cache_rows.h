// One token row into a KV cache's storage, shared by KvCache and PagedKvCache.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "core/dtypes.h"
#include "cpuattn/cpuattn.h"

namespace cpuattn {

// Stores `width` values of `t` (f32, bf16 or f16) starting at element offset `src` as the cache's
// `dtype` at `out`: a copy when the dtypes match, else through f32 in `row` (at least `width`
// long), int8 quantized per row with its scale written to *scale (quantize_int8).
inline void store_cache_row(const TensorView& t, std::int64_t src, std::uint8_t* out, DType dtype,
                            std::int64_t width, float* scale, std::vector<float>& row) {
  if (t.dtype == dtype) {
    const auto e = static_cast<std::int64_t>(dtype_size(dtype));
    std::memcpy(out, static_cast<const std::uint8_t*>(t.data) + src * e,
                static_cast<std::size_t>(width * e));
    return;
  }
  for (std::int64_t d = 0; d < width; ++d)
    row[static_cast<std::size_t>(d)] = detail::load_as_float(t.data, t.dtype, src + d);
  if (dtype == DType::i8) {
    *scale = quantize_int8(row.data(), width, reinterpret_cast<std::int8_t*>(out));
  } else {
    for (std::int64_t d = 0; d < width; ++d)
      detail::store_float(out, dtype, d, row[static_cast<std::size_t>(d)]);
  }
}

}  // namespace cpuattn
