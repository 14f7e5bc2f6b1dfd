// Positional encodings against a long double reference: the sinusoidal table and its in-place
// addition, rotary embedding in both pair styles (full and partial rotary, strided layouts, large
// positions), its invariants (norm, relative position), determinism, and argument checks.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <numbers>
#include <sstream>
#include <string>
#include <vector>

#include "cpuattn/positional.h"
#include "test_util.h"

namespace cpuattn::test {
namespace {

using ld = long double;

// Reference: everything in long double (64-bit mantissa), with glibc's sinl/cosl doing their own
// exact argument reduction.
ld ref_inv_freq(ld base, std::int64_t i, std::int64_t n) {
  return powl(base, -2.0L * static_cast<ld>(i) / static_cast<ld>(n));
}

// The frequencies after a RopeScaling and YaRN's attention factor, written the way Hugging Face's
// modeling_rope_utils computes them (whole vectors, masks, the correction range), in long double.
struct RefFreqs {
  std::vector<ld> inv_freq;
  ld m = 1;
};

RefFreqs ref_freqs(const RopeOptions& o, std::int64_t R) {
  const RopeScaling& sc = o.scaling;
  const ld dim = static_cast<ld>(R), s = sc.factor, L0 = static_cast<ld>(sc.original_max_position);
  ld base = o.base;
  if (sc.type == RopeScalingType::ntk && R > 2) base *= powl(s, dim / (dim - 2));
  RefFreqs r;
  for (std::int64_t i = 0; i < R / 2; ++i) r.inv_freq.push_back(ref_inv_freq(base, i, R));
  const ld two_pi = 2 * acosl(-1.0L);
  switch (sc.type) {
    case RopeScalingType::linear:
      for (ld& f : r.inv_freq) f /= s;
      break;
    case RopeScalingType::llama3: {
      const ld low_wavelen = L0 / sc.low_freq_factor, high_wavelen = L0 / sc.high_freq_factor;
      for (ld& f : r.inv_freq) {
        const ld wavelen = two_pi / f;
        const ld scaled = wavelen > low_wavelen ? f / s : f;
        const ld smooth = (L0 / wavelen - sc.low_freq_factor) /
                          (static_cast<ld>(sc.high_freq_factor) - sc.low_freq_factor);
        const bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
        f = medium ? (1 - smooth) * scaled / s + smooth * scaled : scaled;
      }
      break;
    }
    case RopeScalingType::yarn: {
      auto correction_dim = [&](ld rotations) {
        return dim * logl(L0 / (rotations * two_pi)) / (2 * logl(base));
      };
      const ld low = std::max(floorl(correction_dim(sc.beta_fast)), 0.0L);
      ld high = std::min(ceill(correction_dim(sc.beta_slow)), dim - 1);
      if (low == high) high += 0.001L;
      for (std::int64_t i = 0; i < R / 2; ++i) {
        const ld ramp = std::clamp((static_cast<ld>(i) - low) / (high - low), 0.0L, 1.0L);
        const ld extrapolation_factor = 1 - ramp;
        ld& f = r.inv_freq[static_cast<std::size_t>(i)];
        f = (f / s) * (1 - extrapolation_factor) + f * extrapolation_factor;
      }
      r.m = sc.attention_factor > 0 ? static_cast<ld>(sc.attention_factor)
                                    : (s > 1 ? 0.1L * logl(s) + 1 : 1.0L);
      break;
    }
    default:
      break;
  }
  return r;
}

ld ref_pe(std::int64_t pos, std::int64_t c, std::int64_t d, ld base = 10000.0L) {
  const ld angle = static_cast<ld>(pos) * ref_inv_freq(base, c / 2, d);
  return c % 2 == 0 ? sinl(angle) : cosl(angle);
}

// The spacing of floats at |v|.
double float_ulp(double v) {
  const float f = std::abs(static_cast<float>(v));
  return static_cast<double>(std::nextafter(f, std::numeric_limits<float>::infinity()) - f);
}

// A few float ulps of the value, plus an absolute floor for values near zero.
double pe_tolerance(double want) { return 2 * float_ulp(want) + 1e-7; }

// Compares a [L, d] table (rows `row_stride` apart) with the reference; names the worst element.
::testing::AssertionResult table_matches(const float* got, std::int64_t L, std::int64_t d,
                                         std::int64_t row_stride, std::int64_t offset,
                                         double base = 10000.0) {
  double worst = 0;
  std::int64_t wl = 0, wc = 0;
  for (std::int64_t l = 0; l < L; ++l) {
    for (std::int64_t c = 0; c < d; ++c) {
      const double want = static_cast<double>(ref_pe(offset + l, c, d, base));
      const double excess = std::abs(got[l * row_stride + c] - want) - pe_tolerance(want);
      if (excess > worst) worst = excess, wl = l, wc = c;
    }
  }
  if (worst > 0) {
    const double want = static_cast<double>(ref_pe(offset + wl, wc, d, base));
    return ::testing::AssertionFailure()
           << "worst element: position " << offset + wl << ", column " << wc << " of d=" << d
           << ": got " << got[wl * row_stride + wc] << ", want " << want << ", |diff| "
           << std::abs(got[wl * row_stride + wc] - want) << " > tolerance " << pe_tolerance(want);
  }
  return ::testing::AssertionSuccess();
}

// Random values of magnitude 0.5..1.5 and random sign: never zero.
std::vector<float> nonzero_floats(std::size_t n, std::uint32_t seed) {
  std::vector<float> v = random_floats(n, seed, 0.5f, 1.5f);
  const std::vector<float> sign = random_floats(n, seed + 1);
  for (std::size_t i = 0; i < n; ++i) v[i] = sign[i] < 0 ? -v[i] : v[i];
  return v;
}

// ---------------------------------------------------------------------------------------------
// Sinusoidal

TEST(Sinusoidal, TableMatchesReference) {
  for (std::int64_t d : {1, 3, 7, 64, 65}) {
    for (std::int64_t offset : {0, 1, 100000, 12345678}) {
      const std::int64_t L = 37;
      std::vector<float> t(static_cast<std::size_t>(L * d), -7.0f);
      sinusoidal_table(f32_view(t.data(), {L, d}), offset);
      EXPECT_TRUE(table_matches(t.data(), L, d, d, offset)) << "d=" << d << " offset=" << offset;
    }
  }
}

TEST(Sinusoidal, TableOddColumnsAreCosinesAndLastOddColumnIsSine) {
  std::vector<float> t(3 * 5);
  sinusoidal_table(f32_view(t.data(), {3, 5}), 0);
  // Position 0: sin(0) = 0 in even columns, cos(0) = 1 in odd ones; d = 5 ends on a sine.
  for (int c = 0; c < 5; ++c) EXPECT_EQ(t[static_cast<std::size_t>(c)], c % 2 ? 1.0f : 0.0f);
  // Column 0 has frequency 1 for any d: sin(pos).
  EXPECT_FLOAT_EQ(t[5 * 2], static_cast<float>(std::sin(2.0)));
}

TEST(Sinusoidal, TableStridedRowsAndOtherBase) {
  const std::int64_t L = 20, d = 9, stride = 13;
  const float kPad = 555.0f;
  std::vector<float> buf(static_cast<std::size_t>(L * stride), kPad);
  OutputView v = f32_view(buf.data(), {L, d});
  v.strides = {stride, 1};
  sinusoidal_table(v, 54321, 500000.0);
  EXPECT_TRUE(table_matches(buf.data(), L, d, stride, 54321, 500000.0));
  for (std::int64_t l = 0; l < L; ++l) {
    for (std::int64_t c = d; c < stride; ++c) {
      ASSERT_EQ(buf[static_cast<std::size_t>(l * stride + c)], kPad) << "padding written";
    }
  }
}

TEST(Sinusoidal, LargeTableMatchesReference) {  // big enough to run in parallel
  const std::int64_t L = 2048, d = 64;
  std::vector<float> t(static_cast<std::size_t>(L * d));
  sinusoidal_table(f32_view(t.data(), {L, d}), 9999000);
  EXPECT_TRUE(table_matches(t.data(), L, d, d, 9999000));
}

// The tolerance is tight enough to catch the usual float32 implementation: at position ~1e5 its
// angle is off by ~4e-3 rad.
TEST(Sinusoidal, NaiveFloatImplementationFailsTheTolerance) {
  const std::int64_t L = 16, d = 64, offset = 100000;
  std::vector<float> naive(static_cast<std::size_t>(L * d));
  for (std::int64_t l = 0; l < L; ++l) {
    for (std::int64_t c = 0; c < d; ++c) {
      const float inv_freq = std::pow(10000.0f, -static_cast<float>(2 * (c / 2)) / d);
      const float angle = static_cast<float>(offset + l) * inv_freq;
      naive[static_cast<std::size_t>(l * d + c)] = c % 2 ? cosf(angle) : sinf(angle);
    }
  }
  const ::testing::AssertionResult r = table_matches(naive.data(), L, d, d, offset);
  EXPECT_FALSE(r) << "the naive float32 table passed; the tolerance is too loose";
  double worst = 0;
  for (std::int64_t l = 0; l < L; ++l) {
    for (std::int64_t c = 0; c < d; ++c) {
      worst = std::max(worst, std::abs(naive[static_cast<std::size_t>(l * d + c)] -
                                       static_cast<double>(ref_pe(offset + l, c, d))));
    }
  }
  EXPECT_GT(worst, 1e-4);
  // The library, on the same positions, passes.
  std::vector<float> t(static_cast<std::size_t>(L * d));
  sinusoidal_table(f32_view(t.data(), {L, d}), offset);
  EXPECT_TRUE(table_matches(t.data(), L, d, d, offset));
}

// x += PE on a [B, L, d] view with strides {sb, sl, 1}, checked element by element; the gaps
// between rows must stay as they were.
void check_add(std::int64_t B, std::int64_t L, std::int64_t d, std::int64_t sl, std::int64_t sb,
               std::int64_t offset, std::uint32_t seed) {
  SCOPED_TRACE("B=" + std::to_string(B) + " L=" + std::to_string(L) + " d=" + std::to_string(d) +
               " sl=" + std::to_string(sl) + " sb=" + std::to_string(sb) +
               " offset=" + std::to_string(offset));
  const auto size = static_cast<std::size_t>((B - 1) * sb + (L - 1) * sl + d);
  const std::vector<float> orig = nonzero_floats(size, seed);
  std::vector<float> x = orig;
  OutputView v = f32_view(x.data(), {B, L, d});
  v.strides = {sb, sl, 1};
  add_sinusoidal(v, offset);
  double worst = 0, worst_want = 0;
  std::int64_t wi = -1, wl = 0;
  std::vector<bool> inside(x.size(), false);
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t l = 0; l < L; ++l) {
      for (std::int64_t c = 0; c < d; ++c) {
        const std::int64_t i = b * sb + l * sl + c;
        inside[static_cast<std::size_t>(i)] = true;
        const ld want =
            static_cast<ld>(orig[static_cast<std::size_t>(i)]) + ref_pe(offset + l, c, d);
        const double excess = std::abs(x[static_cast<std::size_t>(i)] - static_cast<double>(want)) -
                              pe_tolerance(static_cast<double>(want));
        if (excess > worst) worst = excess, wi = i, wl = l, worst_want = static_cast<double>(want);
      }
    }
  }
  EXPECT_EQ(wi, -1) << "worst element: flat index " << wi << ", position " << offset + wl
                    << ": got " << x[static_cast<std::size_t>(wi)] << ", want " << worst_want
                    << " (x was " << orig[static_cast<std::size_t>(wi)]
                    << "), exceeds tolerance by " << worst;
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (!inside[i]) {
      ASSERT_EQ(x[i], orig[i]) << "gap element " << i << " written";
    }
  }
}

