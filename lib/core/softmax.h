// The softmax bookkeeping every attention implementation shares: the base-2 units the fast path
// works in, and how a row's running state (max m, sum l, unnormalized accumulator) becomes its
// output and log-sum-exp. The flash kernel's last step and the split-key merge both end here.
#pragma once

#include <cmath>
#include <limits>

namespace cpuattn::detail {

// The fast path folds log2(e) into the scale (and into additive masks) so that its softmax runs
// on exp2, which is cheaper than exp; m is then in log2 units.
inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kLn2 = 0.6931471805599453f;

// A row's state after its last key: m = max score (log2 units; -inf when every key was masked,
// NaN when a NaN reached it), l = sum of 2^(s - m).
struct RowState {
  float m, l;
  bool empty() const { return m == -std::numeric_limits<float>::infinity(); }
  // Multiplies the accumulator into the output: 1 / l, or 0 for a row with no visible key
  // (out = 0 by definition).
  float out_scale() const { return empty() ? 0.0f : 1.0f / l; }
  // Natural-log log-sum-exp of the row's scaled, masked scores; -inf for a row with no key.
  float lse() const {
    return empty() ? -std::numeric_limits<float>::infinity() : (m + std::log2(l)) * kLn2;
  }
};

}  // namespace cpuattn::detail
