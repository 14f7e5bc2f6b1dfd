// The validated, normalized form of one attention call, shared by every implementation.
// validate() is the only place that reads user-provided views; kernels read only a Problem.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

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

  // Variants (AttentionOptions): window sides (-1 = unbounded), soft-cap (0 = off), ALiBi slopes
  // per query head (given, or the standard ones), sink logits per query head.
  std::int64_t window_left = -1, window_right = -1;
  double softcap = 0;
  bool alibi_default = false;
  const float* alibi = nullptr;
  std::int64_t alibi_s = 0, alibi_bs = 0;  // strides over heads and (slopes [B, H]) batches
  const float* sinks = nullptr;
  std::int64_t sinks_s = 0;

  // Paged K/V (attention over a paged cache, api/paged.cpp): key j of batch b is row
  // j & (page_size - 1) of page pages[b * pages_s + (j >> page_shift)], and the [0] strides of
  // k, v, k_scale_s and v_scale_s step from one page to the next. nullptr: K/V are plain strided
  // tensors. Every kernel reads K/V rows through key_off(), and a run of keys that shares a page
  // (page_run()) is contiguous with stride s[2].
  const std::int32_t* pages = nullptr;
  std::int64_t pages_s = 0;
  int page_shift = 0;

  // Element offset of key j of batch b in a K/V tensor (or its scales) with strides s, before the
  // head term hk * s[1].
  CPUATTN_ALWAYS_INLINE std::int64_t key_off(const std::int64_t* s, std::int64_t b,
                                             std::int64_t j) const {
    if (pages == nullptr) return b * s[0] + j * s[2];
    const std::int64_t mask = (std::int64_t{1} << page_shift) - 1;
    return static_cast<std::int64_t>(pages[b * pages_s + (j >> page_shift)]) * s[0] +
           (j & mask) * s[2];
  }
  // Keys from j on that lie in j's page (unbounded without pages).
  CPUATTN_ALWAYS_INLINE std::int64_t page_run(std::int64_t j) const {
    if (pages == nullptr) return std::numeric_limits<std::int64_t>::max();
    return (std::int64_t{1} << page_shift) - (j & ((std::int64_t{1} << page_shift) - 1));
  }

  bool has_alibi() const { return alibi != nullptr || alibi_default; }
  // ALiBi slope of query head h of batch b (0 without ALiBi). The standard slopes (Press et al.):
  // for the first n = 2^floor(log2 H) heads 2^(-8(h+1)/n), then 2^(-4(2k+1)/n) for head n + k.
  double alibi_slope(std::int64_t b, std::int64_t h) const {
    if (alibi != nullptr) return alibi[b * alibi_bs + h * alibi_s];
    if (!alibi_default) return 0.0;
    std::int64_t n = 1;
    while (2 * n <= H) n *= 2;
    const double e = h < n ? -8.0 * static_cast<double>(h + 1) / static_cast<double>(n)
                           : -4.0 * static_cast<double>(2 * (h - n) + 1) / static_cast<double>(n);
    return std::exp2(e);
  }
  // Sink logit of query head h in natural units; -inf without one.
  double sink(std::int64_t h) const {
    return sinks == nullptr ? -std::numeric_limits<double>::infinity() : sinks[h * sinks_s];
  }
  // Query row i's position among the keys (bottom-right aligned).
  CPUATTN_ALWAYS_INLINE std::int64_t pos(std::int64_t i) const { return i + Lk - Lq; }

  CPUATTN_ALWAYS_INLINE std::int64_t key_length(std::int64_t b) const {
    if (key_lengths == nullptr) return Lk;
    return key_lengths_dtype == DType::i32 ? static_cast<const std::int32_t*>(key_lengths)[b]
                                           : static_cast<const std::int64_t*>(key_lengths)[b];
  }

  // Keys query row i may see because of the causal mask, key lengths and the window:
  // [key_begin, key_end), both non-decreasing in i. Other masks are applied element-wise.
  CPUATTN_ALWAYS_INLINE std::int64_t key_end(std::int64_t b, std::int64_t i) const {
    std::int64_t end = key_length(b);
    if (causal == Causal::top_left) end = std::min(end, i + 1);
    if (causal == Causal::bottom_right) end = std::min(end, pos(i) + 1);
    // A window side of any size (up to INT64_MAX) is exact: pos(i) + window_right is formed only
    // where it is below `end` (|pos(i)| and end are sizes, far from overflow).
    if (window_right >= 0 && window_right < end - pos(i)) end = pos(i) + window_right + 1;
    return std::max<std::int64_t>(end, 0);
  }
  CPUATTN_ALWAYS_INLINE std::int64_t key_begin(std::int64_t i) const {
    if (window_left < 0 || window_left >= pos(i)) return 0;
    return std::min(pos(i) - window_left, Lk);
  }
};

// base moved by `elements` elements of `dtype` (a packed or paged batch's per-sequence views).
template <class T>
T* advance(T* base, DType dtype, std::int64_t elements) {
  using Byte = std::conditional_t<std::is_const_v<T>, const char, char>;
  return reinterpret_cast<T*>(reinterpret_cast<Byte*>(base) +
                              elements * static_cast<std::int64_t>(dtype_size(dtype)));
}

// alibi_slopes f32 [H] or [batches, H] (per sequence: batches is B, or the number of sequences of
// a packed batch), every value finite: sets p.alibi, alibi_s and alibi_bs.
void check_alibi_slopes(const TensorView& t, std::int64_t batches, Problem& p);

// Validates every argument against the others and returns the normalized problem. Throws Error
// naming the argument and the shapes. `allow_f64` admits f64 tensors (the reference only).
Problem validate(const TensorView& q, const TensorView& k, const TensorView& v,
                 const OutputView& out, const AttentionOptions& opts, bool allow_f64);

}  // namespace cpuattn::detail
