// Positional encodings: the sinusoidal table of "Attention Is All You Need" and rotary position
// embedding (RoPE), applied in place to the views the attention entry points take.
//
// Angles and their sine and cosine are computed in double precision and rounded to float once, so
// results stay accurate at large positions (a float32 angle of 1e5 rad is off by ~4e-3 rad).
// Positions are integers in [0, 2^53], exact in double precision.
//
// Like every entry point, these validate all arguments before writing anything: on bad input
// they throw cpuattn::Error naming the argument and its shape, and leave the tensor untouched.
// Results do not depend on the number of threads.
//
// This header is plain C++20: no SIMD library or threading library types appear in it.
#pragma once

#include <cstdint>

#include "cpuattn/cpuattn.h"

namespace cpuattn {

// Sinusoidal encoding (Vaswani et al.):
//   PE(pos, 2i) = sin(pos / base^(2i/d)),  PE(pos, 2i+1) = cos(pos / base^(2i/d)).
// Writes the rows of positions position_offset .. position_offset+L-1 into `table`, an f32 [L, d]
// view (last dimension contiguous, any row stride). Any d >= 1; for odd d the last column is a
// sine. base must be finite and > 1.
CPUATTN_API void sinusoidal_table(const OutputView& table, std::int64_t position_offset = 0,
                                  double base = 10000.0, Context* context = nullptr);

// In place: x[b, l, :] += PE(position_offset + l). x is an f32 [L, d] or [B, L, d] view (any
// non-negative strides, last dimension contiguous).
CPUATTN_API void add_sinusoidal(const OutputView& x, std::int64_t position_offset = 0,
                                double base = 10000.0, Context* context = nullptr);

// Which dimensions of a head form the rotated pairs (R = rotary dimension):
//   half:        (j, j + R/2)  GPT-NeoX, Llama
//   interleaved: (2j, 2j + 1)  RoFormer, GPT-J
enum class RopeStyle : std::uint8_t { half, interleaved };

// How a model stretches its rotation frequencies beyond the context it was trained on (the
// `rope_scaling` of a Hugging Face config). With f_j = base^(-2j/R), j < R/2, and s = factor:
//   none:   f_j.
//   linear: f_j / s (position interpolation; positions divided by s).
//   ntk:    NTK-aware, static: base' = base * s^(R/(R-2)) in place of base, so f_0 stays and the
//           lowest frequency is divided by s.
//   llama3: Llama 3.1's rule. Wavelength w_j = 2 pi / f_j, L0 = original_max_position:
//           w_j < L0 / high_freq_factor: f_j; w_j > L0 / low_freq_factor: f_j / s; between,
//           (1 - t) f_j / s + t f_j with t = (L0 / w_j - low_freq_factor) /
//           (high_freq_factor - low_freq_factor).
//   yarn:   YaRN (Peng et al. 2023, as Hugging Face computes it). d(r) = R ln(L0 / (2 pi r)) /
//           (2 ln base); lo = max(floor(d(beta_fast)), 0), hi = min(ceil(d(beta_slow)), R - 1)
//           (hi += 0.001 if equal); ramp t_j = clamp((j - lo) / (hi - lo), 0, 1);
//           f'_j = t_j f_j / s + (1 - t_j) f_j; cos and sin are multiplied by attention_factor
//           (0 = 0.1 ln s + 1), which scales q.k by its square.
// Fields a type does not use are ignored.
enum class RopeScalingType : std::uint8_t { none, linear, ntk, llama3, yarn };

struct RopeScaling {
  RopeScalingType type = RopeScalingType::none;
  double factor = 1.0;                        // s: finite and >= 1
  std::int64_t original_max_position = 8192;  // L0 (llama3, yarn): >= 1
  double low_freq_factor = 1.0;               // llama3: finite, > 0
  double high_freq_factor = 4.0;              // llama3: finite, > low_freq_factor
  double beta_fast = 32.0;                    // yarn: finite, > beta_slow
  double beta_slow = 1.0;                     // yarn: finite, > 0
  double attention_factor = 0.0;              // yarn: finite, >= 0; 0 = 0.1 ln s + 1
};

struct RopeOptions {
  double base = 10000.0;  // must be finite and > 1
  RopeStyle style = RopeStyle::half;
  // R, the number of leading dimensions of each head that are rotated. 0 = D. Must be even and
  // <= D; dimensions R..D-1 are left as they are (partial rotary, e.g. GPT-NeoX, Phi).
  std::int64_t rotary_dim = 0;
  RopeScaling scaling = {};
};

// Llama 3.1's rotary embedding (also Llama 3.2 and 3.3's published rope_theta and rope_scaling):
// theta 500000, llama3 scaling by 8 over 8192 original positions, low_freq_factor 1,
// high_freq_factor 4.
inline RopeOptions llama31_rope() {
  return RopeOptions{.base = 500000.0,
                     .scaling = {.type = RopeScalingType::llama3,
                                 .factor = 8,
                                 .original_max_position = 8192,
                                 .low_freq_factor = 1,
                                 .high_freq_factor = 4}};
}

// Rotary position embedding, in place. x is a logical [B, H, L, D] f32 view (any non-negative
// strides, last dimension contiguous; e.g. OutputView::blhd over [B, L, H, D] memory). Row l of
// every (b, h) is at position p = position_offset + l; pair j turns by the angle p * f'_j (f'_j
// the frequency after opts.scaling, above):  (x1, x2) -> m (x1 cos - x2 sin, x1 sin + x2 cos),
// m = 1 except for YaRN's attention factor.
CPUATTN_API void apply_rope(const OutputView& x, std::int64_t position_offset,
                            const RopeOptions& opts = {}, Context* context = nullptr);

}  // namespace cpuattn
