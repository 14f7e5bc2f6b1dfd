// The attention variants of AttentionOptions (sliding window, soft-capping, ALiBi, sinks): the
// reference against the formulas on worked examples, then the fused fast path against the
// reference on every backend of the machine (and the native bf16 kernel), over odd sizes, window
// sizes around the key block, masks, GQA, decode with split keys, and rows with no visible key.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "attention_cases.h"
#include "cpuattn/cpuattn.h"
#include "test_util.h"

namespace cpuattn::test {
namespace {

const double kInf = std::numeric_limits<double>::infinity();

// One query row against Lk keys with D = 1: scores are scale * q * k_j, so every step of the
// documented order can be written out by hand.
struct Tiny {
  std::vector<float> q, k, v, out, lse;
  AttentionOptions opts;
  Tiny(float qv, std::vector<float> keys, std::vector<float> values)
      : q{qv}, k(std::move(keys)), v(std::move(values)), out(1, 9.0f), lse(1, 9.0f) {
    opts.scale = 1.0;
  }
  void run(bool reference) {
    const auto Lk = static_cast<std::int64_t>(k.size());
    opts.lse = f32_view(lse.data(), {1, 1, 1});
    const TensorView qv = f32_view(q.data(), {1, 1, 1, 1});
    const TensorView kv = f32_view(k.data(), {1, 1, Lk, 1});
    const TensorView vv = f32_view(v.data(), {1, 1, Lk, 1});
    if (reference) {
      reference_attention(qv, kv, vv, f32_view(out.data(), {1, 1, 1, 1}), opts);
    } else {
      attention(qv, kv, vv, f32_view(out.data(), {1, 1, 1, 1}), opts);
    }
  }
};

// out and lse of scores s_j (already transformed and masked: -inf = masked), values v_j and a sink.
std::pair<double, double> softmax_of(const std::vector<double>& s, const std::vector<float>& v,
                                     double sink = -kInf) {
  double m = sink;
  for (double x : s) m = std::max(m, x);
  if (m == -kInf) return {0.0, -kInf};
  double l = std::exp(sink - m), acc = 0;
  for (std::size_t j = 0; j < s.size(); ++j) {
    l += std::exp(s[j] - m);
    acc += std::exp(s[j] - m) * v[j];
  }
  return {acc / l, m + std::log(l)};
}

void expect_tiny(Tiny& t, const std::vector<double>& s, double sink = -kInf) {
  const auto [out, lse] = softmax_of(s, t.v, sink);
  for (bool reference : {true, false}) {
    SCOPED_TRACE(reference ? "reference" : "fast path");
    t.run(reference);
    EXPECT_NEAR(t.out[0], out, 2e-6 * (1 + std::abs(out)));
    if (std::isinf(lse)) {
      EXPECT_EQ(t.lse[0], static_cast<float>(lse));
    } else {
      EXPECT_NEAR(t.lse[0], lse, 2e-6 * (1 + std::abs(lse)));
    }
  }
}

// The worked examples of docs/api.md ("Attention variants"): q = 1, keys 1..5 (scores = key),
// values 10, 20, ... 50.
TEST(VariantsWorked, SlidingWindow) {
  // Lq = 1, Lk = 5: the query sits at p = 4; window (2, 0) keeps keys 2, 3, 4.
  Tiny t(1.0f, {1, 2, 3, 4, 5}, {10, 20, 30, 40, 50});
  t.opts.window_left = 2;
  t.opts.window_right = 0;
  expect_tiny(t, {-kInf, -kInf, 3, 4, 5});
  t.opts.window_left = 0;  // only the query's own position
  expect_tiny(t, {-kInf, -kInf, -kInf, -kInf, 5});
}

TEST(VariantsWorked, SoftCap) {
  Tiny t(1.0f, {1, 2, 3, 4, 50}, {10, 20, 30, 40, 50});
  t.opts.softcap = 5.0;
  std::vector<double> s;
  for (double x : {1.0, 2.0, 3.0, 4.0, 50.0}) s.push_back(5.0 * std::tanh(x / 5.0));
  expect_tiny(t, s);
}

TEST(VariantsWorked, Alibi) {
  // One head: the standard slope of H = 1 is 2^-8; given slopes replace it.
  Tiny t(1.0f, {1, 2, 3, 4, 5}, {10, 20, 30, 40, 50});
  t.opts.alibi = true;
  std::vector<double> s;
  for (int j = 0; j < 5; ++j) s.push_back((j + 1) - std::exp2(-8.0) * (4 - j));
  expect_tiny(t, s);
  std::vector<float> slope{0.75f};
  t.opts.alibi_slopes = f32_view(slope.data(), {1});
  s.clear();
  for (int j = 0; j < 5; ++j) s.push_back((j + 1) - 0.75 * (4 - j));
  expect_tiny(t, s);
}

TEST(VariantsWorked, SinkJoinsTheDenominatorOnly) {
  Tiny t(1.0f, {1, 2, 3, 4, 5}, {10, 20, 30, 40, 50});
  std::vector<float> sink{4.5f};
  t.opts.sinks = f32_view(sink.data(), {1});
  expect_tiny(t, {1, 2, 3, 4, 5}, 4.5);
  // A sink far above every score takes nearly all the weight: out -> 0, lse -> the sink.
  sink[0] = 80.0f;
  expect_tiny(t, {1, 2, 3, 4, 5}, 80.0);
  // Every key masked (window left of the first key is impossible; use a mask): out 0, lse = sink.
  std::vector<std::uint8_t> none(5, 0);
  t.opts.mask = TensorView::contiguous(none.data(), DType::boolean, {5});
  sink[0] = 1.5f;
  expect_tiny(t, {-kInf, -kInf, -kInf, -kInf, -kInf}, 1.5);
}

TEST(VariantsWorked, OrderIsCapThenAlibiThenMask) {
  Tiny t(1.0f, {1, 2, 3, 4, 50}, {10, 20, 30, 40, 50});
  t.opts.softcap = 5.0;
  std::vector<float> slope{0.5f}, add{0.25f, -1.0f, 0.0f, 2.0f, 0.5f};
  t.opts.alibi_slopes = f32_view(slope.data(), {1});
  t.opts.mask = f32_view(add.data(), {5});
  t.opts.window_left = 3;
  std::vector<double> s;
  const double keys[] = {1, 2, 3, 4, 50};
  for (int j = 0; j < 5; ++j)
    s.push_back(j < 1 ? -kInf : 5.0 * std::tanh(keys[j] / 5.0) - 0.5 * (4 - j) + add[j]);
  expect_tiny(t, s);
}

TEST(VariantsWorked, DefaultAlibiSlopes) {
  // Press et al.'s slopes for 8 heads are 2^-1 ... 2^-8; for 12 heads the first 8 of those, then
  // 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5 (the odd ones of 16 heads). Checked through one-key rows:
  // with keys at distance 1 and 0 and equal scores, out = (v0 w + v1) / (w + 1), w = 2^-slope.
  for (std::int64_t H : {8, 12}) {
    const std::int64_t Lk = 2;
    std::vector<float> q(H, 0.0f), k(Lk, 0.0f), v{1.0f, 0.0f}, out(H);
    AttentionOptions o;
    o.alibi = true;
    reference_attention(f32_view(q.data(), {1, H, 1, 1}), f32_view(k.data(), {1, 1, Lk, 1}),
                        f32_view(v.data(), {1, 1, Lk, 1}), f32_view(out.data(), {1, H, 1, 1}), o);
    for (std::int64_t h = 0; h < H; ++h) {
      const double slope = h < 8 ? std::exp2(-(h + 1.0)) : std::exp2(-(0.5 + (h - 8)));
      const double w = std::exp(-slope);
      EXPECT_NEAR(out[h], w / (w + 1), 1e-6) << "H " << H << " head " << h;
    }
  }
}

// Bad input names the argument and leaves out untouched, for the fast path and the reference.
TEST(VariantsValidation, BadArgumentsAreErrors) {
  std::vector<float> q(2 * 3 * 4, 0.5f), k(3 * 4, 0.5f), out(2 * 3 * 4, 7.0f);
  const TensorView qv = f32_view(q.data(), {1, 2, 3, 4}), kv = f32_view(k.data(), {1, 1, 3, 4});
  const OutputView ov = f32_view(out.data(), {1, 2, 3, 4});
  std::vector<float> two{1, 2}, three{1, 2, 3}, nan_sink{1, std::nanf("")},
      inf_slope{1, std::numeric_limits<float>::infinity()};
  std::vector<double> wrong_dtype{1, 2};
  struct Bad {
    std::string needle;
    AttentionOptions o;
  };
  std::vector<Bad> bad;
  {
    Bad b{"window_left = -2", {}};
    b.o.window_left = -2;
    bad.push_back(b);
    b = Bad{"window_right = -5", {}};
    b.o.window_right = -5;
    bad.push_back(b);
    for (double c : {-1.0, std::nan(""), kInf, 1e31}) {
      b = Bad{"softcap", {}};
      b.o.softcap = c;
      bad.push_back(b);
    }
    b = Bad{"alibi_slopes has shape [3]", {}};
    b.o.alibi_slopes = f32_view(three.data(), {3});
    bad.push_back(b);
    b = Bad{"alibi_slopes[1]", {}};
    b.o.alibi_slopes = f32_view(inf_slope.data(), {2});
    bad.push_back(b);
    b = Bad{"sinks[1]", {}};
    b.o.sinks = f32_view(nan_sink.data(), {2});
    bad.push_back(b);
    b = Bad{"sinks [2] has dtype float64", {}};
    b.o.sinks = TensorView::contiguous(wrong_dtype.data(), DType::f64, {2});
    bad.push_back(b);
  }
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.needle);
    expect_error_mentioning([&] { attention(qv, kv, kv, ov, b.o); }, b.needle);
    expect_error_mentioning([&] { reference_attention(qv, kv, kv, ov, b.o); }, b.needle);
    for (float x : out) ASSERT_EQ(x, 7.0f);
  }
  // -inf is a valid sink (that head has none); -1 a valid window side.
  AttentionOptions ok;
  std::vector<float> sinks{-std::numeric_limits<float>::infinity(), 0.0f};
  ok.sinks = f32_view(sinks.data(), {2});
  ok.window_left = -1;
  ok.window_right = 0;
  attention(qv, kv, kv, ov, ok);
}

