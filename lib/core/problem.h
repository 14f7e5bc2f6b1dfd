// The validated, normalized form of one attention call, shared by every implementation.
// validate() is the only place that reads user-provided views; kernels read only a Problem.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "core/inline.h"
#include "cpuattn/cpuattn.h"

namespace cpuattn::detail {

// A rank-4 strided view with broadcast dimensions given stride 0.
struct Strided4 {
  const void* data = nullptr;
  DType dtype = DType::f32;
  std::int64_t s[4] = {0, 0, 0, 0};  // element strides of (b, h, i, j) or (b, h, l, d)
};

enum class MaskKind : std::uint8_t { none, boolean, additive };

struct Problem {
  std::int64_t B = 0, H = 0, Hkv = 0, Lq = 0, Lk = 0, D = 0, Dv = 0;
  std::int64_t group = 1;  // H / Hkv: query heads per K/V head
  double scale = 1.0;
  Causal causal = Causal::none;

  Strided4 q, k, v;  // strides over (b, h, l); d stride is 1
  void* out = nullptr;
  DType out_dtype = DType::f32;
  std::int64_t out_s[3] = {0, 0, 0};

  MaskKind mask_kind = MaskKind::none;
  Strided4 mask;  // strides over (b, h, i, j), 0 where broadcast

  // int8 K/V: f32 scale per (b, kv head, key); strides over (b, h, j). nullptr otherwise.
  const float* k_scale = nullptr;
  const float* v_scale = nullptr;
  std::int64_t k_scale_s[3] = {0, 0, 0};
  std::int64_t v_scale_s[3] = {0, 0, 0};

  const void* key_lengths = nullptr;  // nullptr: every batch has Lk keys
  DType key_lengths_dtype = DType::i64;

  void* lse = nullptr;  // f32/f64 [B, H, Lq] or nullptr
  DType lse_dtype = DType::f32;
  std::int64_t lse_s[3] = {0, 0, 0};
  void* weights = nullptr;  // f32/f64 [B, H, Lq, Lk] or nullptr
  DType weights_dtype = DType::f32;
  std::int64_t weights_s[4] = {0, 0, 0, 0};

  CPUATTN_ALWAYS_INLINE std::int64_t key_length(std::int64_t b) const {
    if (key_lengths == nullptr) return Lk;
    return key_lengths_dtype == DType::i32 ? static_cast<const std::int32_t*>(key_lengths)[b]
                                           : static_cast<const std::int64_t*>(key_lengths)[b];
  }

  // Keys query row i may see because of the causal mask and key lengths: [0, end).
  // Other masks are applied element-wise.
  CPUATTN_ALWAYS_INLINE std::int64_t key_end(std::int64_t b, std::int64_t i) const {
    std::int64_t end = key_length(b);
    if (causal == Causal::top_left) end = std::min(end, i + 1);
    if (causal == Causal::bottom_right) end = std::min(end, i + Lk - Lq + 1);
    return std::max<std::int64_t>(end, 0);
  }
};

// Validates every argument against the others and returns the normalized problem. Throws Error
// naming the argument and the shapes. `allow_f64` admits f64 tensors (the reference only).
Problem validate(const TensorView& q, const TensorView& k, const TensorView& v,
                 const OutputView& out, const AttentionOptions& opts, bool allow_f64);

}  // namespace cpuattn::detail