TEST(Sinusoidal, AddMatchesReference) {
  for (std::int64_t offset : {0, 100000}) {
    check_add(3, 50, 33, 33, 50 * 33, offset, 1);          // contiguous
    check_add(2, 17, 64, 64 + 5, 17 * 69 + 7, offset, 2);  // padded rows and batches
    check_add(2, 9, 7, 7, 9 * 7, offset, 3);               // odd d
    check_add(2, 1024, 64, 64, 1024 * 64, offset, 4);      // parallel
    check_add(300, 4, 64, 64 * 300, 64, offset, 5);        // [L, B, d] memory, many batches
  }
}

TEST(Sinusoidal, AddRank2EqualsTablePlusX) {
  const std::int64_t L = 11, d = 6;
  const std::vector<float> orig = nonzero_floats(static_cast<std::size_t>(L * d), 9);
  std::vector<float> x = orig, t(orig.size());
  add_sinusoidal(f32_view(x.data(), {L, d}), 77);
  sinusoidal_table(f32_view(t.data(), {L, d}), 77);
  for (std::size_t i = 0; i < x.size(); ++i) ASSERT_EQ(x[i], orig[i] + t[i]) << i;
}

// ---------------------------------------------------------------------------------------------
// RoPE

struct RopeCase {
  std::int64_t D, rotary_dim;  // rotary_dim 0 = D
};