// Fast path against the reference. Backends: every (provider, target) of the machine, plus the
// native bf16 kernel where the CPU has it (for the bf16 cases).
std::vector<Backend> variant_backends() {
  std::vector<Backend> bs = machine_backends();
  if (machine_runs(Target::avx512_bf16))
    bs.insert(bs.begin(), Backend{Simd::xsimd, Target::avx512_bf16});
  return bs;
}

class VariantGrid : public ::testing::TestWithParam<Backend> {};

// Window sizes {0, 1, 7, block - 1, block, block + 1, > Lk} on both sides, with causal and
// without, and the key block skipping they allow.
TEST_P(VariantGrid, SlidingWindows) {
  const std::int64_t block = 128;
  const std::int64_t sizes[] = {0, 1, 7, block - 1, block, block + 1, 5000};
  int n = 0;
  for (std::int64_t w : sizes) {
    Case c;
    c.B = 2, c.H = 4, c.Hkv = 2, c.Lq = 61, c.Lk = 300, c.D = c.Dv = 24;
    c.window_left = w;
    c.window_right = n % 3 == 0 ? -1 : (n % 3 == 1 ? 0 : w / 2);
    c.mask = n % 2 == 0 ? MaskCase::causal_br : MaskCase::none;
    check_case(c, GetParam());
    // Long rows: most key blocks lie outside the window and are skipped.
    c.B = 1, c.H = 2, c.Hkv = 1, c.Lq = 260, c.Lk = 1100, c.D = c.Dv = 64, c.blhd = true;
    c.misalign = 1;
    c.window_right = n % 2 == 0 ? 0 : -1;
    c.mask = n % 2 == 0 ? MaskCase::none : MaskCase::key_lengths;
    check_case(c, GetParam());
    // Decode (one row, split keys) and a right-only window.
    c.Lq = 1, c.Lk = 3000, c.H = 8, c.Hkv = 2, c.blhd = false, c.misalign = 0;
    c.window_left = -1;
    c.window_right = w;
    c.mask = MaskCase::none;
    check_case(c, GetParam());
    c.window_left = w;
    c.window_right = -1;
    check_case(c, GetParam());
    ++n;
  }
}

