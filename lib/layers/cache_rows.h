// One token row into a KV cache's storage, and the checks of a cache's dtype and scales, shared
// by KvCache and PagedKvCache.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "api/checks.h"
#include "core/dtypes.h"
#include "cpuattn/cpuattn.h"
#include "cpuattn/layers.h"

namespace cpuattn {

// A cache's dtype must be a K/V dtype (cpuattn.h's list).
inline void check_cache_dtype(const char* who, DType dtype) {
  if (is_kv_dtype(dtype)) return;
  std::string names;
  for (int i = 0; i < kNumDTypes; ++i) {
    if (!is_kv_dtype(static_cast<DType>(i))) continue;
    if (!names.empty()) names += ", ";
    names += dtype_name(static_cast<DType>(i));
  }
  detail::fail(std::string(who) + ": dtype " + dtype_name(dtype) + " is not a cache dtype (" +
               names + ")");
}

// Static scales (KvScales) go with a scaled dtype only: 1 or kv_heads of each, finite and > 0.
// Returns the side's kv_heads scales (empty: per-token scales).
inline std::vector<float> cache_scales(const char* who, DType dtype, const std::vector<float>& s,
                                       const char* side, std::int64_t kv_heads) {
  if (s.empty()) return {};
  if (!needs_scales(dtype))
    detail::fail(std::string(who) + ": scales." + side + " given for a " + dtype_name(dtype) +
                 " cache (scales are for scaled dtypes such as int8)");
  const auto n = static_cast<std::int64_t>(s.size());
  if (n != 1 && n != kv_heads)
    detail::fail(std::string(who) + ": scales." + side + " has " + std::to_string(n) +
                 " values; expected 1 (per tensor) or kv_heads = " + std::to_string(kv_heads) +
                 " (per head)");
  for (std::int64_t h = 0; h < n; ++h) {
    const float x = s[static_cast<std::size_t>(h)];
    if (!(std::isfinite(x) && x > 0.0f))
      detail::fail(std::string(who) + ": scales." + side + "[" + std::to_string(h) +
                   "] = " + std::to_string(x) + " must be finite and > 0");
  }
  return n == kv_heads ? s : std::vector<float>(static_cast<std::size_t>(kv_heads), s[0]);
}

// The f32 row store_cache_row converts through, one per thread and grown on demand: once a
// cache has stored a row of this width on this thread, storing allocates nothing (a steady-state
// decode step must not allocate).
inline std::vector<float>& conversion_row(std::int64_t width) {
  static thread_local std::vector<float> row;
  if (row.size() < static_cast<std::size_t>(width)) row.resize(static_cast<std::size_t>(width));
  return row;
}

// Stores `width` values of `t` (f32, bf16 or f16) starting at element offset `src` as the cache's
// `dtype` at `out`: a copy when the dtypes match, else through f32 in `row` (at least `width`
// long). A scaled dtype is quantized with the row's own scale, written to *row_scale, or (with
// row_scale null) with the head's static scale.
inline void store_cache_row(const TensorView& t, std::int64_t src, std::uint8_t* out, DType dtype,
                            std::int64_t width, float* row_scale, float head_scale,
                            std::vector<float>& row) {
  if (t.dtype == dtype) {
    const auto e = static_cast<std::int64_t>(dtype_size(dtype));
    std::memcpy(out, static_cast<const std::uint8_t*>(t.data) + src * e,
                static_cast<std::size_t>(width * e));
    return;
  }
  for (std::int64_t d = 0; d < width; ++d)
    row[static_cast<std::size_t>(d)] = detail::load_as_float(t.data, t.dtype, src + d);
  detail::with_elem(dtype, [&](auto e) {
    using T = decltype(e);
    if constexpr (detail::ElemTraits<T>::kScaled) {
      T* q = reinterpret_cast<T*>(out);
      if (row_scale != nullptr) {
        *row_scale = detail::quantize_row(row.data(), width, q);
      } else {
        detail::quantize_row(row.data(), width, head_scale, q);
      }
    } else {
      for (std::int64_t d = 0; d < width; ++d)
        detail::store_float(out, dtype, d, row[static_cast<std::size_t>(d)]);
    }
  });
}

// A cache of a scaled dtype holds finite values only: what check_finite_rows finds first.
inline void fail_not_storable(const char* who, const char* name, const std::string& at, float v,
                              DType dtype) {
  const std::string type = dtype_name(dtype);
  const bool vowel = std::string("aeiou").find(type[0]) != std::string::npos;
  detail::fail(std::string(who) + ": " + name + "[" + at + "] is " + std::to_string(v) +
               (vowel ? ", which an " : ", which a ") + type + " cache cannot hold");
}

}  // namespace cpuattn
