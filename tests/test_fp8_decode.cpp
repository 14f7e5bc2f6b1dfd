// fp8_e4m3 K and V in the decode units, which read them at 2^-120 of their value with Q or P
// carrying the 2^120 (lib/kernels/flash/fp8_lo-inl.h), against the double-precision reference on
// every backend: every finite byte (subnormals, zeros, +-448), and each case that must leave that
// reading or correct it: a NaN code in a key, in a value, in a masked key, a query that 2^120
// would overflow, and a V scale that would.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "test_util.h"

namespace cpuattn::test {
namespace {

constexpr std::int64_t kB = 2, kH = 8, kHkv = 2, kLk = 333;

// Random finite fp8 bytes: every code but the NaN codes 0x7f and 0xff.
std::vector<std::uint8_t> finite_bytes(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> dist(0, 253);
  std::vector<std::uint8_t> x(n);
  for (auto& b : x) {
    const int c = dist(rng);  // 0..253 onto the 254 finite codes
    b = static_cast<std::uint8_t>(c < 0x7f ? c : c + 1);
  }
  return x;
}

struct Fp8Case {
  std::int64_t Lq = 1, D = 64;
  std::vector<std::uint8_t> k, v;
  std::vector<float> q, ks, vs;
  Causal causal = Causal::none;
  std::int64_t window = -1;

  explicit Fp8Case(std::int64_t D_, std::uint32_t seed) : D(D_) {
    k = finite_bytes(kB * kHkv * kLk * D, seed);
    v = finite_bytes(kB * kHkv * kLk * D, seed + 1);
    q = random_floats(kB * kH * Lq * D, seed + 2);
    ks = random_floats(kB * kHkv * kLk, seed + 3, 1e-3f, 4e-3f);
    vs = random_floats(kB * kHkv * kLk, seed + 4, 1e-3f, 4e-3f);
  }
  std::size_t at(std::int64_t b, std::int64_t hk, std::int64_t j, std::int64_t d) const {
    return static_cast<std::size_t>(((b * kHkv + hk) * kLk + j) * D + d);
  }

  // The fast path on `backend` against the reference; NaN where the reference has NaN.
  void check(const Backend& backend) const {
    Context ctx(2);
    backend.apply(ctx);
    const TensorView kv = TensorView::contiguous(k.data(), DType::fp8_e4m3, {kB, kHkv, kLk, D});
    const TensorView vv = TensorView::contiguous(v.data(), DType::fp8_e4m3, {kB, kHkv, kLk, D});
    AttentionOptions o;
    o.causal = causal;
    if (window >= 0) o.window_left = window;
    o.k_scales = f32_view(ks.data(), {kB, kHkv, kLk});
    o.v_scales = f32_view(vs.data(), {kB, kHkv, kLk});
    std::vector<float> got(kB * kH * Lq * D), want(got.size());
    const TensorView qv = f32_view(q.data(), {kB, kH, Lq, D});
    attention(qv, kv, vv, f32_view(got.data(), {kB, kH, Lq, D}), o, &ctx);
    reference_attention(qv, kv, vv, f32_view(want.data(), {kB, kH, Lq, D}), o);
    double vmax = 0;
    for (std::size_t i = 0; i < v.size(); ++i) {
      const float x = vs[i / D] * 448.0f;
      vmax = std::max(vmax, double(x));
    }
    const double eps = std::numeric_limits<float>::epsilon();
    const double atol = 8 * eps * (std::sqrt(double(kLk)) + std::sqrt(double(D)) * 8) * vmax;
    EXPECT_TRUE(all_close(got.data(), want.data(), got.size(), atol)) << backend.name();
  }
};

class Fp8Decode : public ::testing::TestWithParam<Backend> {};

TEST_P(Fp8Decode, EveryFiniteByteAgainstTheReference) {
  for (std::int64_t D : {64, 40, 128}) {
    SCOPED_TRACE("D " + std::to_string(D));
    Fp8Case c(D, 31);
    c.check(GetParam());
    c.Lq = 3;  // several rows per K/V head
    c.q = random_floats(kB * kH * c.Lq * D, 37);
    c.causal = Causal::bottom_right;
    c.check(GetParam());
  }
}

TEST_P(Fp8Decode, NanCodesInKeysAndValuesMakeTheReferencesNaN) {
  for (std::int64_t D : {64, 40}) {  // 40: the last byte lies past the whole 32-byte steps
    for (std::uint8_t nan : {std::uint8_t{0x7f}, std::uint8_t{0xff}}) {
      SCOPED_TRACE("D " + std::to_string(D) + ", code " + std::to_string(nan));
      Fp8Case c(D, 41);
      c.k[c.at(0, 1, 200, D - 1)] = nan;  // the last byte of a key in the second block
      c.v[c.at(1, 0, 7, 0)] = nan;        // the first byte of a value in the first block
      c.check(GetParam());
      Fp8Case d(D, 42);
      d.v[d.at(0, 1, 300, D - 1)] = nan;  // the last byte of a value in the third block
      d.check(GetParam());
    }
  }
}

TEST_P(Fp8Decode, NanCodesInMaskedKeysChangeNothing) {
  Fp8Case c(64, 43);
  c.causal = Causal::bottom_right;
  c.window = 100;  // decoding at position kLk - 1 sees keys [kLk - 101, kLk): 232 on
  c.k[c.at(0, 0, 231, 5)] = 0x7f;  // in a key block the window enters
  c.v[c.at(1, 1, 230, 9)] = 0xff;
  c.check(GetParam());
}

TEST_P(Fp8Decode, OperandsThatTwoToThe120WouldOverflowKeepTheExactReading) {
  Fp8Case c(64, 47);
  for (float& x : c.q) x *= 2048.0f;  // |Qp| beyond 2^7 after the scale,
  for (float& s : c.ks) s *= 1e-3f;   // with scores of the usual size
  c.check(GetParam());
  Fp8Case d(64, 53);
  for (std::size_t j = 0; j < d.vs.size(); j += 50) d.vs[j] = 1000.0f;  // scale beyond 2^7
  d.check(GetParam());
}

INSTANTIATE_TEST_SUITE_P(Backends, Fp8Decode, ::testing::ValuesIn(machine_backends()),
                         [](const auto& info) { return info.param.name(); });

}  // namespace
}  // namespace cpuattn::test