TEST_P(VariantGrid, SoftcapAlibiSinksWithMasks) {
  const MaskCase masks[] = {MaskCase::none,         MaskCase::causal_tl, MaskCase::bool_full,
                            MaskCase::additive_inf, MaskCase::combo,     MaskCase::key_lengths};
  int n = 0;
  for (double cap : {0.0, 0.5, 8.0}) {
    for (int alibi : {0, 1, 2}) {
      for (bool sinks : {false, true}) {
        Case c;
        c.B = 2, c.H = 6, c.Hkv = 2, c.Lq = 37, c.Lk = 201, c.D = 33, c.Dv = 20;
        c.softcap = cap;
        c.alibi = alibi;
        c.sinks = sinks;
        c.scale = 0.5;  // scores up to ~5: soft-capping at 0.5 bends them hard
        c.mask = masks[n++ % std::size(masks)];
        c.window_left = n % 4 == 0 ? 40 : -1;
        check_case(c, GetParam());
        c.Lq = 1, c.Lk = 1500, c.H = 8, c.D = c.Dv = 64;  // decode with split keys
        c.mask = n % 2 ? MaskCase::none : MaskCase::key_lengths;
        check_case(c, GetParam());
      }
    }
  }
}

// bf16 Q/K/V (the native kernel where the CPU has it) and an int8 cache.
TEST_P(VariantGrid, ReducedPrecision) {
  for (DType kv : {DType::bf16, DType::i8}) {
    Case c;
    c.q_dtype = kv == DType::bf16 ? DType::bf16 : DType::f32;
    c.kv_dtype = kv;
    c.B = 1, c.H = 4, c.Hkv = 2, c.Lq = 70, c.Lk = 400, c.D = c.Dv = 64;
    c.softcap = 4.0;
    c.alibi = 1;
    c.sinks = true;
    c.window_left = 129;
    c.mask = MaskCase::causal_br;
    check_case(c, GetParam());
    c.Lq = 1;
    check_case(c, GetParam());
  }
}