// Index of the two elements of pair j within a head.
std::pair<std::int64_t, std::int64_t> pair_index(RopeStyle style, std::int64_t R, std::int64_t j) {
  return style == RopeStyle::half ? std::pair{j, j + R / 2} : std::pair{2 * j, 2 * j + 1};
}

// Checks `got` = rope(orig) against the long double reference: rotated pairs within a few ulps
// of the pair's norm, other dimensions bitwise unchanged.
::testing::AssertionResult rope_matches(const Tensor4& got, const Tensor4& orig,
                                        std::int64_t offset, const RopeOptions& o) {
  const std::int64_t R = o.rotary_dim == 0 ? got.D : o.rotary_dim;
  const RefFreqs ref = ref_freqs(o, R);
  double worst = 0;
  std::string where;
  for (std::int64_t b = 0; b < got.B; ++b) {
    for (std::int64_t h = 0; h < got.H; ++h) {
      for (std::int64_t l = 0; l < got.L; ++l) {
        for (std::int64_t j = 0; j < R / 2; ++j) {
          const auto [i1, i2] = pair_index(o.style, R, j);
          const ld x1 = orig.at(b, h, l, i1), x2 = orig.at(b, h, l, i2);
          const ld angle = static_cast<ld>(offset + l) * ref.inv_freq[static_cast<std::size_t>(j)];
          const ld c = ref.m * cosl(angle), s = ref.m * sinl(angle);
          const ld want[2] = {x1 * c - x2 * s, x1 * s + x2 * c};
          const double tol =
              4 * FLT_EPSILON * static_cast<double>(ref.m * sqrtl(x1 * x1 + x2 * x2)) + 1e-7;
          const std::int64_t idx[2] = {i1, i2};
          for (int k = 0; k < 2; ++k) {
            const double g = got.at(b, h, l, idx[k]);
            const double excess = std::abs(g - static_cast<double>(want[k])) - tol;
            if (excess > worst) {
              worst = excess;
              std::ostringstream os;
              os << "(b,h,l,d) = (" << b << "," << h << "," << l << "," << idx[k] << "), position "
                 << offset + l << ": got " << g << ", want " << static_cast<double>(want[k])
                 << ", tolerance " << tol;
              where = os.str();
            }
          }
        }
        for (std::int64_t dd = R; dd < got.D; ++dd) {
          if (got.at(b, h, l, dd) != orig.at(b, h, l, dd)) {
            return ::testing::AssertionFailure()
                   << "dimension " << dd << " >= R=" << R << " changed at (b,h,l) = (" << b << ","
                   << h << "," << l << ")";
          }
        }
      }
    }
  }
  if (worst > 0) return ::testing::AssertionFailure() << "worst element " << where;
  return ::testing::AssertionSuccess();
}

void fill_nonzero(Tensor4& t, std::uint32_t seed) { t.buf = nonzero_floats(t.buf.size(), seed); }

TEST(Rope, MatchesReference) {
  const RopeCase cases[] = {{2, 0},   {8, 0},    {64, 0},  {128, 0}, {8, 2},
                            {64, 32}, {128, 64}, {65, 64}, {66, 0}};
  std::uint32_t seed = 100;
  for (const RopeCase& rc : cases) {
    for (RopeStyle style : {RopeStyle::half, RopeStyle::interleaved}) {
      for (std::int64_t offset : {0, 100000}) {
        for (bool blhd : {false, true}) {
          SCOPED_TRACE("D=" + std::to_string(rc.D) +
                       " rotary_dim=" + std::to_string(rc.rotary_dim) +
                       (style == RopeStyle::half ? " half" : " interleaved") +
                       " offset=" + std::to_string(offset) + (blhd ? " blhd" : " bhld"));
          Tensor4 t(2, 3, 5, rc.D, blhd, /*misalign=*/1);
          fill_nonzero(t, ++seed);
          const Tensor4 orig = t;
          RopeOptions o;
          o.style = style;
          o.rotary_dim = rc.rotary_dim;
          apply_rope(t.out_view(), offset, o);
          EXPECT_TRUE(rope_matches(t, orig, offset, o));
        }
      }
    }
  }
}

