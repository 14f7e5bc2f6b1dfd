// The softmax bookkeeping every attention implementation shares: the base-2 units the fast path
// works in, and how a row's running state (max m, sum l, unnormalized accumulator) becomes its
// output and log-sum-exp. The flash kernel's last step and the split-key merge both end here.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>

namespace cpuattn::detail {

// The fast path folds log2(e) into the scale (and into additive masks) so that its softmax runs
// on exp2, which is cheaper than exp; m is then in log2 units.
inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kLn2 = 0.6931471805599453f;

// The range of that log2 domain, for the finite values a caller gives in natural units. Additive
// mask entries saturate at +-kMaxLog2 = 2^126 in log2 units (+-kMaxNatural, about 5.9e37, in the
// caller's): the sum of a score and a mask term then stays finite, so a finite mask never makes
// inf - inf = NaN (Hugging Face pads with float32's lowest, -3.4e38, which times log2(e)
// overflowed). Mask values beyond +-kMaxNatural act as +-kMaxNatural, in the reference too
// (mask_term). Sinks must lie within +-kMaxNatural and ALiBi slopes within +-kMaxAlibiSlope (a
// slope times a distance below 2^31 stays below 2^126 in log2 units): validation rejects more.
inline constexpr float kMaxLog2 = 0x1p126f;
inline constexpr double kMaxNatural = 0x1p126 / 1.4426950408889634;
inline constexpr double kMaxAlibiSlope = 1e20;

// A row's state after its last key: m = max score (log2 units; -inf when every key was masked,
// NaN when a NaN reached it), l = sum of 2^(s - m), and the head's sink logit (log2 units; -inf
// without one), which joins the denominator only (AttentionOptions::sinks).
struct RowState {
  float m, l;
  float sink = -std::numeric_limits<float>::infinity();
  bool empty() const { return m == -std::numeric_limits<float>::infinity(); }
  // Multiplies the accumulator into the output: 1 / (l + 2^(sink - m)), or 0 for a row with no
  // visible key (out = 0 by definition, with or without a sink). Without a sink the added term is
  // exactly 0 (NaN for a NaN m), so no exp2 is called: a libm call per row was a third of the
  // output epilogue of a short sequence (docs/performance.md#dm-out-scale-no-sink). A sink far
  // above m makes it inf and the scale 0, the limit of the true value.
  float out_scale() const {
    if (empty()) return 0.0f;
    if (sink == -std::numeric_limits<float>::infinity()) return std::isnan(m) ? m : 1.0f / l;
    return 1.0f / (l + std::exp2(sink - m));
  }
  // Natural-log log-sum-exp of the row's scaled, masked scores and the sink; -inf for a row with
  // neither.
  float lse() const {
    const float neg_inf = -std::numeric_limits<float>::infinity();
    if (empty()) return sink == neg_inf ? neg_inf : sink * kLn2;
    if (sink == neg_inf) return (m + std::log2(l)) * kLn2;
    const float top = std::isnan(m) ? m : std::max(m, sink);
    return (top + std::log2(l * std::exp2(m - top) + std::exp2(sink - top))) * kLn2;
  }
};

}  // namespace cpuattn::detail