// Sinks where whole rows see no key (additive -inf rows, a zero key length, a window that
// misses every key): out 0, lse = the sink.
TEST_P(VariantGrid, SinksOnEmptyRows) {
  Case c;
  c.B = 3, c.H = 4, c.Hkv = 4, c.Lq = 20, c.Lk = 150, c.D = c.Dv = 16;
  c.sinks = true;
  c.mask = MaskCase::additive_inf;  // every fifth row fully masked
  check_case(c, GetParam());
  c.mask = MaskCase::key_lengths;  // batch 1 has length 75; lengths include 0 for some B
  c.window_left = 0, c.window_right = 0;
  check_case(c, GetParam());
  // Lq > Lk: the first rows' window lies before key 0.
  c.Lq = 160, c.Lk = 40;
  c.mask = MaskCase::none;
  c.window_left = 5, c.window_right = 2;
  check_case(c, GetParam());
}

INSTANTIATE_TEST_SUITE_P(Backends, VariantGrid, ::testing::ValuesIn(variant_backends()),
                         [](const auto& info) { return info.param.name(); });

// Results do not depend on the thread count with variants either.
TEST(Variants, ThreadCountInvariant) {
  Case c;
  c.B = 2, c.H = 4, c.Hkv = 2, c.Lq = 90, c.Lk = 700, c.D = c.Dv = 32;
  c.softcap = 3.0, c.alibi = 2, c.sinks = true, c.window_left = 200, c.mask = MaskCase::causal_br;
  Inputs in(c);
  std::vector<float> a(c.B * c.H * c.Lq * c.Dv), b(a.size());
  for (int threads : {1, 2}) {
    Context ctx(threads);
    attention(in.q.view(), in.k.view(), in.v.view(),
              f32_view(threads == 1 ? a.data() : b.data(), {c.B, c.H, c.Lq, c.Dv}), in.opts, &ctx);
  }
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0);
}

}  // namespace
}  // namespace cpuattn::test