TEST(Rope, LargePositionsAndOtherBase) {
  for (RopeStyle style : {RopeStyle::half, RopeStyle::interleaved}) {
    Tensor4 t(1, 2, 7, 64, true);
    fill_nonzero(t, 7);
    const Tensor4 orig = t;
    RopeOptions o;
    o.style = style;
    o.base = 500000.0;
    apply_rope(t.out_view(), 12345678, o);
    EXPECT_TRUE(rope_matches(t, orig, 12345678, o));
  }
}

TEST(Rope, LargeCallMatchesReference) {  // big enough to run in parallel
  for (RopeStyle style : {RopeStyle::half, RopeStyle::interleaved}) {
    Tensor4 t(2, 4, 512, 64, true);
    fill_nonzero(t, 8);
    const Tensor4 orig = t;
    RopeOptions o;
    o.style = style;
    apply_rope(t.out_view(), 100000, o);
    EXPECT_TRUE(rope_matches(t, orig, 100000, o));
  }
}

// The same view through both styles: half pairs (j, j + R/2) are interleaved pairs of a
// permuted head, so a permutation maps one result onto the other exactly.
TEST(Rope, StylesDifferOnlyByPairing) {
  const std::int64_t D = 16, L = 4;
  Tensor4 h(1, 1, L, D), il(1, 1, L, D);
  fill_nonzero(h, 11);
  for (std::int64_t l = 0; l < L; ++l) {
    for (std::int64_t j = 0; j < D / 2; ++j) {
      il.at(0, 0, l, 2 * j) = h.at(0, 0, l, j);
      il.at(0, 0, l, 2 * j + 1) = h.at(0, 0, l, j + D / 2);
    }
  }
  apply_rope(h.out_view(), 3000, {});
  apply_rope(il.out_view(), 3000, {.style = RopeStyle::interleaved});
  for (std::int64_t l = 0; l < L; ++l) {
    for (std::int64_t j = 0; j < D / 2; ++j) {
      ASSERT_EQ(il.at(0, 0, l, 2 * j), h.at(0, 0, l, j));
      ASSERT_EQ(il.at(0, 0, l, 2 * j + 1), h.at(0, 0, l, j + D / 2));
    }
  }
}

TEST(Rope, PreservesPairNorms) {
  for (RopeStyle style : {RopeStyle::half, RopeStyle::interleaved}) {
    Tensor4 t(2, 3, 9, 64, true);
    fill_nonzero(t, 12);
    const Tensor4 orig = t;
    RopeOptions o;
    o.style = style;
    apply_rope(t.out_view(), 100000, o);
    for (std::int64_t b = 0; b < 2; ++b) {
      for (std::int64_t h = 0; h < 3; ++h) {
        for (std::int64_t l = 0; l < 9; ++l) {
          for (std::int64_t j = 0; j < 32; ++j) {
            const auto [i1, i2] = pair_index(style, 64, j);
            const double before = std::hypot(double(orig.at(b, h, l, i1)), orig.at(b, h, l, i2));
            const double after = std::hypot(double(t.at(b, h, l, i1)), t.at(b, h, l, i2));
            ASSERT_NEAR(after, before, 4 * FLT_EPSILON * before)
                << "(b,h,l,j) = (" << b << "," << h << "," << l << "," << j << ")";
          }
        }
      }
    }
  }
}

