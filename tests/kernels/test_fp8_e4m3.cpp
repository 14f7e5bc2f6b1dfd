// The fp8_e4m3 element type (lib/kv/fp8_e4m3.h) against an independent statement of OCP FP8 E4M3
// (float8_e4m3fn): every byte decodes to (-1)^s 2^(e-7) (1 + m/8), or m/8 2^-6 for e = 0, with
// 0x7f / 0xff NaN; encoding rounds to nearest even, saturates at +-448 (infinities too) and keeps
// NaN; every finite byte survives a round trip; and a cache row quantized with a scale is within
// the stated bound of the value written.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kv/elem.h"

namespace cpuattn::test {
namespace {

double ocp_value(std::uint8_t b) {
  const int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
  if (e == 15 && m == 7) return std::numeric_limits<double>::quiet_NaN();
  const double mag =
      e == 0 ? m / 8.0 * std::ldexp(1.0, -6) : (1 + m / 8.0) * std::ldexp(1.0, e - 7);
  return s != 0 ? -mag : mag;
}

TEST(Fp8E4M3, EveryByteDecodesToItsValue) {
  for (int b = 0; b < 256; ++b) {
    const double want = ocp_value(static_cast<std::uint8_t>(b));
    const float got = detail::fp8_e4m3_to_f32(static_cast<std::uint8_t>(b));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << "byte " << b;
    } else {
      EXPECT_EQ(double(got), want) << "byte " << b;
      EXPECT_EQ(std::signbit(got), (b & 0x80) != 0) << "byte " << b;
    }
  }
  EXPECT_EQ(detail::fp8_e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(detail::fp8_e4m3_to_f32(0x01), std::ldexp(1.0f, -9));
}

TEST(Fp8E4M3, EncodingRoundsToNearestEvenAndSaturates) {
  // Round trips, and the midpoint between each pair of neighbours goes to the even mantissa.
  for (int b = 0; b < 0x7e; ++b) {
    for (int sign : {0, 0x80}) {
      const auto lo = static_cast<std::uint8_t>(b | sign),
                 hi = static_cast<std::uint8_t>((b + 1) | sign);
      const double a = ocp_value(lo), c = ocp_value(hi);
      EXPECT_EQ(detail::f32_to_fp8_e4m3(static_cast<float>(a)), lo) << "byte " << int(lo);
      const double mid = (a + c) / 2;  // exact in f32: one more bit than fp8 has
      const std::uint8_t even = (b & 1) == 0 ? lo : hi;
      EXPECT_EQ(detail::f32_to_fp8_e4m3(static_cast<float>(mid)), even)
          << "between " << a << " and " << c;
      // Just off the midpoint: the nearer neighbour.
      EXPECT_EQ(
          detail::f32_to_fp8_e4m3(std::nextafter(static_cast<float>(mid), static_cast<float>(a))),
          lo);
      EXPECT_EQ(
          detail::f32_to_fp8_e4m3(std::nextafter(static_cast<float>(mid), static_cast<float>(c))),
          hi);
    }
  }
  const float inf = std::numeric_limits<float>::infinity();
  for (float x : {448.0f, 449.0f, 463.9f, 464.0f, 480.0f, 1e30f, inf}) {
    EXPECT_EQ(detail::f32_to_fp8_e4m3(x), 0x7e) << x;
    EXPECT_EQ(detail::f32_to_fp8_e4m3(-x), 0xfe) << -x;
  }
  EXPECT_EQ(detail::f32_to_fp8_e4m3(std::nanf("")) & 0x7f, 0x7f);
  EXPECT_EQ(detail::f32_to_fp8_e4m3(-0.0f), 0x80);
  EXPECT_EQ(detail::f32_to_fp8_e4m3(std::ldexp(1.0f, -11)), 0x00);  // below half the smallest step
  EXPECT_EQ(detail::f32_to_fp8_e4m3(std::ldexp(3.0f, -11)), 0x01);
}

// The bound lib/kv/fp8_e4m3.h states for a value x stored with scale s: within 2^-4 |x| where
// |x| >= 2^-6 s, within 2^-10 s below; per-token rows (s = max|x| / 448) never saturate.
TEST(Fp8E4M3, QuantizedRowsAreWithinTheStatedBound) {
  std::vector<float> x(4096);
  for (std::size_t i = 0; i < x.size(); ++i)
    x[i] = static_cast<float>(std::sin(0.37 * double(i)) * std::exp(-0.004 * double(i)));
  for (float given : {0.0f, 0.003f, 0.01f}) {
    std::vector<detail::Fp8E4M3> q(x.size());
    float s = given;
    if (given == 0.0f) {
      s = detail::quantize_row(x.data(), static_cast<std::int64_t>(x.size()), q.data());
    } else {
      detail::quantize_row(x.data(), static_cast<std::int64_t>(x.size()), given, q.data());
    }
    for (std::size_t i = 0; i < x.size(); ++i) {
      const double stored = double(detail::fp8_e4m3_to_f32(q[i].bits)) * s;
      const double ax = std::abs(double(x[i]));
      if (ax > 448.0 * s) {
        EXPECT_EQ(std::abs(stored), 448.0 * s) << i;
        continue;
      }
      const double bound =
          ax >= std::ldexp(double(s), -6) ? std::ldexp(ax, -4) : std::ldexp(double(s), -10);
      EXPECT_LE(std::abs(stored - x[i]), bound * (1 + 1e-6)) << "element " << i << " scale " << s;
    }
  }
}

}  // namespace
}  // namespace cpuattn::test
