// Sinusoidal positional encoding and rotary position embedding.
//
// Precision: the angle pos * inv_freq and its sine and cosine are computed in double and rounded
// to float once. In float32 the angle itself is the problem: at pos = 1e5 the spacing of floats is
// ~8e-3, so a float angle is off by up to ~4e-3 rad before sinf even sees it, and the error grows
// linearly with the position. In double, the angle of a position up to ~1e7 is off by ~1e-9 rad,
// and std::sin/std::cos reduce large double arguments exactly, so every value is within about
// half a float ulp.
//
// Threads: work items are (position, batch) pairs in position-major order. A chunk of items
// computes each position's sines and cosines once and reuses them for every batch and head it
// covers. Every element is computed by the same code from the same inputs whichever chunk holds
// it, so results do not depend on the number of threads or on how the items are split.
#include "cpuattn/positional.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "api/checks.h"
#include "api/context_impl.h"
#include "layers/for_items.h"
#include "layers/rope_frequencies.h"

namespace cpuattn {
namespace {

// Positions must be exact in double so that the angle is computed from the true position.
constexpr std::int64_t kMaxPosition = std::int64_t{1} << 53;

// A double sine plus cosine costs about as much as this many element updates.
constexpr double kSinCosWork = 16;

using detail::fail;
using detail::shape_str;

std::string num_str(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

// The checks every tensor argument of this file shares: rank in range, data present, sizes >= 1,
// strides >= 0 with a contiguous last dimension, f32, offsets that fit in 64 bits and in the
// address space, and no two elements at the same address (the update is in place: an aliased
// element would be updated twice, by whichever thread gets there).
void check_tensor(const char* name, const TensorView& t, int min_rank, int max_rank) {
  detail::check_view(name, t, min_rank, max_rank);
  detail::check_dtype(name, t, /*allow_f64=*/false);
  detail::extent_of(name, t);
  detail::check_no_self_overlap(name, t);
}

void check_positions(const char* name, const TensorView& t, std::int64_t position_offset,
                     std::int64_t L) {
  if (position_offset < 0) {
    fail("position_offset must be >= 0, got " + std::to_string(position_offset));
  }
  if (position_offset > kMaxPosition - L) {
    fail("position_offset " + std::to_string(position_offset) + " + L " + std::to_string(L) +
         " (positions of " + name + " " + shape_str(t) +
         ") exceeds 2^53: positions must be exact in double precision");
  }
}

void check_base(const char* name, double base) {
  if (!std::isfinite(base) || base <= 1) {
    fail(std::string(name) + " must be finite and > 1, got " + num_str(base));
  }
}

// base^(-2i/n) for i in [0, count), the angular frequencies shared by every position.
std::vector<double> inverse_frequencies(double base, std::int64_t count, std::int64_t n) {
  std::vector<double> f(static_cast<std::size_t>(count));
  for (std::int64_t i = 0; i < count; ++i) {
    f[static_cast<std::size_t>(i)] =
        std::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(n));
  }
  return f;
}

// A sinusoidal encoding as [B, L, d] (B = 1 for a table). add: x += PE, else x = PE.
void sinusoidal(const OutputView& x, std::int64_t position_offset, double base, Context* context,
                bool add) {
  const bool batched = x.rank == 3;
  const std::int64_t B = batched ? x.shape[0] : 1;
  const std::int64_t L = x.shape[batched ? 1 : 0];
  const std::int64_t d = x.shape[batched ? 2 : 1];
  const std::int64_t sb = batched ? x.strides[0] : 0;
  const std::int64_t sl = x.strides[batched ? 1 : 0];
  float* const data = static_cast<float*>(x.data);
  const std::int64_t pairs = (d + 1) / 2;
  const std::vector<double> inv_freq = inverse_frequencies(base, pairs, d);

  const double work = static_cast<double>(d) + static_cast<double>(pairs) * kSinCosWork / B;
  detail::for_items(context, L * B, work,
                    [&](std::int64_t begin, std::int64_t end, detail::Scratch& s) {
                      float* const pe = s.get(static_cast<std::size_t>(d));
                      std::int64_t row_l = -1;  // the position whose encoding `pe` holds
                      for (std::int64_t t = begin; t < end; ++t) {
                        const std::int64_t l = t / B, b = t % B;
                        if (l != row_l) {
                          const auto pos = static_cast<double>(position_offset + l);
                          for (std::int64_t i = 0; i < pairs; ++i) {
                            const double angle = pos * inv_freq[static_cast<std::size_t>(i)];
                            pe[2 * i] = static_cast<float>(std::sin(angle));
                            if (2 * i + 1 < d) pe[2 * i + 1] = static_cast<float>(std::cos(angle));
                          }
                          row_l = l;
                        }
                        float* const row = data + b * sb + l * sl;
                        if (add) {
                          for (std::int64_t c = 0; c < d; ++c) row[c] += pe[c];
                        } else {
                          std::copy(pe, pe + d, row);
                        }
                      }
                    });
}

}  // namespace

void sinusoidal_table(const OutputView& table, std::int64_t position_offset, double base,
                      Context* context) {
  check_tensor("table", table, 2, 2);
  check_base("base", base);
  check_positions("table", table, position_offset, table.shape[0]);
  sinusoidal(table, position_offset, base, context, /*add=*/false);
}

void add_sinusoidal(const OutputView& x, std::int64_t position_offset, double base,
                    Context* context) {
  check_tensor("x", x, 2, 3);
  check_base("base", base);
  check_positions("x", x, position_offset, x.shape[x.rank - 2]);
  sinusoidal(x, position_offset, base, context, /*add=*/true);
}

void apply_rope(const OutputView& x, std::int64_t position_offset, const RopeOptions& opts,
                Context* context) {
  check_tensor("x", x, 4, 4);
  check_base("opts.base", opts.base);
  if (opts.style != RopeStyle::half && opts.style != RopeStyle::interleaved) {
    fail("opts.style has invalid value " + std::to_string(static_cast<int>(opts.style)) +
         "; expected RopeStyle::half or RopeStyle::interleaved");
  }
  const std::int64_t B = x.shape[0], H = x.shape[1], L = x.shape[2], D = x.shape[3];
  if (opts.rotary_dim < 0 || opts.rotary_dim > D) {
    fail("opts.rotary_dim must be in [0, D] (0 = D) for x " + shape_str(x) + ", got " +
         std::to_string(opts.rotary_dim));
  }
  const std::int64_t R = opts.rotary_dim == 0 ? D : opts.rotary_dim;
  if (R % 2 != 0) {
    fail("opts.rotary_dim must be even (it is split into pairs), got " +
         (opts.rotary_dim == 0 ? "0, which means D = " + std::to_string(D) + " of x " + shape_str(x)
                               : std::to_string(R)));
  }
  check_positions("x", x, position_offset, L);
  detail::check_rope_scaling("opts.scaling", opts.scaling);

  float* const data = static_cast<float*>(x.data);
  const std::int64_t sb = x.strides[0], sh = x.strides[1], sl = x.strides[2];
  const std::int64_t half = R / 2;
  const bool interleaved = opts.style == RopeStyle::interleaved;
  const detail::RopeFrequencies freq = detail::rope_frequencies(opts, R);

  const double work = static_cast<double>(H * R) + static_cast<double>(half) * kSinCosWork / B;
  detail::for_items(
      context, L * B, work, [&](std::int64_t begin, std::int64_t end, detail::Scratch& s) {
        float* const cosv = s.get(static_cast<std::size_t>(2 * half));
        float* const sinv = cosv + half;
        std::int64_t row_l = -1;  // the position whose angles cosv/sinv hold
        for (std::int64_t t = begin; t < end; ++t) {
          const std::int64_t l = t / B, b = t % B;
          if (l != row_l) {
            detail::rope_turns(freq, static_cast<double>(position_offset + l), cosv, sinv);
            row_l = l;
          }
          for (std::int64_t h = 0; h < H; ++h) {
            detail::rope_rotate(data + b * sb + h * sh + l * sl, half, interleaved, cosv, sinv);
          }
        }
      });
}

}  // namespace cpuattn