// RoPE's point: after rotation, q . k depends only on the distance between the positions.
TEST(Rope, DotProductDependsOnlyOnRelativePosition) {
  const std::int64_t D = 128;
  const std::vector<float> q = nonzero_floats(D, 21), k = nonzero_floats(D, 22);
  double scale = 0;  // bound on the dot product's magnitude
  for (std::int64_t i = 0; i < D; ++i) scale += std::abs(q[i] * k[i]);
  const double tol = 1e-5 * scale;
  for (RopeStyle style : {RopeStyle::half, RopeStyle::interleaved}) {
    for (std::int64_t rotary : {0, 96}) {
      const RopeOptions o{.style = style, .rotary_dim = rotary};
      auto rotated_dot = [&](std::int64_t m, std::int64_t n) {
        std::vector<float> qr = q, kr = k;
        apply_rope(OutputView::contiguous(qr.data(), DType::f32, {1, 1, 1, D}), m, o);
        apply_rope(OutputView::contiguous(kr.data(), DType::f32, {1, 1, 1, D}), n, o);
        double dot = 0;
        for (std::int64_t i = 0; i < D; ++i) dot += double(qr[i]) * kr[i];
        return dot;
      };
      for (auto [m, n, t] : {std::array<std::int64_t, 3>{3, 7, 1000},
                             {0, 5, 100000},
                             {10, 2, 12345},
                             {100, 100, 99999}}) {
        SCOPED_TRACE("m=" + std::to_string(m) + " n=" + std::to_string(n) +
                     " t=" + std::to_string(t) + " rotary=" + std::to_string(rotary));
        const double base = rotated_dot(m, n);
        EXPECT_NEAR(rotated_dot(m + t, n + t), base, tol);
        // And the test can tell: a different distance gives a different product.
        EXPECT_GT(std::abs(rotated_dot(m, n + 1) - base), 100 * tol);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// RoPE scalings: the published configurations against the reference, then the rules' defining
// properties checked on the library alone.

RopeOptions llama31() {  // Llama 3.1 8B's config
  return {.base = 500000.0,
          .scaling = {.type = RopeScalingType::llama3,
                      .factor = 8,
                      .original_max_position = 8192,
                      .low_freq_factor = 1,
                      .high_freq_factor = 4}};
}

RopeOptions yarn_qwen() {  // Qwen2.5's long-context YaRN config
  return {.base = 1000000.0,
          .scaling = {.type = RopeScalingType::yarn, .factor = 4, .original_max_position = 32768}};
}

struct ScaledCase {
  const char* name;
  RopeOptions o;
  std::int64_t D;
};

std::vector<ScaledCase> scaled_cases() {
  RopeOptions yarn_partial{.base = 10000.0, .rotary_dim = 64};
  yarn_partial.scaling = {.type = RopeScalingType::yarn,
                          .factor = 16,
                          .original_max_position = 4096,
                          .beta_fast = 16,
                          .beta_slow = 2,
                          .attention_factor = 1.3};
  return {
      {"linear 2", {.scaling = {.type = RopeScalingType::linear, .factor = 2}}, 64},
      {"ntk 4", {.scaling = {.type = RopeScalingType::ntk, .factor = 4}}, 64},
      {"ntk 3 R=2", {.rotary_dim = 2, .scaling = {.type = RopeScalingType::ntk, .factor = 3}}, 6},
      {"llama3.1", llama31(), 128},
      {"llama3.1 factor 1", {.base = 500000.0, .scaling = {.type = RopeScalingType::llama3}}, 66},
      {"yarn qwen2.5", yarn_qwen(), 128},
      {"yarn partial", yarn_partial, 80},
      {"none with fields set",
       {.scaling = {.type = RopeScalingType::none, .factor = 8, .attention_factor = 3}},
       32}};
}

TEST(RopeScaling, MatchesReference) {
  std::uint32_t seed = 500;
  for (const ScaledCase& sc : scaled_cases()) {
    for (RopeStyle style : {RopeStyle::half, RopeStyle::interleaved}) {
      for (std::int64_t offset : {0, 5000, 131071}) {
        SCOPED_TRACE(std::string(sc.name) + (style == RopeStyle::half ? " half" : " interleaved") +
                     " offset=" + std::to_string(offset));
        Tensor4 t(2, 3, 5, sc.D, /*blhd=*/true, /*misalign=*/1);
        fill_nonzero(t, ++seed);
        const Tensor4 orig = t;
        RopeOptions o = sc.o;
        o.style = style;
        apply_rope(t.out_view(), offset, o);
        EXPECT_TRUE(rope_matches(t, orig, offset, o));
      }
    }
  }
}

// The public preset is the published configuration above: the same turns, bit for bit.
TEST(RopeScaling, Llama31PresetIsThePublishedConfig) {
  Tensor4 a(1, 2, 3, 128, /*blhd=*/true, /*misalign=*/0);
  fill_nonzero(a, 77);
  Tensor4 b = a;
  apply_rope(a.out_view(), 70000, llama31_rope());
  apply_rope(b.out_view(), 70000, llama31());
  EXPECT_EQ(a.buf, b.buf);
}

// The turn of every pair at `position` of a head whose pairs are all (1, 0): (m cos, m sin).
std::vector<std::pair<float, float>> unit_turns(const RopeOptions& o, std::int64_t D,
                                                std::int64_t position) {
  std::vector<float> x(static_cast<std::size_t>(D), 0.0f);
  for (std::int64_t j = 0; j < D / 2; ++j) x[static_cast<std::size_t>(j)] = 1.0f;  // half style
  apply_rope(OutputView::contiguous(x.data(), DType::f32, {1, 1, 1, D}), position, o);
  std::vector<std::pair<float, float>> turns;
  for (std::int64_t j = 0; j < D / 2; ++j) {
    turns.emplace_back(x[static_cast<std::size_t>(j)], x[static_cast<std::size_t>(j + D / 2)]);
  }
  return turns;
}

// Llama 3.1: pairs of short wavelength (< 8192 / 4) turn as without scaling, pairs of long
// wavelength (> 8192) as with linear scaling by 8, the pairs between by a frequency between.
TEST(RopeScaling, Llama3KeepsHighFrequenciesAndStretchesLowOnes) {
  const std::int64_t D = 128, p = 3;
  const RopeOptions scaled = llama31();
  RopeOptions plain{.base = scaled.base};
  RopeOptions linear = plain;
  linear.scaling = {.type = RopeScalingType::linear, .factor = 8};
  const auto got = unit_turns(scaled, D, p), none = unit_turns(plain, D, p),
             lin = unit_turns(linear, D, p);
  int kept = 0, stretched = 0, between = 0;
  for (std::int64_t j = 0; j < D / 2; ++j) {
    const double f = std::pow(500000.0, -2.0 * double(j) / double(D));
    const double wavelen = 2 * std::numbers::pi / f;
    const auto k = static_cast<std::size_t>(j);
    SCOPED_TRACE("pair " + std::to_string(j) + ", wavelength " + std::to_string(wavelen));
    if (wavelen < 8192.0 / 4) {
      EXPECT_EQ(got[k], none[k]);
      ++kept;
    } else if (wavelen > 8192.0) {
      EXPECT_EQ(got[k], lin[k]);
      ++stretched;
    } else {  // the angle p f' lies strictly between p f / 8 and p f (all below pi/2 here)
      const double angle = std::atan2(got[k].second, got[k].first);
      EXPECT_GT(angle, p * f / 8 * (1 + 1e-6));
      EXPECT_LT(angle, p * f * (1 - 1e-6));
      ++between;
    }
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(stretched, 0);
  EXPECT_GT(between, 0);
}

// YaRN: the fastest pairs turn as without scaling, the slowest as with linear scaling, and every
// pair's length is the attention factor 0.1 ln 4 + 1.
TEST(RopeScaling, YarnInterpolatesSlowPairsAndScalesByTheAttentionFactor) {
  const std::int64_t D = 128, p = 7;
  const RopeOptions scaled = yarn_qwen();
  RopeOptions plain{.base = scaled.base};
  RopeOptions linear = plain;
  linear.scaling = {.type = RopeScalingType::linear, .factor = 4};
  const auto got = unit_turns(scaled, D, p), none = unit_turns(plain, D, p),
             lin = unit_turns(linear, D, p);
  const double m = 0.1 * std::log(4.0) + 1;
  for (std::size_t k = 0; k < got.size(); ++k) {
    EXPECT_NEAR(std::hypot(got[k].first, got[k].second), m, 4 * FLT_EPSILON * m) << "pair " << k;
  }
  for (std::size_t k : {std::size_t{0}, std::size_t{1}}) {
    EXPECT_NEAR(got[k].first, m * none[k].first, 2 * FLT_EPSILON * m) << "pair " << k;
    EXPECT_NEAR(got[k].second, m * none[k].second, 2 * FLT_EPSILON * m) << "pair " << k;
  }
  for (std::size_t k = got.size() - 2; k < got.size(); ++k) {
    EXPECT_NEAR(got[k].first, m * lin[k].first, 2 * FLT_EPSILON * m) << "pair " << k;
    EXPECT_NEAR(got[k].second, m * lin[k].second, 2 * FLT_EPSILON * m) << "pair " << k;
  }
}

// Linear scaling by s is position p / s; NTK-aware keeps the fastest pair and divides the
// slowest one's frequency by s.
TEST(RopeScaling, LinearAndNtkAgreeWithTheirDefinitions) {
  const std::int64_t D = 64, s = 4, p = 1000;
  const RopeOptions plain{};
  const RopeOptions linear{.scaling = {.type = RopeScalingType::linear, .factor = double(s)}};
  const RopeOptions ntk{.scaling = {.type = RopeScalingType::ntk, .factor = double(s)}};
  const auto none_p = unit_turns(plain, D, p), lin_ps = unit_turns(linear, D, p * s);
  for (std::size_t k = 0; k < none_p.size(); ++k) {
    EXPECT_NEAR(lin_ps[k].first, none_p[k].first, 1e-5) << "pair " << k;
    EXPECT_NEAR(lin_ps[k].second, none_p[k].second, 1e-5) << "pair " << k;
  }
  const auto ntk_ps = unit_turns(ntk, D, p * s), none_ps = unit_turns(plain, D, p * s);
  EXPECT_EQ(ntk_ps.front(), none_ps.front());
  EXPECT_NEAR(ntk_ps.back().first, none_p.back().first, 1e-5);
  EXPECT_NEAR(ntk_ps.back().second, none_p.back().second, 1e-5);
  // And the test can tell: the pairs between differ from both.
  EXPECT_GT(std::abs(ntk_ps[16].second - none_ps[16].second), 1e-3);
  EXPECT_GT(std::abs(ntk_ps[16].second - lin_ps[16].second), 1e-3);
}

// ---------------------------------------------------------------------------------------------
// Determinism: the result does not depend on the threads or on how the call is split.

TEST(Determinism, SameBitsForAnyThreadCountAndSplit) {
  Context one(1), two(2);
  {
    Tensor4 a(2, 4, 1024, 64, true);
    fill_nonzero(a, 31);
    Tensor4 b = a, c = a, rows = a;
    const RopeOptions o{.style = RopeStyle::interleaved, .rotary_dim = 48};
    apply_rope(a.out_view(), 99000, o, &one);
    apply_rope(b.out_view(), 99000, o, &two);
    apply_rope(c.out_view(), 99000, o);
    // Position by position: every call is small and serial.
    for (std::int64_t l = 0; l < rows.L; ++l) {
      OutputView v = rows.out_view();
      v.data = &rows.at(0, 0, l, 0);
      v.shape[2] = 1;
      apply_rope(v, 99000 + l, o, &two);
    }
    EXPECT_EQ(a.buf, b.buf);
    EXPECT_EQ(a.buf, c.buf);
    EXPECT_EQ(a.buf, rows.buf);
  }
  {
    const std::int64_t B = 4, L = 2048, d = 65;
    const std::vector<float> orig = nonzero_floats(static_cast<std::size_t>(B * L * d), 32);
    std::vector<float> a = orig, b = orig, c = orig;
    add_sinusoidal(f32_view(a.data(), {B, L, d}), 5, 10000.0, &one);
    add_sinusoidal(f32_view(b.data(), {B, L, d}), 5, 10000.0, &two);
    for (std::int64_t l = 0; l < L; ++l) {
      OutputView v = f32_view(c.data() + l * d, {B, 1, d});
      v.strides = {L * d, d, 1};
      add_sinusoidal(v, 5 + l, 10000.0, &one);
    }
    EXPECT_EQ(a, b);
    EXPECT_EQ(a, c);
  }
  {
    std::vector<float> a(4096 * 64), b(a.size());
    sinusoidal_table(f32_view(a.data(), {4096, 64}), 0, 10000.0, &one);
    sinusoidal_table(f32_view(b.data(), {4096, 64}), 0, 10000.0, &two);
    EXPECT_EQ(a, b);
  }
}

// ---------------------------------------------------------------------------------------------
// Validation: every check throws an Error naming the argument and leaves the tensor untouched.

constexpr float kSentinel = 12345.0f;

// A valid call of each entry point on a sentinel-filled buffer; `mutate` breaks one argument.
struct Call {
  std::vector<float> buf = std::vector<float>(2 * 3 * 4 * 8, kSentinel);
  OutputView x;
  std::int64_t offset = 0;
  double base = 10000.0;
  RopeOptions opts;
};

enum class Entry { table, add2, add3, rope };

Call make_call(Entry e) {
  Call c;
  switch (e) {
    case Entry::table:
    case Entry::add2:
      c.x = f32_view(c.buf.data(), {6, 8});
      break;
    case Entry::add3:
      c.x = f32_view(c.buf.data(), {3, 4, 8});
      break;
    case Entry::rope:
      c.x = OutputView::blhd(c.buf.data(), DType::f32, 2, 4, 3, 8);
      break;
  }
  return c;
}

void invoke(Entry e, const Call& c) {
  switch (e) {
    case Entry::table:
      return sinusoidal_table(c.x, c.offset, c.base);
    case Entry::add2:
    case Entry::add3:
      return add_sinusoidal(c.x, c.offset, c.base);
    case Entry::rope:
      return apply_rope(c.x, c.offset, c.opts);
  }
}

const char* entry_name(Entry e) {
  switch (e) {
    case Entry::table:
      return "sinusoidal_table";
    case Entry::add2:
      return "add_sinusoidal rank 2";
    case Entry::add3:
      return "add_sinusoidal rank 3";
    case Entry::rope:
      return "apply_rope";
  }
  return "";
}

// The name of the tensor argument in messages.
std::string arg(Entry e) { return e == Entry::table ? "table" : "x"; }

void expect_error(std::initializer_list<Entry> entries,
                  const std::function<void(Entry, Call&)>& mutate,
                  const std::function<std::vector<std::string>(Entry)>& needles) {
  for (Entry e : entries) {
    SCOPED_TRACE(entry_name(e));
    Call c = make_call(e);
    mutate(e, c);
    try {
      invoke(e, c);
      ADD_FAILURE() << "no error; expected one mentioning " << needles(e)[0];
    } catch (const Error& err) {
      const std::string msg = err.what();
      EXPECT_EQ(msg.rfind("cpuattn: ", 0), 0u) << msg;
      for (const std::string& n : needles(e)) {
        EXPECT_NE(msg.find(n), std::string::npos) << "'" << n << "' not in: " << msg;
      }
    }
    for (float v : c.buf) ASSERT_EQ(v, kSentinel) << "the tensor was written";
  }
}

constexpr std::initializer_list<Entry> kAll = {Entry::table, Entry::add2, Entry::add3, Entry::rope};

TEST(Validate, ValidCallsPass) {
  for (Entry e : kAll) {
    Call c = make_call(e);
    EXPECT_NO_THROW(invoke(e, c)) << entry_name(e);
  }
}

TEST(Validate, NullData) {
  expect_error(
      kAll, [](Entry, Call& c) { c.x.data = nullptr; },
      [](Entry e) {
        return std::vector<std::string>{arg(e) + " [", "data is null"};
      });
}

TEST(Validate, DtypeNotF32) {
  expect_error(
      kAll, [](Entry, Call& c) { c.x.dtype = DType::f64; },
      [](Entry e) {
        return std::vector<std::string>{arg(e) + " [", "float64", "float32"};
      });
}

TEST(Validate, WrongRank) {
  expect_error(
      {Entry::table, Entry::add3},
      [](Entry, Call& c) {
        c.x = f32_view(c.buf.data(), {2, 3, 4, 8});
      },
      [](Entry e) {
        return std::vector<std::string>{arg(e) + " must have rank", "got rank 4"};
      });
  expect_error(
      {Entry::table, Entry::add2, Entry::rope},
      [](Entry, Call& c) { c.x = f32_view(c.buf.data(), {48}); },
      [](Entry e) {
        return std::vector<std::string>{arg(e) + " must have rank", "got rank 1"};
      });
  expect_error(
      {Entry::rope},
      [](Entry, Call& c) {
        c.x = f32_view(c.buf.data(), {6, 4, 8});
      },
      [](Entry) {
        return std::vector<std::string>{"x must have rank 4", "got rank 3"};
      });
}

TEST(Validate, SizeBelowOne) {
  expect_error(
      kAll, [](Entry, Call& c) { c.x.shape[0] = 0; },
      [](Entry e) {
        return std::vector<std::string>{arg(e) + " [0,", "has size 0"};
      });
  expect_error(
      kAll, [](Entry, Call& c) { c.x.shape[c.x.rank - 1] = -2; },
      [](Entry e) {
        return std::vector<std::string>{arg(e) + " [", ",-2]", "has size -2"};
      });
}

TEST(Validate, LastDimensionNotContiguous) {
  expect_error(
      kAll,
      [](Entry, Call& c) {
        c.x.shape[c.x.rank - 1] = 4;
        c.x.strides[c.x.rank - 1] = 2;
      },
      [](Entry e) {
        return std::vector<std::string>{arg(e) + " [", "contiguous", "stride 2"};
      });
}

TEST(Validate, NegativeStride) {
  expect_error(
      kAll,
      [](Entry, Call& c) {
        c.x.data = c.buf.data() + c.buf.size() - 8;
        c.x.strides[0] = -c.x.strides[0];
      },
      [](Entry e) {
        return std::vector<std::string>{arg(e) + " [", "is negative"};
      });
}

TEST(Validate, OverlappingElements) {
  expect_error(
      kAll, [](Entry, Call& c) { c.x.strides[0] = 0; },
      [](Entry e) {
        return std::vector<std::string>{arg(e) + " [", "overlap"};
      });
  expect_error(
      kAll, [](Entry, Call& c) { c.x.strides[c.x.rank - 2] = 4; },
      [](Entry e) {
        return std::vector<std::string>{arg(e) + " [", "overlap"};
      });
}

TEST(Validate, OffsetsOverflow) {
  expect_error(
      kAll, [](Entry, Call& c) { c.x.strides[0] = std::numeric_limits<std::int64_t>::max() - 10; },
      [](Entry e) {
        return std::vector<std::string>{arg(e) + " [", "overflow"};
      });
}

TEST(Validate, NegativePositionOffset) {
  expect_error(
      kAll, [](Entry, Call& c) { c.offset = -1; },
      [](Entry) {
        return std::vector<std::string>{"position_offset", ">= 0", "-1"};
      });
}

TEST(Validate, PositionsBeyond2To53) {
  const std::int64_t limit = std::int64_t{1} << 53;
  // L is 6 (table, add2) or 4 (add3, rope): the last position would be 2^53 - 2 + L - 1.
  expect_error(
      kAll, [&](Entry, Call& c) { c.offset = limit - 2; },
      [](Entry e) {
        return std::vector<std::string>{"position_offset 9007199254740990", "2^53", arg(e) + " ["};
      });
  expect_error(
      kAll, [](Entry, Call& c) { c.offset = std::numeric_limits<std::int64_t>::max(); },
      [](Entry) {
        return std::vector<std::string>{"position_offset", "2^53"};
      });
  // The last valid position is 2^53 - 1.
  for (Entry e : kAll) {
    Call c = make_call(e);
    c.offset = limit - c.x.shape[c.x.rank - 2];
    EXPECT_NO_THROW(invoke(e, c)) << entry_name(e);
  }
}

// Every entry rejects `bad` as its base (opts.base for RoPE) with a message saying `why`.
void expect_base_rejected(double bad, const std::string& why) {
  expect_error(
      kAll,
      [&](Entry, Call& c) {
        c.base = bad;
        c.opts.base = bad;
      },
      [&](Entry e) {
        return std::vector<std::string>{e == Entry::rope ? "opts.base" : "base", why};
      });
}

TEST(Validate, BaseNotFinite) {
  for (double bad :
       {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()})
    expect_base_rejected(bad, "finite");
}

TEST(Validate, BaseNotAboveOne) {
  for (double bad : {1.0, 0.5, 0.0, -10000.0}) expect_base_rejected(bad, "> 1");
}

TEST(Validate, RotaryDimOdd) {
  expect_error(
      {Entry::rope}, [](Entry, Call& c) { c.opts.rotary_dim = 3; },
      [](Entry) {
        return std::vector<std::string>{"opts.rotary_dim", "even", "3"};
      });
  // rotary_dim 0 means D, here odd.
  expect_error(
      {Entry::rope},
      [](Entry, Call& c) {
        c.x = f32_view(c.buf.data(), {2, 3, 1, 7});
      },
      [](Entry) {
        return std::vector<std::string>{"opts.rotary_dim", "even", "D = 7", "x [2,3,1,7]"};
      });
}

TEST(Validate, RotaryDimAboveD) {
  expect_error(
      {Entry::rope}, [](Entry, Call& c) { c.opts.rotary_dim = 10; },
      [](Entry) {
        return std::vector<std::string>{"opts.rotary_dim", "x [2,3,4,8]", "10"};
      });
}

TEST(Validate, RotaryDimNegative) {
  expect_error(
      {Entry::rope}, [](Entry, Call& c) { c.opts.rotary_dim = -2; },
      [](Entry) {
        return std::vector<std::string>{"opts.rotary_dim", "-2"};
      });
}

TEST(Validate, StyleInvalid) {
  expect_error(
      {Entry::rope}, [](Entry, Call& c) { c.opts.style = static_cast<RopeStyle>(7); },
      [](Entry) {
        return std::vector<std::string>{"opts.style", "7"};
      });
}

// Each field a scaling type uses, out of its range: an Error naming it, the tensor untouched.
TEST(Validate, RopeScalingFieldsOutOfRange) {
  struct Bad {
    RopeScalingType type;
    std::function<void(RopeScaling&)> mutate;
    std::vector<std::string> needles;
  };
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const Bad bad[] = {
      {RopeScalingType::none,
       [](RopeScaling& s) { s.type = static_cast<RopeScalingType>(9); },
       {"opts.scaling.type", "9", "llama3"}},
      {RopeScalingType::linear,
       [](RopeScaling& s) { s.factor = 0.5; },
       {"opts.scaling.factor", ">= 1", "0.5"}},
      {RopeScalingType::ntk,
       [&](RopeScaling& s) { s.factor = inf; },
       {"opts.scaling.factor", "inf"}},
      {RopeScalingType::yarn,
       [&](RopeScaling& s) { s.factor = nan; },
       {"opts.scaling.factor", "nan"}},
      {RopeScalingType::llama3,
       [](RopeScaling& s) { s.original_max_position = 0; },
       {"opts.scaling.original_max_position", ">= 1", "0"}},
      {RopeScalingType::yarn,
       [](RopeScaling& s) { s.original_max_position = -5; },
       {"opts.scaling.original_max_position", "-5"}},
      {RopeScalingType::llama3,
       [](RopeScaling& s) { s.low_freq_factor = 0; },
       {"opts.scaling.low_freq_factor", "> 0"}},
      {RopeScalingType::llama3,
       [](RopeScaling& s) { s.high_freq_factor = 1; },
       {"opts.scaling.high_freq_factor", "> low_freq_factor (1)", "got 1"}},
      {RopeScalingType::yarn,
       [](RopeScaling& s) { s.beta_slow = -1; },
       {"opts.scaling.beta_slow", "> 0", "-1"}},
      {RopeScalingType::yarn,
       [](RopeScaling& s) { s.beta_fast = 1; },
       {"opts.scaling.beta_fast", "> beta_slow (1)"}},
      {RopeScalingType::yarn,
       [](RopeScaling& s) { s.attention_factor = -0.5; },
       {"opts.scaling.attention_factor", ">= 0", "-0.5"}},
  };
  for (const Bad& b : bad) {
    expect_error(
        {Entry::rope},
        [&](Entry, Call& c) {
          c.opts.scaling.type = b.type;
          c.opts.scaling.factor = 2;
          b.mutate(c.opts.scaling);
        },
        [&](Entry) { return b.needles; });
  }
  // The fields a type does not use are not checked.
  Call c = make_call(Entry::rope);
  c.opts.scaling = {.type = RopeScalingType::linear,
                    .factor = 2,
                    .original_max_position = -1,
                    .low_freq_factor = -1,
                    .beta_fast = nan};
  EXPECT_NO_THROW(invoke(Entry::rope, c));
}

}  // namespace
}  // namespace cpuattn::test
